"""Where a step's rows sit in the pool and what each sees (``forward/backend/layout.py``), on hand-made segments.

Slot 0's request has 2 cached entries and verifies a tree: root (row 0) with children a (row 1) and b (row 2),
a's child c (row 3); slot 1's request prefills a chunk of 2 tokens over 3 cached entries.
"""

from __future__ import annotations

import torch
from lookahead_core.drafting.draft import ancestor_matrix
from lookahead_core.forward.backend.layout import canonical, padded
from lookahead_core.forward.backend.pool import KVPool
from lookahead_core.forward.step_layout import Segment, StepLayout, causal_visible
from lookahead_core.kv.kvstore import KVShape

SHAPE = KVShape(layers=1, kv_heads=1, head_dim=2, dtype=torch.float32, device=torch.device("cpu"))
PARENTS = [-1, 0, 0, 1]  # root, a (root's), b (root's), c (a's): tree rows


def step() -> tuple[KVPool, StepLayout]:
    pool = KVPool(SHAPE, slots=2, slot_tokens=16)
    tree, chunk = pool.take(8), pool.take(8)
    visible = ancestor_matrix(PARENTS[1:])  # [4, 4]: root and its three nodes
    return pool, StepLayout([Segment(tree, 0, 2, visible), Segment(chunk, 4, 3, causal_visible(2))])


def test_ancestors_of_the_hand_tree() -> None:
    # the tree's visibility: each row sees its ancestors and itself
    visible = ancestor_matrix(PARENTS[1:])
    assert visible.astype(int).tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]]


def test_canonical_lines_read_keys_in_position_order() -> None:
    # b (row 2, position 3) reads entries 0, 1 (cached), 2 (root), 4 (itself): its line is what decoding it alone
    # reads once the root sits at 2 and b at 3; c (row 3) reads 0, 1, 2, 3 (a), 5; the chunk's second row reads
    # slot 1's 0..4
    pool, plan = step()
    layout = canonical(plan, 0, 6, pool, keys=8)
    assert layout.gather is not None and layout.valid is not None
    lines = [layout.gather[r][layout.valid[r, 0, 0]].tolist() for r in range(6)]
    assert lines == [[0, 1, 2], [0, 1, 2, 3], [0, 1, 2, 4], [0, 1, 2, 3, 5], [0, 1, 2, 3], [0, 1, 2, 3, 4]]
    assert layout.slot.tolist() == [0, 0, 0, 0, 1, 1] and layout.at.tolist() == [2, 3, 4, 5, 3, 4]


def test_a_tile_window_pads_to_the_scratch_slot() -> None:
    # rows 4..7 as a tile of 4: the chunk's two rows, then two padding rows that write to the scratch slot
    # (at their index in the window) and read only that entry
    pool, plan = step()
    layout = canonical(plan, 4, 4, pool, keys=8)
    assert layout.slot.tolist() == [1, 1, pool.scratch, pool.scratch]
    assert layout.at.tolist() == [3, 4, 2, 3]
    assert layout.valid is not None and layout.valid[:, 0, 0].sum(-1).tolist() == [4, 5, 1, 1]


def test_padded_mask_is_each_segments_own() -> None:
    # one block of 2 segments x 4 rows; keys rounded up to a block of 4 -> 8; segment 1's padding rows see entry 0
    pool, plan = step()
    layout = padded(plan, 6, pool, key_block=4)
    assert layout.mask is not None and layout.keys == 8 and layout.rows == 4
    mask = layout.mask[:, 0].int().tolist()  # [S, Q, keys]
    assert mask[0] == [[1, 1, 1, 0, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 1, 0, 0, 0],
                       [1, 1, 1, 1, 0, 1, 0, 0]]
    assert mask[1] == [[1, 1, 1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0, 0, 0],
                       [1, 0, 0, 0, 0, 0, 0, 0]]
    assert layout.gather_rows is not None and layout.scatter_rows is not None
    assert layout.gather_rows.tolist() == [0, 1, 2, 3, 4, 5, 0, 0]
    assert layout.scatter_rows.tolist() == [0, 1, 2, 3, 4, 5]
    assert layout.seg_slots is not None and layout.seg_slots.tolist() == [0, 1] and layout.first_slot == 0
