"""What a draft cache scope keeps to forget: its recent outputs with the documents they were grounded on.

    log = OutputLog(capacity=settings.max_references, max_tokens=settings.max_reference_tokens)
    log.add(output_ids, doc_ids)           # beside every trie insertion
    log.drop("json.dumps")                 # the outputs grounded on the document leave the log
    trie, refs = rebuild(log, trie_config, new_refs, max_tokens)   # a scope's trie and whole outputs, from the log

A trie keeps only counts of token windows: an output cannot be taken out of it again. Forgetting a
document therefore rebuilds the scope from the outputs the log still holds. The log is bounded (the
``capacity`` most recent outputs, each cut to ``max_tokens``); once an output has fallen out of it
the log is no longer ``complete``, and a rebuild drops those older outputs too, whatever they were
grounded on: a forget may drop more than it was asked to, never less.

Not thread-safe on its own: the store holds the scope's tenant lock around every call.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from lookahead_core.config import TrieConfig
from lookahead_core.drafting.trie import TokenTrie

from lookahead_rag.services.draftcache.references import ReferenceStore
from lookahead_rag.services.events.forget import grounded_on

Ids = tuple[int, ...]


@dataclass(frozen=True, slots=True)
class LoggedOutput:
    """One output a scope holds and the documents its answer was grounded on."""

    ids: Ids
    doc_ids: tuple[str, ...]


class OutputLog:
    """The most recent outputs of a scope, oldest first; ``complete``: the trie holds no other output."""

    def __init__(self, capacity: int, max_tokens: int) -> None:
        self.capacity = capacity
        self.max_tokens = max_tokens
        self.entries: deque[LoggedOutput] = deque()
        self.complete = True

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, ids: Sequence[int], doc_ids: Iterable[str] = ()) -> None:
        """Log an output (cut to ``max_tokens``); past ``capacity`` the oldest leaves and the log is incomplete."""
        self.entries.append(LoggedOutput(tuple(ids[: self.max_tokens]), tuple(dict.fromkeys(doc_ids))))
        if len(ids) > self.max_tokens:
            self.complete = False  # the trie holds windows past the cut
        while len(self.entries) > self.capacity:
            self.entries.popleft()
            self.complete = False

    def drop(self, doc_id: str) -> int:
        """Remove the outputs a forget of ``doc_id`` covers; how many were removed."""
        kept = deque(e for e in self.entries if not grounded_on(e.doc_ids, doc_id))
        dropped = len(self.entries) - len(kept)
        self.entries = kept
        return dropped

    def nbytes(self) -> int:
        """Approximate memory of the logged outputs (their token ids are shared with the whole outputs)."""
        return sum(sys.getsizeof(e.ids) + sys.getsizeof(e.doc_ids) for e in self.entries)

    def items(self) -> list[tuple[Ids, tuple[str, ...]]]:
        """(ids, doc ids) of every logged output, oldest first (re-adding them in order restores the log)."""
        return [(e.ids, e.doc_ids) for e in self.entries]


def needs_rebuild(dropped: int, log: OutputLog) -> bool:
    """After ``log.drop``: must the scope be rebuilt? (it lost outputs, or holds outputs the log does not know)"""
    return dropped > 0 or not log.complete


def rebuild(
    log: OutputLog, config: TrieConfig, new_refs: Callable[[], ReferenceStore], max_tokens: int
) -> tuple[TokenTrie, ReferenceStore]:
    """A scope's trie and whole outputs holding exactly the logged outputs (the log becomes complete), the
    newest of them within ``max_tokens`` (``[draftcache] max_rebuild_tokens``): older ones leave the log
    too, so one rebuild's work is bounded however a tenant filled its log (a forget drops more, never less)."""
    kept, total = 0, 0
    for entry in reversed(log.entries):
        if total + len(entry.ids) > max_tokens:
            break
        kept, total = kept + 1, total + len(entry.ids)
    while len(log.entries) > kept:
        log.entries.popleft()
    trie = TokenTrie(config)
    refs = new_refs()
    for entry in log.entries:
        trie.insert_output(entry.ids)
        refs.add(entry.ids)
    log.complete = True
    return trie, refs
