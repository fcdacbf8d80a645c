"""The lean loop's fused steps (``forward/lean_ops.py``, ``lean_ops.cpp``) against the stock operations.

The rotary step is elementwise, so its bits must be the stock ones on any machine. The norm sums squares
in ATen's cascade order over vectors of some width: where one of the widths it knows gives torch's bits
here (checked on a few rows), it must give them for every width of hidden state and every scale."""

from __future__ import annotations

import pytest
import torch
from lookahead_core.forward.lean import Norm
from lookahead_core.forward.lean_ops import LANES, FusedOps, StockOps, candidates, extension
from lookahead_core.kv.kvstore import KVShape, RequestKV
from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb

pytestmark = pytest.mark.skipif(extension() is None, reason="no C++ toolchain here: the stock steps run")

WIDTHS = (64, 100, 576, 896, 960, 1536, 4096, 8192)  # tiny, ragged, SmolLM2, Qwen 0.5B, 360M, 1.5B, 7B; a third level


def fused_lanes() -> int | None:
    """The vector width whose fused norm gives torch's bits on a few rows here, or None."""
    gen = torch.Generator().manual_seed(1)
    for lanes in LANES:
        ops = FusedOps(extension(), lanes)
        norm = Norm(torch.randn(576, generator=gen), 1e-5)
        rows = [torch.randn(1, 1, 576, generator=gen) * s for s in (1.0, 30.0, 1e-3)]
        if all(torch.equal(ops.add_norm(x, None, norm)[1], norm(x)) for x in rows):
            return lanes
    return None


LANES_HERE = fused_lanes()


@pytest.mark.skipif(LANES_HERE is None, reason="this torch sums with vectors of another width (the stock steps run)")
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("scale", [1.0, 50.0, 1e-4])  # ordinary rows, large ones, tiny ones
def test_the_fused_add_and_norm_are_the_stock_ones_bit_for_bit(width: int, scale: float) -> None:
    gen = torch.Generator().manual_seed(width)
    stock, fused = StockOps(), FusedOps(extension(), LANES_HERE)  # type: ignore[arg-type]
    module = LlamaRMSNorm(width, eps=1e-6)
    with torch.no_grad():
        module.weight.copy_(torch.randn(width, generator=gen))
    norm = Norm(module.weight, module.variance_epsilon)
    x, d = torch.randn(2, 1, 3, width, generator=gen) * scale  # [1, 3, width] each: three rows
    with torch.inference_mode():
        want_sum, want = stock.add_norm(x, d, norm)
        got_sum, got = fused.add_norm(x, d, norm)
        assert torch.equal(got_sum, x + d) and torch.equal(got_sum, want_sum)
        assert torch.equal(want, module(x + d))  # the loop's stock norm is the module's formula
        assert torch.equal(got, want)
        assert torch.equal(fused.add_norm(x, None, norm)[1], module(x))  # no residual: x normed as is
        assert torch.equal(fused.add_norm(x[:, :1], d[:, :1], norm)[1], want[:, :1])  # one row: the same


@pytest.mark.parametrize("heads_kv", [(4, 2), (9, 3), (14, 2)])  # the tiny models, SmolLM2, Qwen2.5-0.5B
@pytest.mark.parametrize("past", [0, 5])
@pytest.mark.parametrize("n", [1, 3])  # one token, a tree or chunk
def test_the_fused_rotary_writes_the_stock_q_and_cache(heads_kv: tuple[int, int], past: int, n: int) -> None:
    # elementwise: the same bits on any machine
    heads, kv_heads = heads_kv
    head_dim = 64
    gen = torch.Generator().manual_seed(heads + past + n)
    qkv = torch.randn(1, n, (heads + 2 * kv_heads) * head_dim, generator=gen)  # [1, n, rows]
    cos, sin = torch.randn(2, 1, n, head_dim, generator=gen)  # [1, n, head_dim] each
    shape = KVShape(2, kv_heads, head_dim, torch.float32, torch.device("cpu"))
    caches = [RequestKV(shape, past + n + 2) for _ in range(2)]
    got = FusedOps(extension(), LANES[0]).rotate_and_cache(  # type: ignore[arg-type]
        qkv, cos, sin, caches[0], 1, past, heads, head_dim, apply_rotary_pos_emb)
    want = StockOps().rotate_and_cache(qkv, cos, sin, caches[1], 1, past, heads, head_dim, apply_rotary_pos_emb)
    assert got.shape == (1, heads, n, head_dim) and torch.equal(got, want)
    for a, b in ((caches[0].keys[1], caches[1].keys[1]), (caches[0].values[1], caches[1].values[1])):
        assert torch.equal(a[:, :, past : past + n], b[:, :, past : past + n])  # the tokens' entries
    v = qkv[0, :, (heads + kv_heads) * head_dim :].view(n, kv_heads, head_dim).transpose(0, 1)  # [kv_heads, n, hd]
    assert torch.equal(caches[0].values[1][0, :, past : past + n], v)


def test_the_fused_rotary_rounds_into_a_half_cache_as_the_stock_copy_does() -> None:
    # a half cache: each k and v entry rounded to the nearest half, the same bits as torch's float -> half copy
    heads, kv_heads, head_dim, past, n = 9, 3, 64, 5, 7
    gen = torch.Generator().manual_seed(1)
    qkv = torch.randn(1, n, (heads + 2 * kv_heads) * head_dim, generator=gen) * 300  # some entries past half's
    cos, sin = torch.randn(2, 1, n, head_dim, generator=gen)  # precision, none past its range
    shape = KVShape(2, kv_heads, head_dim, torch.float16, torch.device("cpu"))
    caches = [RequestKV(shape, past + n) for _ in range(2)]
    got = FusedOps(extension(), LANES[0]).rotate_and_cache(  # type: ignore[arg-type]
        qkv, cos, sin, caches[0], 1, past, heads, head_dim, apply_rotary_pos_emb)
    want = StockOps().rotate_and_cache(qkv, cos, sin, caches[1], 1, past, heads, head_dim, apply_rotary_pos_emb)
    assert got.dtype == torch.float32 and torch.equal(got, want)  # q stays fp32
    for a, b in ((caches[0].keys[1], caches[1].keys[1]), (caches[0].values[1], caches[1].values[1])):
        assert a.dtype == torch.float16 and torch.equal(a[:, :, past:], b[:, :, past:])


def test_an_entry_past_the_cache_or_a_wrong_width_is_refused() -> None:
    fused = FusedOps(extension(), LANES[0])  # type: ignore[arg-type]
    shape = KVShape(1, 2, 64, torch.float32, torch.device("cpu"))
    kv = RequestKV(shape, 4)
    qkv, cos = torch.randn(1, 1, 8 * 64), torch.randn(1, 1, 64)  # 4 heads + 2 x 2 kv heads
    with pytest.raises(RuntimeError, match="fit the cache"):
        fused.rotate_and_cache(qkv, cos, cos, kv, 0, 4, 4, 64, apply_rotary_pos_emb)  # entry 4 of 4
    with pytest.raises(RuntimeError, match="each token's q, k and v"):
        fused.rotate_and_cache(qkv[..., :-64], cos, cos, kv, 0, 0, 4, 64, apply_rotary_pos_emb)
    with pytest.raises(RuntimeError, match="weight's width"):
        fused.add_norm(torch.randn(1, 1, 63), None, Norm(torch.randn(64), 1e-6))
    with pytest.raises(RuntimeError, match="x's shape"):
        fused.add_norm(torch.randn(1, 2, 64), torch.randn(1, 1, 64), Norm(torch.randn(64), 1e-6))


def test_the_stock_steps_are_always_a_candidate_and_come_last() -> None:
    found = candidates()
    assert isinstance(found[-1], StockOps)
    assert [o.lanes for o in found[:-1]] == list(LANES)  # type: ignore[attr-defined]  # fused first, each width
