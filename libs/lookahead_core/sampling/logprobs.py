"""Log-probabilities of the emitted tokens, for requests that ask (``DecodingConfig.logprobs``).

A token's logprob is read from the model's raw next-token distribution at its position: the
log_softmax of the verification forward's logits there, before temperature / top-p / top-k
processing (what vLLM reports by default and what plain decoding's logits give). Only requests that
asked pay for it: a request without ``logprobs`` never reaches this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TokenLogprob:
    """One emitted token's log-probability and the most likely alternatives at its position."""

    token_id: int  # the emitted token
    logprob: float  # its log-probability under the raw next-token distribution
    top: tuple[tuple[int, float], ...] = ()  # the top-N (token id, logprob), most likely first (N: top_logprobs)


def token_logprobs(logits: torch.Tensor, tokens: Sequence[int], top: int) -> list[TokenLogprob]:
    """``tokens[i]``'s logprob under row i of ``logits`` [n, vocab] (n >= len(tokens); extra rows are
    ignored) and each row's ``top`` most likely (id, logprob) pairs."""
    n = len(tokens)
    if n == 0:
        return []
    logp = torch.log_softmax(logits[:n].float(), dim=-1)  # [n, vocab], float32 whatever the model's dtype
    ids = torch.tensor(list(tokens), dtype=torch.long, device=logits.device)  # [n]
    chosen = logp.gather(1, ids[:, None])[:, 0].tolist()  # [n]
    if top > 0:
        values, indices = logp.topk(min(top, logp.shape[-1]), dim=-1)  # [n, top] each, descending
        tops = [tuple(zip(i, v, strict=True)) for i, v in zip(indices.tolist(), values.tolist(), strict=True)]
    else:
        tops = [() for _ in range(n)]
    return [TokenLogprob(t, lp, tp) for t, lp, tp in zip(tokens, chosen, tops, strict=True)]
