"""LLMA references: a scope's most recent distinct outputs kept whole, found by shared n-grams.

A repeated or similar question tends to get an answer that copies long spans of an earlier one;
the trie only keeps ``branch_length``-token windows, so the whole outputs are kept here too
(bounded in count and length) with an n-gram -> outputs index to find the ones sharing the most
n-grams with a request's prompt and references. An output seen again is counted, not stored twice.

Not thread-safe on its own: the store holds the scope's lock around every call.
"""

from __future__ import annotations

import sys
from collections import Counter, OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

Ids = tuple[int, ...]


def ngrams(tokens: Sequence[int], n: int) -> Iterator[Ids]:
    """Every n-gram of ``tokens``, in order (none when shorter than n)."""
    for start in range(len(tokens) - n + 1):
        yield tuple(tokens[start : start + n])


def distinct_ngrams(tokens: Sequence[int], n: int) -> dict[Ids, None]:
    """The n-grams of ``tokens`` once each, in order of first occurrence (deterministic iteration)."""
    return dict.fromkeys(ngrams(tokens, n))


@dataclass(slots=True)
class Reference:
    """One distinct past output."""

    ids: Ids  # the output's token ids (cut to the store's max_tokens)
    count: int  # how many applied events produced exactly these ids
    tick: int  # when it was last seen (larger = more recent; survives a snapshot in order)
    grams: tuple[Ids, ...]  # its distinct n-grams (index keys, removed with it)


@dataclass(frozen=True, slots=True)
class Match:
    """A stored output and how well it matches a query."""

    ids: Ids
    count: int  # times seen
    shared: int  # distinct n-grams shared with the query


class ReferenceStore:
    """Bounded, most-recent-first store of distinct outputs with an n-gram index."""

    def __init__(self, capacity: int, ngram: int, max_tokens: int, max_ngram_outputs: int) -> None:
        self.capacity = capacity  # distinct outputs kept; the least recently seen goes first
        self.ngram = ngram  # n-gram length of the index
        self.max_tokens = max_tokens  # outputs are cut to this many ids
        self.max_ngram_outputs = max_ngram_outputs  # n-grams in more outputs than this do not score
        self._refs: OrderedDict[int, Reference] = OrderedDict()  # serial -> output, least recent first
        self._by_ids: dict[Ids, int] = {}  # ids -> serial (one hash of the tuple per add)
        self._index: dict[Ids, set[int]] = {}  # n-gram -> serials of the outputs holding it
        self._next = 0  # next serial
        self._tick = 0  # next recency tick

    def __len__(self) -> int:
        return len(self._refs)

    def add(self, tokens: Sequence[int], count: int = 1) -> None:
        """Record an output (``count`` times); it becomes the most recent one."""
        ids = tuple(tokens[: self.max_tokens])
        if not ids or self.capacity == 0:
            return
        self._tick += 1
        serial = self._by_ids.get(ids)
        if serial is not None:
            ref = self._refs[serial]
            ref.count += count
            ref.tick = self._tick
            self._refs.move_to_end(serial)
            return
        serial = self._next
        self._next += 1
        grams = tuple(distinct_ngrams(ids, self.ngram))
        self._refs[serial] = Reference(ids, count, self._tick, grams)
        self._by_ids[ids] = serial
        for gram in grams:
            self._index.setdefault(gram, set()).add(serial)
        while len(self._refs) > self.capacity:
            self._evict_oldest()

    def _evict_oldest(self) -> None:
        serial, ref = self._refs.popitem(last=False)
        del self._by_ids[ref.ids]
        for gram in ref.grams:
            holders = self._index[gram]
            holders.discard(serial)
            if not holders:
                del self._index[gram]

    def best(self, query_grams: Iterable[Ids], limit: int, min_shared: int) -> list[Match]:
        """Up to ``limit`` outputs sharing >= ``min_shared`` of the query's distinct n-grams.

        Best first: most shared n-grams, then most often seen, then most recent.
        """
        if limit <= 0:
            return []
        shared: Counter[int] = Counter()
        for gram in query_grams:
            holders = self._index.get(gram)
            if holders is not None and len(holders) <= self.max_ngram_outputs:
                shared.update(holders)
        ranked = sorted(
            (serial for serial, hits in shared.items() if hits >= min_shared),
            key=lambda s: (-shared[s], -self._refs[s].count, -self._refs[s].tick),
        )
        return [Match(self._refs[s].ids, self._refs[s].count, shared[s]) for s in ranked[:limit]]

    def items(self) -> list[tuple[Ids, int]]:
        """(ids, count) of every output, least recent first (re-adding them in order restores the store)."""
        return [(ref.ids, ref.count) for ref in self._refs.values()]

    def nbytes(self) -> int:
        """Approximate memory of the kept outputs and the index entries."""
        total = sum(sys.getsizeof(ref.ids) for ref in self._refs.values())
        return total + sum(sys.getsizeof(holders) for holders in self._index.values())
