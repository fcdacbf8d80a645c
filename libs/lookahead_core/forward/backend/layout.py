"""Where a step's rows sit in the pool and what each sees, as small index tensors on the device.

Built once per forward from the packed step's segments (``step_layout.Segment``: a request's slot cache, its first
row in the packed row, its cached entries and its rows' visibility), then read by every layer's attention
call (``pooled_attention``). Two layouts:

- ``padded``: each segment's rows in one batch row of a padded [segments, rows] block, attending to its slot's
  first ``keys`` entries through one boolean mask (one masked sdpa for the whole step);
- ``canonical`` (``exact_numerics``): each row alone, reading the keys it sees gathered in position order
  ([0, past) then its tree ancestors and itself) into a fixed ``keys``-long line, the rest masked: a row's
  inputs and shapes are then the same whether it is verified in a tree or decoded alone.

Example (one segment, past 2, a tree root -> a, root -> b): rows 0, 1, 2 at positions 2, 3, 3; row 2 (b)
sees entries 0, 1 (past) and 2 (root) and 4 (itself): canonical gather [0, 1, 2, 4, pad...], 4 valid.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..step_layout import Segment, StepLayout
from .pool import KVPool, SlotKV


@dataclass
class PooledStep:
    """A forward's attention metadata over the pool (every tensor on the pool's device)."""

    pool: KVPool
    slot: torch.Tensor  # [T] long: each row's slot (padding rows: the scratch slot)
    at: torch.Tensor  # [T] long: the entry each row's key/value is written to in its slot
    plan: StepLayout  # the packed step's segments (its ``timed``/``attention_s`` serve the step profile)
    # padded layout (None in canonical)
    seg_slots: torch.Tensor | None = None  # [S] long: each segment's slot
    first_slot: int | None = None  # the segments' slots are first_slot, first_slot + 1, ... (a view, no gather)
    gather_rows: torch.Tensor | None = None  # [S * Q] long: packed row of each padded row (padding: row 0)
    scatter_rows: torch.Tensor | None = None  # [T] long: padded row of each packed row
    mask: torch.Tensor | None = None  # [S, 1, Q, keys] bool: padded row i of segment s sees entry j
    rows: int = 0  # Q: rows per padded segment
    # canonical layout (None in padded)
    gather: torch.Tensor | None = None  # [T, keys] long: entry of each row's j-th key in position order
    valid: torch.Tensor | None = None  # [T, 1, 1, keys] bool: j < the row's visible entries
    keys: int = 0  # entries each attention call reads per segment (padded) or per row (canonical)


def _slot_of(seg: Segment) -> int:
    if not isinstance(seg.kv, SlotKV):
        raise TypeError("the pooled attention runs only requests whose cache is a KV pool slot")
    return seg.kv.slot


def _writes(segments: Sequence[Segment], first: int, rows: int, scratch: int) -> tuple[list[int], list[int]]:
    """Each of packed rows [first, first + rows)'s (slot, entry) to write its key/value at; rows no segment covers
    (a tile's padding) go to the scratch slot, at their index in the window."""
    slot, at = [scratch] * rows, list(range(rows))
    for seg in segments:
        s = _slot_of(seg)
        for i in range(max(seg.start, first), min(seg.start + seg.q, first + rows)):
            slot[i - first], at[i - first] = s, seg.past + i - seg.start
    return slot, at


def padded(plan: StepLayout, rows: int, pool: KVPool, key_block: int) -> PooledStep:
    """The padded layout of ``plan``'s ``rows`` packed rows; the key axis rounded up to ``key_block`` entries."""
    dev, segs = pool.shape.device, plan.segments
    q = max(s.q for s in segs)
    keys = min(pool.slot_tokens, -(-max(s.past + s.q for s in segs) // key_block) * key_block)
    vis = np.zeros((len(segs), q, q), dtype=bool)  # [S, Q, Q]: row i sees the segment's row j
    gather = np.zeros(len(segs) * q, dtype=np.int64)  # [S * Q]
    scatter = np.zeros(rows, dtype=np.int64)  # [T]
    for n, seg in enumerate(segs):
        vis[n, : seg.q, : seg.q] = seg.visible
        gather[n * q : n * q + seg.q] = np.arange(seg.start, seg.start + seg.q)
        scatter[seg.start : seg.start + seg.q] = np.arange(n * q, n * q + seg.q)
    slot, at = _writes(segs, 0, rows, pool.scratch)
    past = torch.tensor([s.past for s in segs], device=dev)  # [S]
    real = torch.arange(q, device=dev)[None] < torch.tensor([s.q for s in segs], device=dev)[:, None]  # [S, Q]
    j = torch.arange(keys, device=dev)  # [keys]
    own = (j[None] - past[:, None]).clamp(0, q - 1)  # [S, keys]: the segment row an entry past ``past`` is
    visible = torch.from_numpy(vis).to(dev)  # [S, Q, Q]
    sees_own = visible.gather(2, own[:, None, :].expand(-1, q, -1))  # [S, Q, keys]
    in_own = (j[None] >= past[:, None]) & (j[None] < past[:, None] + q)  # [S, keys]
    mask = ((j[None, None] < past[:, None, None]) | (in_own[:, None] & sees_own)) & real[:, :, None]  # [S, Q, keys]
    mask[:, :, 0] |= ~real  # padding rows see entry 0 only (no all-masked row, no NaN; never read back)
    slots = [_slot_of(s) for s in segs]
    first = slots[0] if slots == list(range(slots[0], slots[0] + len(slots))) else None
    return PooledStep(pool, torch.tensor(slot, device=dev), torch.tensor(at, device=dev), plan,
                      seg_slots=torch.tensor(slots, device=dev), first_slot=first,
                      gather_rows=torch.from_numpy(gather).to(dev), scatter_rows=torch.from_numpy(scatter).to(dev),
                      mask=mask[:, None], rows=q, keys=keys)


def canonical(plan: StepLayout, first: int, rows: int, pool: KVPool, keys: int) -> PooledStep:
    """The canonical layout of packed rows [first, first + rows) of ``plan`` (a tile; rows past the packed row
    are padding), each reading a ``keys``-long line."""
    dev = pool.shape.device
    slot, at = _writes(plan.segments, first, rows, pool.scratch)
    past = np.zeros(rows, dtype=np.int64)  # [W]: entries before each row's segment
    seen = np.ones(rows, dtype=np.int64)  # [W]: own-segment entries each row sees (padding: its own)
    depth = max((s.q for s in plan.segments), default=1)
    own = np.zeros((rows, depth), dtype=np.int64)  # [W, D]: the segment entries a row sees, ascending
    own[:, 0] = at  # a padding row sees only its own scratch entry
    for seg in plan.segments:
        for i in range(max(seg.start, first), min(seg.start + seg.q, first + rows)):
            sees = np.flatnonzero(seg.visible[i - seg.start])
            r = i - first
            past[r], seen[r] = seg.past, len(sees)
            own[r, : len(sees)] = seg.past + sees
    if int((past + seen).max()) > keys:
        raise ValueError(f"a row sees {int((past + seen).max())} entries, more than the {keys} of its line")
    past_t, seen_t = torch.from_numpy(past).to(dev), torch.from_numpy(seen).to(dev)  # [W], [W]
    own_t = torch.from_numpy(own).to(dev)  # [W, D]
    j = torch.arange(keys, device=dev)[None]  # [1, keys]
    tail = (j - past_t[:, None]).clamp(0, depth - 1)  # [W, keys]: index into ``own``
    gather = torch.where(j < past_t[:, None], j, own_t.gather(1, tail))  # [W, keys]
    valid = j < (past_t + seen_t)[:, None]  # [W, keys]
    gather = torch.where(valid, gather, 0)
    return PooledStep(pool, torch.tensor(slot, device=dev), torch.tensor(at, device=dev), plan,
                      gather=gather, valid=valid[:, None, None], keys=keys)
