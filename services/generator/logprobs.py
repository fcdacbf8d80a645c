"""The engine's token logprobs (``lookahead_core``'s, recorded on the request) as the stream's domain values.

A request asks with ``GenerationParams.logprobs`` (and ``top_logprobs``); the core records one
``TokenLogprob`` per emitted token on its ``ServeRequest`` before it announces the tokens, so the
step's callback reads the last ones here. A safe stream re-cuts the deltas at a fixed size and
cadence: logprobs would tell what it hides, so they are refused with it.
"""

from __future__ import annotations

from lookahead_core.serving import ServeRequest

from lookahead_rag.services.common.errors import InvalidArgument
from lookahead_rag.services.generator.domain import GenerationParams, TokenLogprob


def step_logprobs(req: ServeRequest, n: int) -> tuple[TokenLogprob, ...]:
    """The logprobs of the ``n`` tokens ``req`` just emitted (empty when it did not ask). Called on the
    engine's thread from ``on_tokens``, when they are the last ``n`` recorded."""
    if not n or not req.config.logprobs:
        return ()
    return tuple(TokenLogprob(p.token_id, p.logprob, p.top) for p in req.logprobs[-n:])


def check_logprobs(params: GenerationParams, safe: bool) -> None:
    """Refuse logprobs on a safe stream (asked for, or the tenant's): its fixed-size deltas could not carry them."""
    if safe and (params.logprobs or params.top_logprobs):
        raise InvalidArgument("logprobs are not available on a safe stream (safe_stream, or the tenant's setting)")
