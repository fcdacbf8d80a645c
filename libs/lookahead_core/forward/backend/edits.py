"""The KV edits the engine makes through its backend, one implementation for every backend.

A backend owns the caches it grants (``Backend.kv_for``); the engine changes one only through these methods:
``keep`` the accepted path after a tree forward, ``load_prefix`` a cached prompt prefix, ``extend`` over a
prefill chunk's entries, and reads ``prefix_views`` to keep a prompt's KV. Each is one of ``kv.kvstore``'s
explicit functions (a pool slot's ``SlotKV`` is a ``RequestKV`` of views, so they edit it in place):

    backend.keep(kv, past_len, path)      # kvstore.compact: the path's entries gathered, length past_len + len
    backend.load_prefix(kv, pieces, n)    # kvstore.load_prefix: n cached entries copied in, length n
    backend.extend(kv, end)               # a chunk's forward wrote up to end: length end
    backend.prefix_views(kv, n)           # kvstore.prefix_views: the first n entries, for the prefix cache
"""

from __future__ import annotations

from collections.abc import Sequence

from ...kv.kvstore import KV, Pieces, RequestKV, compact, load_prefix, prefix_views


class KVEdits:
    """The engine's edits of a granted cache (both backends inherit them)."""

    def keep(self, kv: RequestKV, past_len: int, kept: Sequence[int]) -> None:
        """After a tree forward at ``past_len``: keep the entries of tree nodes ``kept`` (ascending)."""
        compact(kv, past_len, kept)

    def load_prefix(self, kv: RequestKV, pieces: Pieces, n: int) -> None:
        """Copy a cached prefix of ``n`` entries (``pieces``, the prefix cache's) into ``kv``."""
        load_prefix(kv, pieces, n)

    def extend(self, kv: RequestKV, end: int) -> None:
        """A forward wrote ``kv``'s entries up to ``end`` (a prefill chunk's): they are valid now."""
        if not kv.length <= end <= kv.capacity:
            raise ValueError(f"KV extend to {end} entries: it holds {kv.length} of capacity {kv.capacity}")
        kv.length = end

    def prefix_views(self, kv: RequestKV, n: int) -> KV:
        """Views of ``kv``'s first ``n`` entries (the prefix cache copies the part it keeps)."""
        return prefix_views(kv, n)
