"""Do the engine's per-token logprobs equal plain decoding's? The comparison, on lists of TokenLogprob.

Positions are compared while the two answers agree: up to the first token where the engine's answer
differs from the baseline's (after it the two condition on different text, so their distributions
are not comparable). At each such position:

- the chosen token's logprob, engine minus baseline (the largest |difference| is reported);
- the top-N ids: the same set (order aside: equal values may come in either order), a *tie* (the sets
  differ only by ids whose logprobs lie within ``TIE_LOGIT_GAP`` of the baseline's N-th value: a swap
  at the boundary that rounding can cause) or different;
- the top-N values of the ids both sets hold (the largest |difference| is reported).

    top_agreement(((5, -0.1), (7, -2.0)), ((7, -2.0), (5, -0.1)))  # SAME: the same ids
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lookahead_rag.bench.ties import TIE_LOGIT_GAP, first_difference

if TYPE_CHECKING:  # a type only: the comparison itself needs no torch
    from lookahead_core.sampling.logprobs import TokenLogprob

Top = Sequence[tuple[int, float]]  # a position's top-N (token id, logprob), most likely first
SAME, TIE, DIFFER = "same", "tie", "differ"  # how a position's top-N ids compare with the baseline's
DIGITS = 4  # rounding of fractions in the JSON


def top_agreement(ours: Top, reference: Top, tie: float = TIE_LOGIT_GAP) -> str:
    """SAME when both top-N hold the same ids; TIE when every id only one of them holds has a logprob
    within ``tie`` of the baseline's smallest top value (a swap at the boundary); DIFFER otherwise.
    (A logprob is the logit minus the same normaliser, so a logit tie is a logprob tie.)"""
    mine, theirs = dict(ours), dict(reference)
    if mine.keys() == theirs.keys():
        return SAME
    if not reference:
        return DIFFER
    boundary = min(theirs.values())
    apart = [mine[i] for i in mine.keys() - theirs.keys()] + [theirs[i] for i in theirs.keys() - mine.keys()]
    return TIE if all(abs(v - boundary) <= tie for v in apart) else DIFFER


def top_value_diff(ours: Top, reference: Top) -> float | None:
    """The largest |our logprob - the baseline's| over the ids both top-N hold (None: no id in common)."""
    theirs = dict(reference)
    diffs = [abs(v - theirs[i]) for i, v in ours if i in theirs]
    return max(diffs) if diffs else None


def _max(current: float | None, value: float | None) -> float | None:
    """The larger of two optional maxima (None: nothing measured yet)."""
    if value is None:
        return current
    return value if current is None else max(current, value)


def equal_answers(outputs: Sequence[Sequence[int]], references: Sequence[Sequence[int]]) -> int:
    """How many answers equal their reference token for token."""
    return sum(list(a) == list(b) for a, b in zip(outputs, references, strict=True))


@dataclass
class LogprobTally:
    """One ON pass's logprobs against the baseline's, over every answer."""

    answers: int = 0
    count_errors: int = 0  # answers whose logprobs are not one per output token, for that token
    positions: int = 0  # positions compared (each answer up to its first token that differs)
    max_abs_diff: float | None = None  # largest |ours - baseline| of the chosen token's logprob
    top_positions: int = 0  # of those, positions where the baseline has a top-N
    top_same: int = 0  # ... whose top-N ids are the baseline's set
    top_ties: int = 0  # ... that differ only by a swap at a tie (top_agreement)
    max_top_diff: float | None = None  # largest |ours - baseline| of a top-N value, ids both hold

    def add(self, output: Sequence[int], ours: Sequence[TokenLogprob], reference: Sequence[TokenLogprob]) -> None:
        """One answer: ``output`` (the engine's ids), its ``ours`` logprobs and the baseline's ``reference``."""
        self.answers += 1
        if [t.token_id for t in ours] != list(output):
            self.count_errors += 1
        agree = first_difference([t.token_id for t in ours], [t.token_id for t in reference])
        for mine, theirs in zip(ours[:agree], reference[:agree], strict=True):
            self.positions += 1
            self.max_abs_diff = _max(self.max_abs_diff, abs(mine.logprob - theirs.logprob))
            if not theirs.top:
                continue
            self.top_positions += 1
            verdict = top_agreement(mine.top, theirs.top)
            self.top_same += verdict == SAME
            self.top_ties += verdict == TIE
            self.max_top_diff = _max(self.max_top_diff, top_value_diff(mine.top, theirs.top))

    def record(self) -> dict[str, Any]:
        """The JSON's form."""
        n = self.top_positions
        return {
            "positions": self.positions, "logprob_count_errors": self.count_errors,
            "max_abs_logprob_diff": self.max_abs_diff, "top_positions": n, "top_same": self.top_same,
            "top_ties": self.top_ties, "top_same_frac": round(self.top_same / n, DIGITS) if n else None,
            "max_abs_top_diff": self.max_top_diff,
        }


def compare_logprobs(outputs: Sequence[Sequence[int]], ours: Sequence[Sequence[TokenLogprob]],
                     references: Sequence[Sequence[TokenLogprob]]) -> LogprobTally:
    """Every answer of an ON pass against the baseline's (in prompt order)."""
    tally = LogprobTally()
    for output, mine, theirs in zip(outputs, ours, references, strict=True):
        tally.add(output, mine, theirs)
    return tally
