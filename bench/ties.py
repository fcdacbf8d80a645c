"""Where an answer differs from the serial baseline's, and by how much the baseline's own token won there.

A batched forward sums in another order than a batch-1 one (GEMM blocking by row count, prefill in
chunks, a prefix loaded from the cache): the logits differ by ~1e-6 relative, which changes the greedy
token only where the two best logits are that close. Such a flip is a floating-point tie, not a
drafting or verification error; a wide gap is a real difference. For every greedy answer that differs,
``divergences`` reruns the baseline model on the prompt plus the reference up to the first difference
and reports the gap between the reference's token and ours there.

    found = divergences(model, [(7, prompt, ours, reference)])   # [Divergence(7, 3, 1.9e-05)]
    found[0].tie                                                   # True: gap < TIE_LOGIT_GAP
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

TIE_LOGIT_GAP = 1e-4  # a gap (logits) below this is within fp32 rounding of a batched forward: a tie


@dataclass(frozen=True)
class Divergence:
    """One answer that differs from the baseline's."""

    index: int  # the request
    position: int  # first output token that differs (or where one answer ended first)
    gap: float | None  # baseline logit of its token minus ours there (None: one answer ended first)

    @property
    def tie(self) -> bool:
        """Whether the flip is within floating-point rounding (a near-tie in the baseline's own logits)."""
        return self.gap is not None and self.gap < TIE_LOGIT_GAP

    def describe(self) -> str:
        what = "ended first" if self.gap is None else f"baseline gap {self.gap:.1e}" + (" (a tie)" if self.tie else "")
        return f"#{self.index} at token {self.position}: {what}"


def first_difference(ours: Sequence[int], reference: Sequence[int]) -> int:
    """Index of the first differing token (the shorter length when one is a prefix of the other)."""
    for i, (a, b) in enumerate(zip(ours, reference, strict=False)):
        if a != b:
            return i
    return min(len(ours), len(reference))


def divergences(model: Any, answers: Sequence[tuple[int, Sequence[int], Sequence[int], Sequence[int]]]
                ) -> list[Divergence]:
    """(index, prompt, our output, reference output) of differing greedy answers -> where and by how much."""
    out = []
    for index, prompt, ours, reference in answers:
        i = first_difference(ours, reference)
        if i >= len(ours) or i >= len(reference):
            out.append(Divergence(index, i, None))
            continue
        ids = torch.tensor([[*prompt, *reference[:i]]])  # [1, prompt + i]
        with torch.inference_mode():
            logits = model(input_ids=ids).logits[0, -1].float()  # [vocab]
        out.append(Divergence(index, i, float(logits[reference[i]] - logits[ours[i]])))
    return out
