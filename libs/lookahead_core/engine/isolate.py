"""A failed step fails only the requests that cause it; the others step again without them.

    failed = isolate(group, run, error)   # run(group) raised error; run(subgroup) raises when it fails

A shared forward fails as a whole (one request's bad id, a kernel refusing one request's shape), so
the failure alone does not say whose it was. Bisection finds out: a failing group of one is its
culprit; a larger one is split in halves and each half is run again. One bad request among n costs
about 2 log2(n) extra forwards, and every good request takes its step in one of them. ``run`` must
change nothing when it raises (the engine's forward writes KV only past each request's valid length,
and nothing is applied before the forward returns), so a half that succeeds has simply stepped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def isolate(group: Sequence[T], run: Callable[[Sequence[T]], None],
            error: BaseException) -> list[tuple[T, BaseException]]:
    """The members of ``group`` that fail even without the others, each with its error (``run(group)``
    raised ``error``); every other member has been run, in a group that succeeded."""
    if len(group) <= 1:
        return [(member, error) for member in group]
    half = len(group) // 2
    failed: list[tuple[T, BaseException]] = []
    for part in (group[:half], group[half:]):
        try:
            run(part)
        except Exception as exc:  # any failure of a shared forward is bisected the same way
            failed += isolate(part, run, exc)
    return failed
