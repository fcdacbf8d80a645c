"""Which source an accepted draft came from: the prompt, the references or the tenant's cache.

A step's accepted draft tokens (all but its last, the model's own bonus token), together with the
token they follow, are looked up as a contiguous run in each source, in that order; a run found in
none of them came from the request's own output (self-repetition) and is not counted.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

ITEM = 4  # bytes per token id in the packed byte strings


def _pack(ids: Sequence[int]) -> bytes:
    return array("I", ids).tobytes()


def _contains(haystack: bytes, needle: bytes) -> bool:
    """``needle`` occurs in ``haystack`` at a token boundary."""
    start = haystack.find(needle)
    while start != -1:
        if start % ITEM == 0:
            return True
        start = haystack.find(needle, start + 1)
    return False


class DraftAttribution:
    """Counts accepted draft tokens by source (prompt, references, tenant_cache)."""

    def __init__(self, prompt: Sequence[int], references: Sequence[Sequence[int]],
                 cache: Sequence[Sequence[int]]) -> None:
        self.sources = [
            ("prompt", [_pack(prompt)]),
            ("references", [_pack(r) for r in references]),
            ("tenant_cache", [_pack(c) for c in cache]),
        ]
        self.hits = {name: 0 for name, _ in self.sources}

    def count_step(self, context: Sequence[int], new: Sequence[int]) -> None:
        """Attribute one step: ``context`` is what preceded it, ``new`` what it emitted."""
        accepted = list(new[:-1])
        if not accepted or not context:
            return
        needle = _pack([context[-1], *accepted])
        for name, packed in self.sources:
            if any(_contains(p, needle) for p in packed):
                self.hits[name] += len(accepted)
                return
