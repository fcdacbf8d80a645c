"""The device-generic backend's KV: one preallocated pool per engine, a slot per running request.

Every layer's keys and values live in one tensor each, [slots, kv_heads, slot_tokens, head_dim], allocated
once when the engine starts: a step never allocates cache memory, and the attention of every request of a
step reads one tensor a layer (``pooled_attention``). A request owns one slot from admission to its end;
its ``SlotKV`` is a ``RequestKV`` whose buffers are views of that slot, so every explicit cache edit of
``kv.kvstore`` (write, compact, load_prefix, prefix_views) works on it unchanged, and its ``nbytes`` is the
whole slot's (what the pool holds for it, the figure admission counts). The last slot is the
scratch slot: padding rows of a forward (``exact_numerics`` tiles) write there and nothing reads it.

    pool = KVPool(shape, slots=16, slot_tokens=2048)
    kv = pool.take(capacity=900)   # KVPoolFull when no slot is free, ValueError past slot_tokens
    pool.give_back(kv)
"""

from __future__ import annotations

import torch

from ...kv.kvstore import KVShape, RequestKV
from .base import check_fits


class KVPoolFull(RuntimeError):
    """Every slot of the pool is held by a running request."""


class SlotKV(RequestKV):
    """A request's cache as views of its pool slot (``slot``): the first ``capacity`` entries of it."""

    def __init__(self, pool: KVPool, slot: int, capacity: int) -> None:
        self.shape = pool.shape
        self.capacity = capacity
        self.length = 0
        self.slot = slot  # the slot index in the pool's tensors (dim 0)
        self.keys = [k[slot : slot + 1, :, :capacity] for k in pool.keys]  # each [1, kv_heads, capacity, head_dim]
        self.values = [v[slot : slot + 1, :, :capacity] for v in pool.values]
        self._slot_bytes = pool.slot_bytes  # what the pool holds for this request: its whole slot

    @property
    def nbytes(self) -> int:
        """Bytes held for the request: its whole slot, not only the ``capacity`` entries it may use."""
        return self._slot_bytes


class KVPool:
    """``slots`` request slots of ``slot_tokens`` entries each, plus one scratch slot, in every layer."""

    def __init__(self, shape: KVShape, slots: int, slot_tokens: int) -> None:
        if slots < 1 or slot_tokens < 1:
            raise ValueError("a KV pool needs at least one slot of at least one entry")
        self.shape = shape
        self.slots = slots
        self.slot_tokens = slot_tokens
        size = (slots + 1, shape.kv_heads, slot_tokens, shape.head_dim)  # the last slot is the scratch slot
        self.keys = [torch.zeros(size, dtype=shape.dtype, device=shape.device) for _ in range(shape.layers)]
        self.values = [torch.zeros(size, dtype=shape.dtype, device=shape.device) for _ in range(shape.layers)]
        self._free = list(range(slots - 1, -1, -1))  # popped from the end: the lowest free slot first

    @property
    def scratch(self) -> int:
        """The slot padding rows write to (never a request's)."""
        return self.slots

    @property
    def nbytes(self) -> int:
        """Bytes the pool holds, scratch slot included."""
        return (self.slots + 1) * self.slot_bytes

    @property
    def slot_bytes(self) -> int:
        """Bytes one slot holds (a request's cache, whatever its capacity)."""
        return self.slot_tokens * self.shape.bytes_per_token

    @property
    def free(self) -> int:
        """Slots no request holds."""
        return len(self._free)

    def take(self, capacity: int) -> SlotKV:
        """A free slot for a request that needs ``capacity`` entries (its lowest free index)."""
        check_fits(capacity, self.slot_tokens)
        if not self._free:
            raise KVPoolFull(f"all {self.slots} KV pool slots are held")
        return SlotKV(self, self._free.pop(), capacity)

    def give_back(self, kv: RequestKV) -> None:
        """Free ``kv``'s slot (a request's end), its entries zeroed: the next holder's masked reads of it see finite
        values, never what an earlier tenant left. Caches that are not this pool's are ignored."""
        if not isinstance(kv, SlotKV) or kv.slot in self._free or kv.keys[0].data_ptr() != self._slot_ptr(kv.slot):
            return
        for buf in (*kv.keys, *kv.values):
            buf.zero_()  # [1, kv_heads, capacity, head_dim]
        self._free.append(kv.slot)
        self._free.sort(reverse=True)

    def _slot_ptr(self, slot: int) -> int:
        return self.keys[0][slot].data_ptr()
