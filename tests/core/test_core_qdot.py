"""The int8-activation block kernel (``qdot.cpp``): its tiled layout, its bound, width invariance, tiny models.

Bounds: x is rounded to int8 per block of 32 (half a step of each block's max |x| / 127), so a product is
within ``qdot.x_error_bound`` (that half step times the block's sum of |w|, plus fp32 accumulation slack) of
float64 over the same de-quantized weights and the unrounded x. A row's outputs are the same bits whatever
rows and however many threads share its forward, so speculation stays token-identical to one-token decoding.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import quantize
from lookahead_core.forward.kernels import KernelSet
from lookahead_core.forward.quant import load
from lookahead_core.forward.quant.blocks import I8, U4, pack, quantize_int8
from lookahead_core.forward.quant.linear import QuantLinear, QuantWeight
from lookahead_core.forward.quant.load import weight_format
from lookahead_core.forward.quant.qdot import AMX_FROM, int8_kernel, keep_amx, x_error_bound
from lookahead_core.forward.quant.tiled import tile_codes, tile_groups, tileable, untile_codes, untile_groups
from lookahead_core.forward.ragged import RAGGED_ATTENTION
from torch import nn

from .helpers import tiny_model
from .test_core_quant import assert_modes_decode_as_one_token, file_blocks, quantized_tiny

T = GGMLQuantizationType
BLOCK_TYPES = (T.Q4_0, T.Q4_1, T.Q4_K, T.Q5_0, T.Q5_1, T.Q5_K, T.Q6_K, T.Q8_0)  # every type with int codes

needs_int8 = pytest.mark.skipif(int8_kernel() is None, reason="no build of the int8-activation kernel runs here")


def tiled_weight(qtype: GGMLQuantizationType | None, out: int, cols: int, seed: int) -> QuantWeight:
    """A random weight in ``qtype`` blocks (None: per-channel int8), tiled for the int8 kernel."""
    w = np.random.default_rng(seed).standard_normal((out, cols)).astype(np.float32)
    packed = quantize_int8(w) if qtype is None else pack(file_blocks(qtype, w), qtype, out, cols)
    weight = QuantWeight.of(packed).for_int8()
    assert weight.tiled
    return weight


def test_tiled_codes_and_groups_round_trip() -> None:
    # u4 (packed two a byte) and i8 codes, and [N, K/G] scales, come back as they went in
    rng = np.random.default_rng(0)
    u4 = rng.integers(0, 16, (32, 64)).astype(np.uint8)
    from lookahead_core.forward.quant.blocks import pack_u4

    assert np.array_equal(untile_codes(U4, tile_codes(U4, pack_u4(u4), 32, 64), 32, 64), u4)
    i8 = rng.integers(-128, 128, (16, 96)).astype(np.int8)
    assert np.array_equal(untile_codes(I8, tile_codes(I8, i8, 16, 96), 16, 96), i8)
    scales = rng.random((32, 6)).astype(np.float32)
    assert np.array_equal(untile_groups(tile_groups(scales)), scales)


def test_the_tiled_u4_byte_holds_codes_k_and_k_plus_16_of_one_row() -> None:
    # byte (t=0, g=0, j=1, l=2, b=3) = code 4*1+3 = 7 of row 2 (low nibble) and code 23 (high nibble)
    codes = np.zeros((16, 32), np.uint8)
    codes[2, 7], codes[2, 23] = 5, 9
    from lookahead_core.forward.quant.blocks import pack_u4

    tiled = tile_codes(U4, pack_u4(codes), 16, 32).reshape(1, 1, 4, 16, 4)
    assert tiled[0, 0, 1, 2, 3] == 5 | (9 << 4)
    assert np.count_nonzero(tiled) == 1


def test_only_whole_tiles_of_supported_groups_are_tiled() -> None:
    # rows a multiple of 16, K a multiple of 32 and of the group; 4-bit codes group by 32; i8 may group by 16
    assert tileable(U4, 32, 48, 64) and tileable(I8, 16, 16, 64) and tileable(I8, 576, 16, 576)
    assert not tileable(U4, 32, 40, 64)  # 40 rows: not whole tiles
    assert not tileable(I8, 32, 16, 48)  # K 48: not whole x blocks
    assert not tileable("f32", 32, 16, 64)  # dense weights stay on the fp32 kernel


@needs_int8
@pytest.mark.parametrize("qtype", [*BLOCK_TYPES, None], ids=lambda q: "int8" if q is None else q.name)
def test_the_int8_kernel_is_within_xs_rounding_of_float64(qtype: GGMLQuantizationType | None) -> None:
    # x W^T + b against float64 over the de-quantized weights, rows 1..13 (every tile remainder)
    out, cols = 32, 256
    weight = tiled_weight(qtype, out, cols, seed=3)
    bias = torch.randn(out)
    layer = QuantLinear(weight, bias=bias)
    dense = layer.qweight.lookup(torch.arange(out)).double().numpy()  # [out, in], the served values
    for rows in (1, 2, 5, 7, 8, 9, 13):
        x = torch.randn(rows, cols)
        want = x.double().numpy() @ dense.T + bias.double().numpy()
        got = layer(x).double().numpy()
        assert np.all(np.abs(got - want) <= x_error_bound(x.numpy(), dense)), rows


@needs_int8
def test_the_tiled_lookup_is_the_row_major_one_bit_for_bit() -> None:
    # an embedding's rows read from the tiled layout equal the fp32 kernel's de-quantization
    w = np.random.default_rng(5).standard_normal((48, 64)).astype(np.float32)
    plain = QuantWeight.of(pack(quantize(w, T.Q4_1), T.Q4_1, 48, 64))
    ids = torch.tensor([[0, 47], [17, 3]])
    assert torch.equal(plain.for_int8().lookup(ids), plain.lookup(ids))


@needs_int8
@pytest.mark.parametrize("qtype", [T.Q4_1, T.Q6_K, None], ids=["Q4_1", "Q6_K", "int8"])
def test_a_rows_output_is_the_same_bits_in_any_forward_and_any_threads(qtype: GGMLQuantizationType | None) -> None:
    # width invariance: row r alone vs inside forwards of 2..64 rows, and on 1 vs 2 threads, bit-identical
    out, cols = 48, 512  # K-quants: whole super-blocks of 256
    layer = QuantLinear(tiled_weight(qtype, out, cols, seed=4), bias=torch.randn(out))
    x = torch.randn(64, cols) * torch.linspace(0.1, 3.0, 64)[:, None]  # rows of different scales
    alone = torch.cat([layer(x[r : r + 1]) for r in range(64)])
    for width in (2, 3, 7, 8, 9, 16, 33, 64):
        assert torch.equal(layer(x[:width]), alone[:width]), width
    assert torch.equal(layer(x[40:52]), alone[40:52])  # a row need not be first in its forward
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(layer(x), alone)
    finally:
        torch.set_num_threads(threads)


def int8_tiny(family: str, qtype: GGMLQuantizationType) -> nn.Module:
    """A tiny model whose every Linear and embedding run ``qtype`` blocks of its own weights, x as int8."""
    return quantized_tiny(family, qtype, activations="int8")


@needs_int8
def test_install_tiles_every_weight_names_int8_and_keeps_the_lean_loop() -> None:
    # every weight is tiled; the format names the int8 activations; the lean loop still matches stock bit for bit
    model = int8_tiny("llama", T.Q8_0)
    assert weight_format(model) == "Q8_0 x int8"
    assert all(m.qweight.tiled for m in model.modules() if isinstance(m, QuantLinear))
    assert KernelSet(model, RAGGED_ATTENTION, threads=2).names == ["stock", "lean-blocks"]


@needs_int8
@pytest.mark.parametrize("family,qtype", [("llama", T.Q4_1), ("qwen2", T.Q4_0), ("qwen2", T.Q8_0)])
def test_int8_models_decode_every_mode_as_their_one_token_decoding(family: str, qtype: GGMLQuantizationType) -> None:
    # every lossless draft mode gives the one-token decoding of the same int8-activation model, token for token
    assert_modes_decode_as_one_token(int8_tiny(family, qtype), seed=6)


def test_without_the_int8_kernel_install_serves_fp32_products(monkeypatch: pytest.MonkeyPatch) -> None:
    # a CPU where the VNNI build does not run: weights stay row-major, the format names no int8
    from lookahead_core.forward.quant.kernel import kernel

    if kernel() is None:
        pytest.skip("no build of the block kernel runs here")
    monkeypatch.setattr(load, "int8_kernel", lambda: None)
    model = int8_tiny("qwen2", T.Q8_0)
    assert weight_format(model) == "Q8_0"
    assert not any(m.qweight.tiled for m in model.modules() if isinstance(m, QuantLinear))


def test_an_unknown_activation_format_is_refused_in_one_line() -> None:
    # [model] activations takes int8 or float32: anything else is a ValueError naming both
    with pytest.raises(ValueError, match="int8, float32") as err:
        load.quantize_model(copy.deepcopy(tiny_model("llama")), None, "int8", activations="fp8")
    assert "\n" not in str(err.value)


@needs_int8
@pytest.mark.parametrize("qtype", [T.Q4_1, T.Q6_K, T.Q8_0], ids=lambda q: q.name)
def test_amx_tiles_give_the_vnni_paths_bits(qtype: GGMLQuantizationType) -> None:
    # 37 rows: two whole AMX tiles and a tail; with AMX off every row runs on VNNI; the same bits either way
    ext = int8_kernel()
    was = ext.amx_rows(AMX_FROM)  # on, whatever start-up timing chose
    if ext.amx_rows(0) != AMX_FROM:
        ext.amx_rows(was)
        pytest.skip("the int8 build serving here has no AMX path (or AMX does not run on this CPU)")
    layer = QuantLinear(tiled_weight(qtype, 32, 512, seed=7), bias=torch.randn(32))
    x = torch.randn(37, 512)
    try:
        vnni = layer(x)
        ext.amx_rows(AMX_FROM)
        amx = layer(x)
    finally:
        ext.amx_rows(was)
    assert torch.equal(amx, vnni)


class FakeBuild:
    """An int8 build whose products advance a fake clock by a set cost, with AMX on or off."""

    def __init__(self, has_amx: bool, amx_s: float, vnni_s: float) -> None:
        self.has_amx, self.amx_s, self.vnni_s = has_amx, amx_s, vnni_s
        self.rows = AMX_FROM if has_amx else 0  # the build's amx_rows setting
        self.now = 0.0
        self.calls = 0

    def amx_rows(self, rows: int) -> int:
        was = self.rows
        if self.has_amx:
            self.rows = rows
        return was

    def qdot(self, *args: object) -> None:
        self.calls += 1
        self.now += self.amx_s if self.rows else self.vnni_s

    def clock(self) -> float:
        return self.now


@pytest.mark.parametrize(("amx_s", "vnni_s", "kept"), [
    (1.0, 2.0, True),   # AMX faster: whole 16-row blocks stay on AMX
    (2.0, 1.0, False),  # VNNI faster (a CPU whose AMX is slow): every product on VNNI from then on
    (1.0, 1.0, True),   # a tie keeps AMX
])
def test_start_up_timing_keeps_the_faster_path(amx_s: float, vnni_s: float, kept: bool) -> None:
    build = FakeBuild(True, amx_s, vnni_s)
    assert keep_amx(build, repeats=3, clock=build.clock) is kept
    assert build.rows == (AMX_FROM if kept else 0)
    assert build.calls == 2 * (1 + 3)  # one untimed and three timed products each way


def test_a_build_without_amx_is_not_timed() -> None:
    # a VNNI-only build: amx_rows stays 0, nothing is multiplied
    build = FakeBuild(False, 1.0, 2.0)
    assert keep_amx(build, repeats=3, clock=build.clock) is False
    assert build.rows == 0 and build.calls == 0
