"""The multi-row attention kernel (forward/attend.cpp) against sdpa, and what its rows do not depend on."""

from __future__ import annotations

import logging
from types import ModuleType

import numpy as np
import pytest
import torch
from lookahead_core.forward import attend, ragged
from lookahead_core.forward.attend import builds, fastest, multi_row, sdpa_rows
from lookahead_core.forward.kernels import make_twin
from lookahead_core.forward.ragged import RAGGED_ATTENTION, RaggedPlan
from lookahead_core.forward.step_layout import PLAN_KWARG, Segment, causal_visible
from lookahead_core.kv.kvstore import KVShape, RequestKV
from transformers import LlamaConfig, LlamaForCausalLM

BUILDS = builds()
pytestmark = pytest.mark.skipif(not BUILDS, reason="the attention kernel is not built on this machine")


def segment(rows: int, past: int, heads: int, kv_heads: int, head_dim: int, seed: int = 0, spare: int = 5
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Queries [1, heads, rows, head_dim] and a cache [1, kv_heads, past + rows + spare, head_dim] whose entries
    past the segment are NaN (garbage no row may see)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, heads, rows, head_dim, generator=gen)
    keys, values = (torch.randn(1, kv_heads, past + rows + spare, head_dim, generator=gen) for _ in range(2))
    for t in (keys, values):
        t[:, :, past + rows :] = float("nan")
    return q, keys, values


def tree_visible(parents: list[int]) -> torch.Tensor:
    """[T, T] bool: node i sees itself and its ancestors (parents[i] < i, -1 for the root)."""
    n = len(parents)
    seen = np.eye(n, dtype=bool)
    for i, p in enumerate(parents):
        if p >= 0:
            seen[i] |= seen[p]
    return torch.from_numpy(seen)


def run(ext: ModuleType, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, past: int,
        visible: torch.Tensor, scale: float = 0.125) -> torch.Tensor:
    out = torch.full((q.shape[2], q.shape[1] * q.shape[3]), float("nan"))  # [T, heads * head_dim]
    ext.attend_rows(q, keys, values, past, visible, scale, out)
    return out


def reference(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, past: int, visible: torch.Tensor,
              scale: float = 0.125) -> torch.Tensor:
    out = torch.empty(q.shape[2], q.shape[1] * q.shape[3])
    sdpa_rows(q, keys, values, past, visible, scale, out)
    return out


@pytest.mark.parametrize("ext", BUILDS, ids=lambda b: b.__name__)
@pytest.mark.parametrize(("rows", "past", "heads", "kv_heads", "head_dim"), [
    (7, 40, 9, 3, 64),  # a small chunk, three query heads per kv head (SmolLM2's 9 / 3)
    (45, 0, 14, 2, 64),  # a chunk with nothing cached before it, seven heads a group (Qwen2.5-0.5B's 14 / 2)
    (33, 19, 4, 4, 128),  # one query head per kv head, wider heads, a row count past a block
    (2, 1, 2, 1, 64),  # two rows over one cached entry
])
def test_a_causal_chunk_attends_as_sdpa_does(ext: ModuleType, rows: int, past: int, heads: int, kv_heads: int,
                                             head_dim: int) -> None:
    q, keys, values = segment(rows, past, heads, kv_heads, head_dim)
    visible = torch.ones(rows, rows, dtype=torch.bool).tril()
    got = run(ext, q, keys, values, past, visible)
    torch.testing.assert_close(got, reference(q, keys, values, past, visible), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("ext", BUILDS, ids=lambda b: b.__name__)
def test_a_tree_row_sees_only_its_ancestors_and_the_cache(ext: ModuleType) -> None:
    parents = [-1, 0, 0, 1, 1, 2, 3, 6, 5]  # a root, two branches, a chain of three under the first
    q, keys, values = segment(len(parents), 23, 9, 3, 64)
    visible = tree_visible(parents)
    torch.testing.assert_close(run(ext, q, keys, values, 23, visible), reference(q, keys, values, 23, visible),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("ext", BUILDS, ids=lambda b: b.__name__)
def test_any_mask_attends_as_sdpa_does(ext: ModuleType) -> None:
    # a block skips the segment's keys past the last one any of its rows sees: a mask where rows also see later
    # tokens (no tree or chunk makes one) must still give sdpa's result, so the skip follows the mask, not the order
    gen = torch.Generator().manual_seed(3)
    visible = (torch.rand(40, 40, generator=gen) < 0.3) | torch.eye(40, dtype=torch.bool)
    visible[2, 39] = True  # row 2 (in the first block, with rows of tokens up to 15 or 31) sees the last token
    q, keys, values = segment(40, 17, 9, 3, 64)
    torch.testing.assert_close(run(ext, q, keys, values, 17, visible), reference(q, keys, values, 17, visible),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("ext", BUILDS, ids=lambda b: b.__name__)
def test_a_row_gives_the_same_bits_whatever_rows_share_its_call(ext: ModuleType) -> None:
    # the first 5 rows of a 40-row chunk see exactly what a 5-row chunk sees: their results must be equal bit for
    # bit although they sit elsewhere in the vector lanes and the 40-row call runs more blocks and keys
    q, keys, values = segment(40, 30, 9, 3, 64)
    visible = torch.ones(40, 40, dtype=torch.bool).tril()
    whole = run(ext, q, keys, values, 30, visible)
    head = run(ext, q[:, :, :5].contiguous(), keys, values, 30, visible[:5, :5].contiguous())
    assert torch.equal(whole[:5], head)
    # a tree root alone (one row over the cache) equals the root of a tree
    tree = tree_visible([-1, 0, 0, 1])
    assert torch.equal(run(ext, q[:, :, :4].contiguous(), keys, values, 30, tree)[0],
                       run(ext, q[:, :, :2].contiguous(), keys, values, 30, tree[:2, :2].contiguous())[0])


@pytest.mark.parametrize("ext", BUILDS, ids=lambda b: b.__name__)
def test_segments_in_one_call_give_each_segment_s_own_bits(ext: ModuleType) -> None:
    # a 40-row chunk (blocks of two vectors), a one-row step and a 5-row tree (blocks of one) of three requests
    parts = [(40, 30, torch.ones(40, 40, dtype=torch.bool).tril()), (1, 70, torch.ones(1, 1, dtype=torch.bool)),
             (5, 12, tree_visible([-1, 0, 0, 1, 2]))]
    segs = [(*segment(rows, past, 9, 3, 64, seed=i), past, visible) for i, (rows, past, visible) in enumerate(parts)]
    outs = [torch.full((rows * 1, 9 * 64), float("nan")) for rows, _, _ in parts]
    ext.attend_segments([s[0] for s in segs], [s[1] for s in segs], [s[2] for s in segs], [s[3] for s in segs],
                        [s[4] for s in segs], 0.125, outs)
    for (q, keys, values, past, visible), out in zip(segs, outs, strict=True):
        assert torch.equal(out, run(ext, q, keys, values, past, visible))
    with pytest.raises(RuntimeError, match="one key, value, past, visible and out per segment"):
        ext.attend_segments([segs[0][0]], [], [], [], [], 0.125, [])


@pytest.mark.parametrize("ext", BUILDS, ids=lambda b: b.__name__)
def test_the_bits_do_not_depend_on_the_threads(ext: ModuleType) -> None:
    q, keys, values = segment(50, 60, 9, 3, 64)
    visible = torch.ones(50, 50, dtype=torch.bool).tril()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = run(ext, q, keys, values, 60, visible)
        torch.set_num_threads(max(2, threads))
        many = run(ext, q, keys, values, 60, visible)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, many)


@pytest.mark.parametrize("ext", BUILDS, ids=lambda b: b.__name__)
@pytest.mark.parametrize(("rows", "past", "parents"), [
    (1, 70, [-1]),  # a one-token step
    (40, 30, None),  # a causal chunk (blocks of two vectors)
    (5, 12, [-1, 0, 0, 1, 2]),  # a tree (blocks of one)
])
def test_a_half_cache_attends_as_an_fp32_cache_of_its_values(ext: ModuleType, rows: int, past: int,
                                                             parents: list[int] | None) -> None:
    # half entries are widened exactly as they are read: the same bits as an fp32 cache holding the rounded values
    q, keys, values = segment(rows, past, 9, 3, 64, seed=rows)
    visible = torch.ones(rows, rows, dtype=torch.bool).tril() if parents is None else tree_visible(parents)
    half_keys, half_values = keys.half(), values.half()
    got = run(ext, q, half_keys, half_values, past, visible)
    assert torch.equal(got, run(ext, q, half_keys.float(), half_values.float(), past, visible))
    assert not torch.equal(got, run(ext, q, keys, values, past, visible))  # the rounding is real: other values


@pytest.mark.parametrize("ext", BUILDS, ids=lambda b: b.__name__)
def test_a_half_cache_row_gives_the_same_bits_whatever_rows_share_its_call(ext: ModuleType) -> None:
    # width invariance holds over a half cache: 5 rows alone, and as the head of a 40-row chunk
    q, keys, values = segment(40, 30, 9, 3, 64)
    keys, values = keys.half(), values.half()
    visible = torch.ones(40, 40, dtype=torch.bool).tril()
    whole = run(ext, q, keys, values, 30, visible)
    assert torch.equal(whole[:5], run(ext, q[:, :, :5].contiguous(), keys, values, 30, visible[:5, :5].contiguous()))


@pytest.mark.parametrize("ext", BUILDS, ids=lambda b: b.__name__)
def test_a_cache_of_mixed_or_other_dtypes_is_refused(ext: ModuleType) -> None:
    q, keys, values = segment(4, 10, 9, 3, 64)
    visible = torch.ones(4, 4, dtype=torch.bool).tril()
    with pytest.raises(RuntimeError, match="both fp32 or both half"):
        run(ext, q, keys.half(), values, 10, visible)  # keys half, values fp32
    with pytest.raises(RuntimeError, match="both fp32 or both half"):
        run(ext, q, keys.bfloat16(), values.bfloat16(), 10, visible)  # bf16: not a cache the kernel reads


@pytest.mark.parametrize("ext", BUILDS, ids=lambda b: b.__name__)
def test_bad_shapes_are_refused(ext: ModuleType) -> None:
    q, keys, values = segment(4, 10, 9, 3, 64)
    visible = torch.ones(4, 4, dtype=torch.bool).tril()
    with pytest.raises(RuntimeError, match="must be in the cache"):
        run(ext, q, keys, values, keys.shape[2] - 2, visible)  # entries past the capacity
    with pytest.raises(RuntimeError, match="visible"):
        run(ext, q, keys, values, 10, visible[:3, :3].contiguous())  # a mask of another segment
    with pytest.raises(RuntimeError, match="head_dim"):
        wide = segment(4, 10, 9, 3, 72)
        run(ext, *wide, 10, visible)  # heads not a multiple of the output tile


def test_the_fastest_way_is_chosen_by_timing_it() -> None:
    calls: list[str] = []

    def slow(*args: object) -> None:
        calls.append("slow")
        torch.randn(400, 400) @ torch.randn(400, 400)

    def quick(*args: object) -> None:
        calls.append("quick")

    assert fastest([slow, quick], repeats=2) == 1
    assert fastest([quick, slow], repeats=2) == 0
    assert calls.count("quick") == calls.count("slow") == 6  # one untimed call and the repeats, each way


def test_multi_row_heads_must_fill_whole_output_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(attend, "kernel", lambda: BUILDS[0])
    tile = BUILDS[0].tile()
    cpu, fp32 = torch.device("cpu"), torch.float32
    assert multi_row(2 * tile, cpu, fp32) is BUILDS[0]
    assert multi_row(tile + 8, cpu, fp32) is None  # its heads keep sdpa
    monkeypatch.setattr(attend, "kernel", lambda: None)
    assert multi_row(2 * tile, cpu, fp32) is None  # sdpa won the timing: every segment keeps it


def test_a_forward_of_several_rows_runs_every_segment_by_the_kernel_and_one_token_by_sdpa(
        monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=300, hidden_size=256, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=BUILDS[0].tile())
    model = LlamaForCausalLM(config).eval()
    twin = make_twin(model, "stock", RAGGED_ATTENTION)
    calls: list[list[int]] = []  # rows of each segment, per kernel call

    class Spy:
        def attend_segments(self, qs: list[torch.Tensor], *args: object) -> None:
            calls.append([q.shape[2] for q in qs])
            BUILDS[0].attend_segments(qs, *args)

    monkeypatch.setattr(ragged, "multi_row", lambda head_dim, device, dtype: Spy())
    gen = torch.Generator().manual_seed(1)
    a, b = (torch.randint(300, (n,), generator=gen).tolist() for n in (13, 6))
    shape = KVShape.of(model)
    kv_a, kv_b = RequestKV(shape, len(a)), RequestKV(shape, len(b))

    def forward(parts: list[tuple[RequestKV, list[int], int, int]]) -> list[torch.Tensor]:
        """One ragged forward of each (cache, ids, first, end): the logits of every row, per part."""
        segs, start = [], 0
        for kv, _, first, end in parts:
            segs.append(Segment(kv, start, first, causal_visible(end - first)))
            start += end - first
        plan = RaggedPlan(segs)
        plan.finalize(torch.float32, torch.device("cpu"))
        ids = [t for _, toks, first, end in parts for t in toks[first:end]]
        pos = [p for _, _, first, end in parts for p in range(first, end)]
        with torch.inference_mode():
            logits = twin(input_ids=torch.tensor([ids]), position_ids=torch.tensor([pos]), use_cache=False,
                          logits_to_keep=torch.arange(len(ids)), **{PLAN_KWARG: plan}).logits[0]
        for kv, _, _, end in parts:
            kv.length = end
        return list(logits.split([end - first for _, _, first, end in parts]))

    got_a, got_b = forward([(kv_a, a, 0, 12), (kv_b, b, 0, 5)])  # two prompt chunks
    assert calls == [[12, 5], [12, 5]]  # both segments in one call, once a layer
    one_a, one_b = forward([(kv_a, a, 12, 13), (kv_b, b, 5, 6)])  # two one-row segments: still several rows
    assert calls[2:] == [[1, 1], [1, 1]]
    kv_a.length = 12
    alone = forward([(kv_a, a, 12, 13)])[0]  # a one-token forward keeps sdpa
    assert len(calls) == 4
    with torch.inference_mode():
        for ids, rows in ((a, [got_a, one_a]), (b, [got_b, one_b])):
            want = model(torch.tensor([ids])).logits[0]  # the stock causal forward
            torch.testing.assert_close(torch.cat(rows), want, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(alone, one_a, rtol=1e-4, atol=1e-4)


def test_the_kernel_is_kept_only_where_it_times_faster_than_sdpa(monkeypatch: pytest.MonkeyPatch,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(attend, "builds", lambda: BUILDS)
    attend.kernel.cache_clear()
    try:
        monkeypatch.setattr(attend, "fastest", lambda ways: 0)  # sdpa timed fastest: every segment keeps it
        assert attend.kernel() is None
        attend.kernel.cache_clear()
        monkeypatch.setattr(attend, "fastest", lambda ways: len(ways) - 1)  # the last build timed fastest
        with caplog.at_level(logging.INFO, logger=attend.__name__):
            assert attend.kernel() is BUILDS[-1]
        assert f"attend by {BUILDS[-1].__name__}" in caplog.text  # the choice is logged once, with its rivals
    finally:
        attend.kernel.cache_clear()  # the next caller times the real builds again
