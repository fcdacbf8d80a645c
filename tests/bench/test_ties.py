"""bench/ties.py: where a greedy answer first differs from the baseline's, and whether it is a fp tie."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from lookahead_rag.bench.ties import TIE_LOGIT_GAP, Divergence, divergences, first_difference


@pytest.mark.parametrize(
    ("ours", "reference", "want"),
    [
        # the third token differs
        ([1, 2, 3, 4], [1, 2, 9, 4], 2),
        # ours ended first (a prefix of the reference): where it ended
        ([1, 2], [1, 2, 3], 2),
        # the reference ended first
        ([1, 2, 3], [1, 2], 2),
        # the first token differs
        ([5], [6], 0),
    ],
)
def test_first_difference(ours: list[int], reference: list[int], want: int) -> None:
    assert first_difference(ours, reference) == want


class LastTokenLogits(torch.nn.Module):
    """A stand-in model: the logits after any input are ``values`` (what the baseline saw there)."""

    def __init__(self, values: list[float]) -> None:
        super().__init__()
        self.values = torch.tensor(values)
        self.seen: list[list[int]] = []

    def forward(self, input_ids: torch.Tensor) -> Any:
        self.seen.append(input_ids[0].tolist())
        return SimpleNamespace(logits=self.values.expand(1, input_ids.shape[1], -1))


def test_a_near_tie_is_told_from_a_real_difference() -> None:
    # the baseline's token 0 beat our token 1 by 2e-5 (a tie); against token 2 it won by 3.0 (a real one)
    model = LastTokenLogits([13.13002, 13.13, 10.13])
    found = divergences(model, [(7, [4, 4], [9, 1], [9, 0]), (8, [5], [2], [0])])
    assert [(d.index, d.position) for d in found] == [(7, 1), (8, 0)]
    assert found[0].gap == pytest.approx(2e-5, abs=1e-6) and found[0].tie
    assert found[1].gap == pytest.approx(3.00002, abs=1e-5) and not found[1].tie
    assert model.seen == [[4, 4, 9], [5]]  # the prompt plus the reference up to the difference


def test_an_answer_that_ends_first_is_not_a_tie() -> None:
    # one answer stopped where the other went on: no logit gap to compare, never counted as a tie
    found = divergences(LastTokenLogits([0.0, 1.0]), [(3, [1], [2, 3], [2, 3, 4])])
    assert found == [Divergence(3, 2, None)] and not found[0].tie
    assert TIE_LOGIT_GAP < 1e-3
