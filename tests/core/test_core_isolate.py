"""isolate(): which members of a failed shared step fail even without the others."""

from __future__ import annotations

from collections.abc import Sequence

from lookahead_core.engine.isolate import isolate


class Runner:
    """run(group) fails when the group holds a bad member; records every group that ran whole."""

    def __init__(self, bad: set[str]) -> None:
        self.bad = bad
        self.ran: list[list[str]] = []
        self.calls = 0

    def __call__(self, group: Sequence[str]) -> None:
        self.calls += 1
        culprits = self.bad.intersection(group)
        if culprits:
            raise ValueError(",".join(sorted(culprits)))
        self.ran.append(list(group))


def test_one_bad_member_among_many() -> None:
    # one culprit among eight: only it fails, every other member ran once, in few extra runs
    run = Runner({"e"})
    group = list("abcdefgh")
    failed = isolate(group, run, ValueError("e"))
    assert [(m, str(e)) for m, e in failed] == [("e", "e")]
    assert sorted(m for g in run.ran for m in g) == sorted(set(group) - {"e"})
    assert run.calls <= 2 * 3  # about 2 log2(8)


def test_several_bad_members() -> None:
    # two culprits in different halves: both fail, each with its own error
    run = Runner({"a", "h"})
    failed = isolate(list("abcdefgh"), run, ValueError("a,h"))
    assert sorted((m, str(e)) for m, e in failed) == [("a", "a"), ("h", "h")]
    assert sorted(m for g in run.ran for m in g) == list("bcdefg")


def test_a_group_of_one_is_its_own_culprit() -> None:
    # nothing to split: the member fails with the error it caused, and nothing runs again
    run = Runner({"x"})
    error = ValueError("x")
    assert isolate(["x"], run, error) == [("x", error)]
    assert run.calls == 0


def test_a_failure_of_the_whole_fails_everyone() -> None:
    # every member fails alone too (a broken model): all fail, none ran
    run = Runner(set("abc"))
    failed = isolate(list("abc"), run, ValueError("abc"))
    assert sorted(m for m, _ in failed) == list("abc")
    assert run.ran == []
