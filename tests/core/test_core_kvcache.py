"""KV-cache edits: the engine's compaction to the accepted path (kvstore), and the draft model's
DynamicCache rollback after a failed forward, copies and reorders (draft_cache)."""

from __future__ import annotations

import gc
import sys

import pytest
import torch
from lookahead_core.forward.memory import resident
from lookahead_core.kv.draft_kv import repeat_cache, rollback_cache, select_rows
from lookahead_core.kv.kvstore import KVShape, RequestKV, compact, load_prefix
from transformers import DynamicCache

from tests.core.helpers import tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

HEADS, DIM = 2, 3  # kv heads, head dim of the hand-made caches


def entry(layer: int, pos: int) -> torch.Tensor:
    """A recognisable K entry [1, HEADS, 1, DIM]: 1000 * layer + 10 * position + head/dim digits."""
    head = torch.arange(HEADS).view(1, HEADS, 1, 1)
    dim = torch.arange(DIM).view(1, 1, 1, DIM)
    return (1000.0 * layer + 10.0 * pos + 0.1 * head + 0.01 * dim).float()


def make_cache(lengths: list[int]) -> DynamicCache:
    """A cache whose layer l holds positions 0..lengths[l]-1 (values are minus the keys)."""
    cache = DynamicCache()
    for layer, n in enumerate(lengths):
        keys = torch.cat([entry(layer, p) for p in range(n)], dim=-2)  # [1, HEADS, n, DIM]
        cache.update(keys, -keys, layer)
    return cache


def expected(layer: int, positions: list[int]) -> torch.Tensor:
    return torch.cat([entry(layer, p) for p in positions], dim=-2)


# (past_len, q, keep): keep = flattened tree indices of the accepted path, root (0) first
COMPACT_CASES: list[tuple[int, int, list[int]]] = [
    # non-contiguous: every other node of a forking tree
    (4, 7, [0, 2, 4, 6]),
    # non-contiguous: the path jumps over a whole first chain (duplicate parallel chains)
    (3, 8, [0, 4, 5, 6, 7]),
    # non-contiguous single jump at the end
    (2, 5, [0, 1, 4]),
    # contiguous: a chain accepted as a prefix, the rest dropped
    (5, 6, [0, 1, 2]),
    # contiguous: nothing accepted, only the root stays
    (5, 6, [0]),
    # contiguous: everything accepted
    (1, 4, [0, 1, 2, 3]),
]


def make_kv(layers: int, n: int, capacity: int) -> RequestKV:
    """An engine cache whose layer l holds positions 0..n-1 (values are minus the keys), room for ``capacity``."""
    kv = RequestKV(KVShape(layers, HEADS, DIM, torch.float32, torch.device("cpu")), capacity)
    for layer in range(layers):
        keys = expected(layer, list(range(n)))  # [1, HEADS, n, DIM]
        kv.write(layer, 0, keys, -keys)
    kv.length = n
    return kv


@pytest.mark.parametrize(("past", "q", "keep"), COMPACT_CASES)
def test_compact_gathers_exactly_the_kept_entries(past: int, q: int, keep: list[int]) -> None:
    layers = 3
    kv = make_kv(layers, past + q, capacity=past + q + 4)
    kv.length = past  # the tree's q entries were written after the past; compaction sets the new length
    compact(kv, past, keep)
    want = list(range(past)) + [past + i for i in keep]
    assert kv.length == past + len(keep)
    for layer in range(layers):
        keys, values = kv.view(layer, kv.length)
        assert torch.equal(keys, expected(layer, want))
        assert torch.equal(values, -expected(layer, want))


def test_compacted_cache_keeps_growing() -> None:
    kv = make_kv(2, 6, capacity=8)
    compact(kv, 2, [0, 3])
    extra = entry(0, 50)
    kv.write(0, kv.length, extra, -extra)  # the next forward writes after the kept entries
    keys, _ = kv.view(0, kv.length + 1)
    assert torch.equal(keys, torch.cat([expected(0, [0, 1, 2, 5]), extra], dim=-2))


def test_a_request_cache_is_one_allocation_of_every_layer() -> None:
    # keys and values of every layer are views of one buffer: the request's end frees it whole
    shape = KVShape(3, 2, 8, torch.float16, torch.device("cpu"))
    kv = RequestKV(shape, 5)
    storage = kv.buffer.untyped_storage()
    assert all(t.untyped_storage().data_ptr() == storage.data_ptr() for t in (*kv.keys, *kv.values))
    assert storage.nbytes() == kv.nbytes == 5 * shape.bytes_per_token == 5 * 2 * 3 * 2 * 8 * 2
    assert all(t.shape == (1, 2, 5, 8) and t.is_contiguous() and t.dtype == torch.float16 for t in kv.keys)
    kv.write(2, 1, torch.ones(1, 2, 3, 8), torch.full((1, 2, 3, 8), 2.0))
    assert kv.keys[2][:, :, 1:4].eq(1).all() and kv.values[2][:, :, 1:4].eq(2).all()  # layer 2 only, where asked
    assert kv.keys[1].data_ptr() != kv.keys[2].data_ptr() != kv.values[2].data_ptr()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="resident memory is read from /proc")
def test_a_request_caches_pages_go_back_to_the_system_at_its_end() -> None:
    # the cache is a mapping of its own: written, it is resident; dropped, its pages leave the process at once
    # (from malloc's heap a freed block this size may stay resident on the free lists)
    warm = torch.ones(30 << 20, dtype=torch.uint8)
    del warm  # a freed 30 MB block: glibc now serves blocks up to that size from its heap, not from mmap
    shape = KVShape(30, 3, 64, torch.float16, torch.device("cpu"))  # SmolLM2's entry in half: 23 KB
    before = resident().anon
    kv = RequestKV(shape, 1200)  # 27.6 MB
    kv.buffer.fill_(1.0)
    held = resident().anon - before
    del kv
    gc.collect()
    assert held > 25 << 20 and resident().anon - before < 4 << 20


def test_a_write_past_capacity_is_refused() -> None:
    kv = make_kv(1, 4, capacity=4)
    with pytest.raises(ValueError, match="overflow"):
        kv.write(0, 4, entry(0, 9), entry(0, 9))


def pieces(layers: int, bounds: list[tuple[int, int]]) -> list[tuple[int, list[tuple[torch.Tensor, torch.Tensor]]]]:
    """Prefix-cache pieces holding positions [start, end) of every layer (values are minus the keys)."""
    out = []
    for start, end in bounds:
        part = [(expected(layer, list(range(start, end))), -expected(layer, list(range(start, end))))
                for layer in range(layers)]  # each [1, HEADS, end - start, DIM]
        out.append((start, part))
    return out


def test_load_prefix_copies_pieces_in_place() -> None:
    kv = RequestKV(KVShape(2, HEADS, DIM, torch.float32, torch.device("cpu")), 8)
    load_prefix(kv, pieces(2, [(0, 3), (3, 4), (4, 6)]), 6)  # a root's 3 tokens, then two attached entries'
    assert kv.length == 6
    for layer in range(2):
        keys, values = kv.view(layer, 6)
        assert torch.equal(keys, expected(layer, list(range(6))))
        assert torch.equal(values, -keys)


# (piece bounds, n, error): pieces must tile [0, n) exactly
BAD_PIECES: list[tuple[list[tuple[int, int]], int, str]] = [
    # a gap between two pieces
    ([(0, 3), (4, 6)], 6, "gap"),
    # pieces that stop short of n
    ([(0, 3)], 5, "hold 3"),
    # more than the cache's room
    ([(0, 9)], 9, "capacity"),
]


@pytest.mark.parametrize(("bounds", "n", "error"), BAD_PIECES)
def test_load_prefix_refuses_pieces_that_do_not_tile_the_prefix(bounds: list[tuple[int, int]], n: int,
                                                                 error: str) -> None:
    kv = RequestKV(KVShape(1, HEADS, DIM, torch.float32, torch.device("cpu")), 8)
    with pytest.raises(ValueError, match=error):
        load_prefix(kv, pieces(1, bounds), n)


# layer lengths left by a forward over q new tokens that raised part-way, and the prefix to restore
ROLLBACK_CASES: list[tuple[list[int], int]] = [
    # raised in layer 2 of 4: layers 0-1 have the new tokens, 2-3 do not
    ([9, 9, 5, 5], 5),
    # raised in the last layer
    ([9, 9, 9, 5], 5),
    # raised in the first layer: nothing changed, rollback is a no-op
    ([5, 5, 5, 5], 5),
    # a completed forward rolled back: every layer is cut
    ([9, 9, 9, 9], 5),
]


@pytest.mark.parametrize(("lengths", "past"), ROLLBACK_CASES)
def test_rollback_restores_every_layer(lengths: list[int], past: int) -> None:
    cache = make_cache(lengths)
    rollback_cache(cache, past)
    for layer in range(len(lengths)):
        assert torch.equal(cache.layers[layer].keys, expected(layer, list(range(past))))
        assert torch.equal(cache.layers[layer].values, -expected(layer, list(range(past))))
    assert cache.get_seq_length() == past


class Boom(RuntimeError):
    pass


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_cache_after_failed_forward_and_rollback_gives_exact_logits(family: str) -> None:
    """A forward that raises in layer 1 leaves layer 0 longer; after rollback the cache is as good as new."""
    model = tiny_model(family)
    prompt = torch.tensor([[5, 17, 99, 3, 42, 8]])  # [1, 6]
    nxt = torch.tensor([[7, 9]])  # [1, 2]

    def boom(*_: object, **__: object) -> None:
        raise Boom

    with torch.inference_mode():
        cache = DynamicCache()
        model(prompt, cache=cache, use_cache=True)
        hook = model.model.layers[1].register_forward_pre_hook(boom)
        try:
            with pytest.raises(Boom):
                model(nxt, cache=cache, use_cache=True)
        finally:
            hook.remove()
        assert cache.layers[0].keys.shape[-2] == 8  # the failure really left the layers uneven
        assert cache.layers[1].keys.shape[-2] == 6
        rollback_cache(cache, 6)
        got = model(nxt, cache=cache, use_cache=True).logits  # [1, 2, vocab]
        fresh = DynamicCache()
        model(prompt, cache=fresh, use_cache=True)
        want = model(nxt, cache=fresh, use_cache=True).logits
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_repeat_cache_copies_a_batch_1_cache_and_leaves_it_alone() -> None:
    cache = make_cache([3, 3])
    beams = repeat_cache(cache, 4)
    for layer in range(2):
        got = beams.layers[layer].keys  # [4, HEADS, 3, DIM]
        assert got.shape[0] == 4
        for row in range(4):  # every row is the original
            assert torch.equal(got[row : row + 1], expected(layer, [0, 1, 2]))
    beams.layers[0].keys[1] += 1.0  # a beam's edit stays in the copy
    assert torch.equal(cache.layers[0].keys, expected(0, [0, 1, 2]))
    with pytest.raises(ValueError, match="n >= 1"):
        repeat_cache(cache, 0)
    with pytest.raises(ValueError, match="batch-1"):
        repeat_cache(beams, 2)  # already batched


@pytest.mark.parametrize("rows", [
    [2, 0],  # reorder and drop
    [1, 1, 1],  # one beam's cache copied to three
    [0, 1, 2],  # identity
])
def test_select_rows_keeps_the_asked_rows_in_order(rows: list[int]) -> None:
    cache = DynamicCache()
    for layer in range(2):
        keys = torch.cat([entry(layer, 0) + 100.0 * b for b in range(3)], dim=0)  # [3, HEADS, 1, DIM]: row b marked
        cache.update(keys, -keys, layer)
    select_rows(cache, rows)
    for layer in range(2):
        want = torch.cat([entry(layer, 0) + 100.0 * b for b in rows], dim=0)
        assert torch.equal(cache.layers[layer].keys, want)
        assert torch.equal(cache.layers[layer].values, -want)
