"""Weights served in a GGUF file's own blocks: the parsers, the kernel, width invariance, tiny models decoding.

Bounds: a block type's parsed groups give gguf-py's own de-quantized values within one fp32 rounding
(fma(scale, code, offset) rounds once where gguf-py rounds the product, then the sum); the kernel's products
are within fp32 accumulation error (1e-5 relative) of float64 over the same de-quantized weights; and a row's
outputs are the same bits whatever rows share its forward.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize, quantize
from lookahead_core.config import DecodingConfig, DraftMode
from lookahead_core.engine.decoder import LookaheadDecoder
from lookahead_core.forward.kernels import KernelSet
from lookahead_core.forward.quant.blocks import I8, U4, UnsupportedBlocks, pack, pack_u4, unpack_u4
from lookahead_core.forward.quant.kernel import kernel
from lookahead_core.forward.quant.linear import QuantLinear, QuantWeight
from lookahead_core.forward.quant.load import BadModelFile, install, is_quantized, quantize_model, weight_format
from lookahead_core.forward.ragged import RAGGED_ATTENTION
from torch import nn

from .helpers import StubTokenizer, random_prompt, tiny_model

T = GGMLQuantizationType
QUANTIZABLE = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0)  # gguf-py quantizes these itself
K_QUANTS = (T.Q4_K, T.Q5_K, T.Q6_K)  # gguf-py only de-quantizes these: blocks are made by hand

needs_kernel = pytest.mark.skipif(kernel() is None, reason="no build of the block kernel runs here")


def hand_made_k_blocks(qtype: GGMLQuantizationType, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Random bytes of ``rows`` x ``cols`` K-quant blocks with finite, modest fp16 scales."""
    block, nbytes = GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows * cols // block, nbytes), dtype=np.uint8)
    d = rng.uniform(-0.02, 0.02, (raw.shape[0], 2)).astype(np.float16).view(np.uint8)  # d (and dmin) fp16
    if qtype == T.Q6_K:
        raw[:, -2:] = d[:, :2]  # Q6_K keeps d last
    else:
        raw[:, :4] = d  # d, dmin first
    return raw.reshape(rows, -1)


def file_blocks(qtype: GGMLQuantizationType, weight: np.ndarray) -> np.ndarray:
    """The file's bytes of ``weight`` in ``qtype`` (hand-made blocks for the K-quants)."""
    rows, cols = weight.shape
    return hand_made_k_blocks(qtype, rows, cols) if qtype in K_QUANTS else quantize(weight, qtype)


@pytest.mark.parametrize("qtype", [*QUANTIZABLE, *K_QUANTS], ids=lambda q: q.name)
def test_parsed_groups_give_gguf_pys_values(qtype: GGMLQuantizationType) -> None:
    # every supported block type: scale * code + offset is gguf-py's value within one fp32 rounding
    rows, cols = 8, 512
    weight = np.random.default_rng(1).standard_normal((rows, cols)).astype(np.float32)
    raw = file_blocks(qtype, weight)
    packed = pack(raw, qtype, rows, cols)
    want = dequantize(raw, qtype).reshape(rows, cols).astype(np.float64)
    got = packed.dequantize()
    assert packed.fmt == (U4 if qtype in (T.Q4_0, T.Q4_1, T.Q4_K) else I8)
    assert np.abs(got - want).max() <= 2 * np.finfo(np.float32).eps * (np.abs(want).max() + 1e-30)


def test_u4_layout_round_trips() -> None:
    # pack_u4 then unpack_u4 gives the codes back, and byte j of a group holds codes j and j + 16
    codes = np.random.default_rng(2).integers(0, 16, (3, 64)).astype(np.uint8)
    packed = pack_u4(codes)
    assert np.array_equal(unpack_u4(packed), codes)
    assert packed[0, 0] == codes[0, 0] | (codes[0, 16] << 4)


def test_a_truncated_tensor_or_an_unknown_type_is_refused_in_one_line() -> None:
    # a tensor short of whole blocks, and a block type with no parser, are refused naming what is wrong
    raw = quantize(np.ones((2, 64), np.float32), T.Q8_0)
    with pytest.raises(UnsupportedBlocks, match="whole blocks"):
        pack(raw[:, :-1], T.Q8_0, 2, 64)
    with pytest.raises(UnsupportedBlocks, match="IQ2_XXS"):
        pack(raw, T.IQ2_XXS, 2, 64)


def test_a_file_that_is_not_gguf_is_refused_in_one_line(tmp_path: Path) -> None:
    # garbage or a truncated file: BadModelFile, one line naming the file
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 7)
    if kernel() is None:
        pytest.skip("no build of the block kernel runs here")
    with pytest.raises(BadModelFile, match=r"broken\.gguf") as err:
        quantize_model(copy.deepcopy(tiny_model("llama")), bad, "file")
    assert "\n" not in str(err.value)


@needs_kernel
@pytest.mark.parametrize("qtype", [T.Q4_1, T.Q4_K, T.Q6_K, T.Q8_0, T.Q5_K, T.F32], ids=lambda q: q.name)
def test_the_kernel_is_float64_over_the_same_weights(qtype: GGMLQuantizationType) -> None:
    # x W^T over de-quantized weights, against float64; with a bias; rows 1..13 (every tile remainder)
    out, cols = 12, 256
    weight = np.random.default_rng(3).standard_normal((out, cols)).astype(np.float32)
    raw = weight if qtype == T.F32 else file_blocks(qtype, weight)
    packed = pack(raw, qtype, out, cols)
    layer = QuantLinear(QuantWeight.of(packed), bias=torch.randn(out))
    dense = torch.from_numpy(packed.dequantize())  # float64 [out, in]
    for rows in (1, 2, 5, 6, 7, 13):
        x = torch.randn(rows, cols)
        want = x.double() @ dense.T + layer.bias.double()
        got = layer(x).double()
        assert (got - want).abs().max() <= 1e-5 * (want.abs().max() + 1)


@needs_kernel
def test_a_rows_output_is_the_same_bits_in_any_forward() -> None:
    # width invariance: row r alone, and inside forwards of 2..64 rows, gives bit-identical outputs
    out, cols = 40, 320
    raw = quantize(np.random.default_rng(4).standard_normal((out, cols)).astype(np.float32), T.Q4_1)
    layer = QuantLinear(QuantWeight.of(pack(raw, T.Q4_1, out, cols)), bias=None)
    x = torch.randn(64, cols)
    alone = torch.cat([layer(x[r : r + 1]) for r in range(64)])
    for width in (2, 3, 6, 7, 12, 13, 33, 64):
        assert torch.equal(layer(x[:width]), alone[:width]), width
    assert torch.equal(layer(x[40:52]), alone[40:52])  # a row need not be first in its forward


def quantized_tiny(family: str, qtype: GGMLQuantizationType, activations: str = "float32") -> nn.Module:
    """A tiny model whose every Linear and embedding run ``qtype`` blocks of its own weights (fp32 products by
    default: ``test_core_qdot`` passes int8)."""
    model = copy.deepcopy(tiny_model(family))
    found = {}
    for path, module in model.named_modules():
        if isinstance(module, nn.Linear | nn.Embedding):
            w = module.weight.detach().numpy()
            raw = quantize(w, qtype)
            packed = pack(raw, qtype, *w.shape)
            module.weight.data = torch.from_numpy(dequantize(raw, qtype).reshape(w.shape).astype(np.float32))
            found[path] = QuantWeight.of(packed)
    return install(model, found, activations=activations)


def assert_modes_decode_as_one_token(model: nn.Module, seed: int) -> None:
    """Every lossless draft mode gives ``model``'s own one-token decoding, token for token."""
    import random

    tok = StubTokenizer()
    rng = random.Random(seed)
    prompts = [random_prompt(rng) + random_prompt(rng)[:6] * 3 for _ in range(3)]  # repeats give the trie drafts
    plain = LookaheadDecoder(model, tok, DecodingConfig(mode=DraftMode.NONE, max_new_tokens=24))
    want = [plain.generate(p).output_ids for p in prompts]
    for mode in (DraftMode.HIERARCHICAL, DraftMode.PARALLEL, DraftMode.LLMA, DraftMode.JACOBI):
        dec = LookaheadDecoder(model, tok, DecodingConfig(mode=mode, max_new_tokens=24))
        assert [dec.generate(p).output_ids for p in prompts] == want, mode


@needs_kernel
def test_install_marks_the_model_and_offers_only_its_modules_and_their_loop() -> None:
    # the served format is named; of the twins only stock and the block-kernel lean loop (checked bit for bit)
    model = quantized_tiny("llama", T.Q8_0)
    assert is_quantized(model) and weight_format(model) == "Q8_0"
    assert not any(type(m) is nn.Linear for m in model.modules())
    assert KernelSet(model, RAGGED_ATTENTION, threads=2).names == ["stock", "lean-blocks"]


@needs_kernel
def test_install_hands_every_swapped_weights_pages_back(monkeypatch: pytest.MonkeyPatch) -> None:
    # each fp32 weight a block layer replaced is offered to drop_file_pages (a mapped file's pages let go)
    import lookahead_core.forward.quant.load as load

    dropped: list[tuple[int, int]] = []
    monkeypatch.setattr(load, "drop_file_pages", lambda spans: dropped.extend(spans) or 0)
    model = copy.deepcopy(tiny_model("llama"))
    want = {(m.weight.data_ptr(), m.weight.nbytes) for m in model.modules() if isinstance(m, nn.Linear | nn.Embedding)}
    found = {path: QuantWeight.of(pack(quantize(m.weight.detach().numpy(), T.Q8_0), T.Q8_0, *m.weight.shape))
             for path, m in model.named_modules() if isinstance(m, nn.Linear | nn.Embedding)}
    install(model, found, check=False)
    assert set(dropped) == want and want


@needs_kernel
def test_joined_groups_hold_the_members_weights_once() -> None:
    # q/k/v joined: each member's codes are a view of the group's one storage, its values unchanged
    model = quantized_tiny("qwen2", T.Q8_0)
    attn = model.model.layers[0].self_attn
    group = attn.lookahead_group.weights[0]
    assert attn.q_proj.qweight.codes.untyped_storage().data_ptr() == group.codes.untyped_storage().data_ptr()
    x = torch.randn(3, attn.q_proj.in_features)
    want = torch.cat([attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)], dim=-1)
    assert torch.equal(attn.lookahead_group.multiply(x), want)


@needs_kernel
@pytest.mark.parametrize("family,qtype", [("llama", T.Q4_1), ("qwen2", T.Q4_0), ("qwen2", T.Q8_0)])
def test_quantized_models_decode_every_mode_as_their_one_token_decoding(family: str,
                                                                         qtype: GGMLQuantizationType) -> None:
    # every lossless draft mode gives the engine's own one-token decoding of the same weights, token for token
    assert_modes_decode_as_one_token(quantized_tiny(family, qtype), seed=5)


def _avx2_capable() -> bool:
    from lookahead_core.forward.quant import kernel as k

    return torch.backends.cpu.get_cpu_capability() in k.BUILDS["avx2"][2]


@pytest.mark.skipif(not _avx2_capable(), reason="this CPU's torch capability has no AVX2")
def test_a_kept_verdict_spawns_no_child(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a pass kept on disk is read back without a child process; a fault kept there refuses the build
    from lookahead_core.forward.quant import kernel as k

    monkeypatch.setenv("LOOKAHEAD_RAG_CACHE", str(tmp_path))
    monkeypatch.setattr(k.subprocess, "run", lambda *a, **kw: pytest.fail("a child process was spawned"))
    kept = k.verdict_path("avx2")
    kept.parent.mkdir(parents=True)
    kept.write_text(k.PASSED)
    assert k.runs_here.__wrapped__("avx2") is True
    kept.write_text(k.FAULTED)
    assert k.runs_here.__wrapped__("avx2") is False


@pytest.mark.skipif(not _avx2_capable(), reason="this CPU's torch capability has no AVX2")
def test_a_child_ended_by_a_signal_is_kept_as_a_fault_and_a_timeout_is_not(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # SIGILL in the child (an instruction this CPU faults on): refused, and kept; a timeout: refused, not kept
    import subprocess

    from lookahead_core.forward.quant import kernel as k

    monkeypatch.setenv("LOOKAHEAD_RAG_CACHE", str(tmp_path))
    monkeypatch.setattr(k.subprocess, "run", lambda *a, **kw: subprocess.CompletedProcess(a, -4, b"", b""))
    assert k.runs_here.__wrapped__("avx2") is False
    assert k.verdict_path("avx2").read_text() == k.FAULTED
    k.verdict_path("avx2").unlink()

    def too_slow(*a: object, **kw: object) -> None:
        raise subprocess.TimeoutExpired("selftest", 1.0)

    monkeypatch.setattr(k.subprocess, "run", too_slow)
    assert k.runs_here.__wrapped__("avx2") is False
    assert not k.verdict_path("avx2").exists()
