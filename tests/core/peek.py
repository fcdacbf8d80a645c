"""Test-only views into the core's objects: what the tests read or feed that the library never needs
(so the shipped classes carry no method only tests call)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from lookahead_core.drafting.trie import TokenTrie
from lookahead_core.engine.admission import FairQueue
from lookahead_core.engine.request import ServeRequest

P = TypeVar("P")


def contains_path(trie: TokenTrie, tokens: Sequence[int]) -> bool:
    """Whether ``tokens`` is a path from ``trie``'s root."""
    return trie.find(tokens) is not None


def insert_branch(trie: TokenTrie, branch: Sequence[int], count: int = 1) -> None:
    """Insert one branch path (cut at the branch length) as output counts: no windows, unlike
    ``TokenTrie.insert_output``."""
    with trie.lock:
        trie.clock += 1
        trie._add_path(branch[: trie.config.branch_length], prompt=False, count=count)


def proposer_of(req: ServeRequest, kind: type[P]) -> P | None:
    """``req``'s proposer of class ``kind``, if the engine built one."""
    return next((p for p in req.proposers if isinstance(p, kind)), None)


def waiting_by_tenant(queue: FairQueue) -> dict[str, int]:
    """Waiting requests per tenant (tenants with none are absent)."""
    return {name: len(t.entries) for name, t in queue._tenants.items()}
