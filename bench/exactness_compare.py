"""Does an engine answer equal the baseline's token for token, and how near a tie was the baseline on its way?

The baseline (transformers' greedy ``generate``, batch 1) records, at every output position, the gap
between its two best scores: its top-1/top-2 *margin*. A batched forward sums in another order than a
batch-1 one, which moves the logits by ~1e-6 relative; that can only change a greedy token where the
margin is that small. So for every answer the smallest margin along the baseline's path says how
close to a flip it came, and every mismatch is reported with its first differing position and the
margin there (bench/ties.py: a margin under ``TIE_LOGIT_GAP`` is a floating-point tie, a wide one a
real error).

    first_mismatch(3, ours=[1, 2, 7], reference=[1, 2, 9], margins=[5.0, 2.0, 1e-5])
    # Mismatch(index=3, position=2, margin=1e-05, ours=7, reference=9)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import median
from typing import Any

from lookahead_rag.bench.ties import TIE_LOGIT_GAP, first_difference

MARGIN_THRESHOLDS = (TIE_LOGIT_GAP, 1e-3, 1e-2, 1e-1)  # answers whose smallest margin is below each (JSON "below")


@dataclass(frozen=True)
class Mismatch:
    """One engine answer that differs from the baseline's."""

    index: int  # the prompt
    position: int  # first output token that differs (or where the shorter answer ended)
    margin: float | None  # baseline's top-1 minus top-2 score there (None: past the baseline's answer)
    ours: int | None  # our token there (None: our answer had ended)
    reference: int | None  # the baseline's token there (None: its answer had ended)

    @property
    def tie(self) -> bool:
        """Whether the baseline's own two best scores were within fp32 rounding of a batched forward there."""
        return self.margin is not None and self.margin < TIE_LOGIT_GAP

    def record(self) -> dict[str, Any]:
        """The JSON's form."""
        return {"index": self.index, "position": self.position, "margin": self.margin, "tie": self.tie,
                "ours": self.ours, "reference": self.reference}


def first_mismatch(index: int, ours: Sequence[int], reference: Sequence[int],
                   margins: Sequence[float]) -> Mismatch | None:
    """None when ``ours`` equals ``reference``; else where they first differ and the baseline's margin there
    (``margins[t]``: the baseline's top-1 minus top-2 score when it chose ``reference[t]``)."""
    if list(ours) == list(reference):
        return None
    i = first_difference(ours, reference)
    return Mismatch(index, i, margins[i] if i < len(margins) else None,
                    ours[i] if i < len(ours) else None, reference[i] if i < len(reference) else None)


def min_margin(margins: Sequence[float]) -> tuple[float | None, int | None]:
    """The smallest margin along a path and its position (None, None for an empty answer)."""
    if not margins:
        return None, None
    at = min(range(len(margins)), key=margins.__getitem__)
    return margins[at], at


def margin_summary(smallest: Sequence[float | None],
                   thresholds: Sequence[float] = MARGIN_THRESHOLDS) -> dict[str, Any]:
    """Over answers' smallest margins: the least, the median, and how many answers fall below each threshold."""
    known = [m for m in smallest if m is not None]
    return {
        "answers": len(known),
        "min": min(known) if known else None,
        "median": median(known) if known else None,
        "below": {f"{t:.0e}": sum(m < t for m in known) for t in thresholds},
    }


@dataclass
class PassTally:
    """One engine pass over every prompt, compared with the baseline."""

    exact: int = 0  # answers equal to the baseline's
    mismatches: list[Mismatch] = field(default_factory=list)  # the others, in prompt order

    def add(self, found: Mismatch | None) -> None:
        if found is None:
            self.exact += 1
        else:
            self.mismatches.append(found)


def compare_pass(outputs: Sequence[Sequence[int]], references: Sequence[Sequence[int]],
                 margins: Sequence[Sequence[float]]) -> PassTally:
    """Every answer of a pass against the baseline's: how many are equal, and each one that is not."""
    tally = PassTally()
    for i, (ours, ref, path) in enumerate(zip(outputs, references, margins, strict=True)):
        tally.add(first_mismatch(i, ours, ref, path))
    return tally
