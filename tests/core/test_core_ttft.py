"""The step's token ceiling under a TTFT target (engine/ttft.py): pure functions, hand-made numbers."""

from __future__ import annotations

import math

import pytest
from lookahead_core.engine.ttft import Pending, largest_within, share_ceiling, step_ceiling, step_seconds


def linear(n: int) -> float:
    """The module docstring's machine: 40 ms a forward plus 2.4 ms a token."""
    return 0.040 + 0.0024 * n


@pytest.mark.parametrize(
    ("pending", "chunk", "want"),
    [
        # nothing waits: no limit
        ([], 256, math.inf),
        # the docstring's A (2 steps, 1.5 s) and B (3 steps behind A, 3.9 s): A binds at 0.75 s
        ([Pending(300, 1.5), Pending(400, 3.9)], 256, 0.75),
        # B's slack is the tighter one once it is short: 1.2 s over 3 steps
        ([Pending(300, 1.5), Pending(400, 1.2)], 256, 0.4),
        # one small prompt: one step, the whole slack
        ([Pending(10, 2.0)], 256, 2.0),
        # a request already late: no time for anything but the step's floor
        ([Pending(300, 1.5), Pending(10, -0.1)], 256, 0.0),
    ],
)
def test_step_seconds(pending: list[Pending], chunk: int, want: float) -> None:
    assert step_seconds(pending, chunk) == pytest.approx(want)


def test_step_seconds_refuses_an_empty_chunk() -> None:
    # no prompt tokens per step would mean no request ever finishes its prefill
    with pytest.raises(ValueError):
        step_seconds([Pending(1, 1.0)], 0)


@pytest.mark.parametrize(
    ("seconds", "floor", "ceiling", "want"),
    [
        # the docstring's 0.75 s: (0.75 - 0.040) / 0.0024 = 295.8 tokens
        (0.75, 271, 512, 295),
        # room for the whole forward
        (5.0, 271, 512, 512),
        # not even the floor fits: the floor (prefill and roots always run)
        (0.1, 271, 512, 271),
        # exactly the floor's cost
        (linear(271), 271, 512, 271),
    ],
)
def test_largest_within(seconds: float, floor: int, ceiling: int, want: int) -> None:
    assert largest_within(linear, seconds, floor, ceiling) == want


@pytest.mark.parametrize(
    ("pending", "want"),
    [
        # the docstring's worked example: 295 tokens, 24 of them for trees
        ([Pending(300, 1.5), Pending(400, 3.9)], 295),
        # nothing waits: the forward's own limit, trees grow back
        ([], 512),
        # someone is late: the floor (no trees)
        ([Pending(300, 0.0)], 271),
        # plenty of slack: the forward's limit
        ([Pending(300, 60.0)], 512),
    ],
)
def test_step_ceiling(pending: list[Pending], want: int) -> None:
    assert step_ceiling(pending, 256, 271, 512, linear) == want


def test_step_ceiling_never_below_the_floor() -> None:
    # a floor past max_tokens (a prefill chunk and roots that fill the forward) stays the floor
    assert step_ceiling([Pending(300, 1.5)], 256, 520, 512, linear) == 520


@pytest.mark.parametrize(
    ("share", "floor", "want"),
    [
        # a 256-token chunk and 3 roots cost 0.6616 s; 5% more is 0.6947 s: 272 tokens, 13 for trees
        (0.05, 259, 272),
        # no share: prefill steps carry no trees
        (0.0, 259, 259),
        # no cap (inf): the forward's own limit
        (math.inf, 259, 512),
        # a share past the forward's limit: the limit
        (1.0, 259, 512),
        # a floor that fills the forward stays the floor
        (0.05, 520, 520),
    ],
)
def test_share_ceiling(share: float, floor: int, want: int) -> None:
    assert share_ceiling(linear, floor, 512, share) == want


def test_share_ceiling_follows_the_docstring_example() -> None:
    # 0.040 + 0.001 n, floor 259, share 0.05: 273 tokens (ttft.share_ceiling's docstring)
    assert share_ceiling(lambda n: 0.040 + 0.001 * n, 259, 512, 0.05) == 273
