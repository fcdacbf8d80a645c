"""How far a lossy mode's answers are from greedy's: the target's own log-likelihood of each answer.

MJSD (paper 004) trades exactness for joint likelihood; the benchmark reports, per mode, the fraction
of answers that differ from greedy's and the mean per-token log-likelihood under the target (higher is
better; perplexity = exp(-mean)), measured outside the timed calls.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def answer_logprob(model: torch.nn.Module, prompt: Sequence[int], answer: Sequence[int]) -> float:
    """Sum over ``answer``'s tokens of log P_target(token | prompt, answer so far) (0.0 for no answer)."""
    if not answer:
        return 0.0
    ids = torch.tensor([[*prompt, *answer]])  # [1, prompt + answer]
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1]  # [answer, vocab]: the row before each token
    lp = logits.float().log_softmax(-1)  # [answer, vocab]
    return float(lp[torch.arange(len(answer)), torch.tensor(list(answer))].sum())
