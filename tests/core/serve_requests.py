"""ServeRequests for the engine tests: one streaming to a test ``Client``, and the adversarial drafters' trio."""

from __future__ import annotations

from collections.abc import Sequence

from lookahead_core.config import DecodingConfig
from lookahead_core.drafting.draft import Drafter
from lookahead_core.engine.request import ServeRequest

from tests.core.helpers import Client, forking_drafter, oracle_drafter, wrong_drafter


def serve_request(prompt: Sequence[int], client: Client, tenant: str = "t", **cfg: object) -> ServeRequest:
    """A request streaming to ``client``: ``cfg`` holds DecodingConfig fields (over 24 new tokens, decoding_length
    6) and ServeRequest's ``drafter``, ``deadline`` and ``observer``."""
    extras = {name: cfg.pop(name, None) for name in ("drafter", "deadline", "observer")}
    config = DecodingConfig(**{"max_new_tokens": 24, "decoding_length": 6, **cfg})  # type: ignore[arg-type]
    return ServeRequest(prompt, config, tenant=tenant, on_tokens=client.on_tokens, on_done=client.on_done,
                        **extras)  # type: ignore[arg-type]


def adversarial_drafters(prompts: Sequence[Sequence[int]], truths: Sequence[Sequence[int]]) -> list[Drafter]:
    """Drafters for three prompts with greedy outputs ``truths``: only wrong tokens, forks (an accepted path that
    is not contiguous in the tree), the oracle."""
    return [wrong_drafter(len(prompts[0]), truths[0]), forking_drafter(len(prompts[1]), truths[1]),
            oracle_drafter(len(prompts[2]), truths[2])]
