"""A GGUF tensor's blocks as affine groups: the codes the file holds, a scale and an offset a group.

Every block type the built-ins and the common Q4_K_M / Q8_0 files hold de-quantizes as
``w = scale[g] * code + offset[g]`` over groups of 32 (16 for Q6_K) with small integer codes; llama.cpp
folds the super-block factors of the K-quants (``d * sc``, ``dmin * m``) into per-group ones the same way.
So one kernel serves them all (``qlinear.cpp``), from two code layouts:

- ``U4``: 4-bit codes, two a byte (Q4_0, Q4_1, Q4_K): half a byte a weight, as in the file;
- ``I8``: int8 codes (Q5_0, Q5_1, Q5_K, Q6_K, Q8_0): a byte a weight (5- and 6-bit codes unpacked).

Scales and offsets are fp32 (``F32`` dense tensors pass as codes themselves). The kernel computes
``fma(scale, code, offset)``: one rounding, where llama.cpp's de-quantization rounds ``d * q`` then adds
``m`` (Q4_1, Q5_1, the K-quants): within one fp32 ulp of the file's value (``tests``: against float64).

Each parser mirrors gguf-py's ``dequantize_blocks`` for its type (the reference the tests compare with)
and stops before the multiply. Torch-free: numpy only.

    packed = pack(raw, GGMLQuantizationType.Q4_K, rows=896, cols=896)   # raw: the file's uint8 [rows, bytes]
    packed.fmt, packed.group, packed.codes.shape   # "u4", 32, (896, 448)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

U4 = "u4"  # 4-bit codes, two a byte: byte j of a group of 32 holds code j (low nibble) and code j + 16 (high)
I8 = "i8"  # int8 codes
F32 = "f32"  # dense fp32 weights (scale 1, no offset): a file's F32/F16/BF16 tensors, or a de-quantized type
FORMATS = (U4, I8, F32)  # the code layouts, in the kernel's numbering
U4_GROUP = 32  # the 4-bit layout's group: every 4-bit block type groups 32
QK_K = 256  # elements of a K-quant super-block
K_SCALES = 12  # bytes of a Q4_K/Q5_K super-block's packed 6-bit scales and mins


class UnsupportedBlocks(ValueError):
    """A tensor's block type with no kernel (said in one line, naming it)."""


class NotWholeBlocks(UnsupportedBlocks):
    """A tensor whose bytes are not whole blocks of its type (a truncated or corrupt file)."""


@dataclass(frozen=True)
class Packed:
    """One weight [rows, cols] as affine groups (numpy; ``quant.linear.QuantWeight`` holds it as tensors)."""

    fmt: str  # U4, I8 or F32
    group: int  # elements a scale covers, along cols
    codes: np.ndarray  # U4: uint8 [rows, cols // 2]; I8: int8 [rows, cols]; F32: float32 [rows, cols]
    scales: np.ndarray  # float32 [rows, cols // group]
    offsets: np.ndarray | None  # float32 [rows, cols // group], or None where every offset is 0
    source: str  # the file's block type name, e.g. "Q4_K"

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.scales.shape[0]), int(self.scales.shape[1] * self.group)

    def dequantize(self) -> np.ndarray:
        """float64 [rows, cols]: scale * code + offset, exactly (the tests' reference)."""
        rows, cols = self.shape
        if self.fmt == F32:
            return self.codes.astype(np.float64)
        codes = unpack_u4(self.codes) if self.fmt == U4 else self.codes
        grouped = codes.astype(np.float64).reshape(rows, cols // self.group, self.group)
        out = grouped * self.scales.astype(np.float64)[..., None]
        if self.offsets is not None:
            out += self.offsets.astype(np.float64)[..., None]
        return out.reshape(rows, cols)


def pack_u4(codes: np.ndarray) -> np.ndarray:
    """uint8 codes 0..15 [rows, cols] -> [rows, cols // 2] in the U4 layout."""
    rows, cols = codes.shape
    c = codes.astype(np.uint8).reshape(rows, cols // U4_GROUP, 2, U4_GROUP // 2)
    return (c[:, :, 0, :] | (c[:, :, 1, :] << np.uint8(4))).reshape(rows, cols // 2)


def unpack_u4(packed: np.ndarray) -> np.ndarray:
    """``pack_u4``'s inverse: [rows, cols // 2] -> uint8 [rows, cols]."""
    rows, half = packed.shape
    p = packed.reshape(rows, half // (U4_GROUP // 2), 1, U4_GROUP // 2)
    return ((p >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)) & np.uint8(0x0F)).reshape(rows, half * 2)


def _f16(b: np.ndarray) -> np.ndarray:
    """Two bytes a block -> float32 [n_blocks, 1]."""
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray, width: int) -> np.ndarray:
    """Bytes [n, chunks * width] -> nibbles [n, chunks * 2 * width]: each chunk's low nibbles, then its high."""
    n = qs.shape[0]
    q = qs.reshape(n, -1, 1, width) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    return (q & np.uint8(0x0F)).reshape(n, -1)


def _high_bits(qh: np.ndarray) -> np.ndarray:
    """Q5_0/Q5_1's 4 bytes of fifth bits -> [n, 32] of 0/1."""
    bits = np.ascontiguousarray(qh).view(np.uint32).reshape(-1, 1) >> np.arange(32, dtype=np.uint32).reshape(1, 32)
    return (bits & np.uint32(1)).astype(np.uint8)


def _k_scales(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 bytes -> 6-bit (scale, min) of each of its 8 sub-blocks: float32 [n, 8] each."""
    n = scales.shape[0]
    s = scales.reshape(n, 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc.astype(np.float32), mn.astype(np.float32)


# Each parser: blocks uint8 [n_blocks, bytes] -> (codes [n_blocks, elements], scales and offsets
# [n_blocks, groups] float32 or None), the codes uint8 for U4 types and int8 for I8 ones.
Parsed = tuple[np.ndarray, np.ndarray, np.ndarray | None]


def _q4_0(b: np.ndarray) -> Parsed:
    d = _f16(b[:, :2])
    return _nibbles(b[:, 2:], 16), d, -8 * d  # exact: -8d is d scaled by a power of two


def _q4_1(b: np.ndarray) -> Parsed:
    return _nibbles(b[:, 4:], 16), _f16(b[:, :2]), _f16(b[:, 2:4])


def _q5_0(b: np.ndarray) -> Parsed:
    q = _nibbles(b[:, 6:], 16) | (_high_bits(b[:, 2:6]) << np.uint8(4))
    return (q.astype(np.int16) - 16).astype(np.int8), _f16(b[:, :2]), None


def _q5_1(b: np.ndarray) -> Parsed:
    q = _nibbles(b[:, 8:], 16) | (_high_bits(b[:, 4:8]) << np.uint8(4))
    return q.astype(np.int8), _f16(b[:, :2]), _f16(b[:, 2:4])


def _q8_0(b: np.ndarray) -> Parsed:
    return np.ascontiguousarray(b[:, 2:]).view(np.int8), _f16(b[:, :2]), None


def _q4_k(b: np.ndarray) -> Parsed:
    d, dmin = _f16(b[:, :2]), _f16(b[:, 2:4])
    sc, mn = _k_scales(b[:, 4:4 + K_SCALES])
    return _nibbles(b[:, 4 + K_SCALES:], 32), d * sc, -(dmin * mn)


def _q5_k(b: np.ndarray) -> Parsed:
    d, dmin = _f16(b[:, :2]), _f16(b[:, 2:4])
    sc, mn = _k_scales(b[:, 4:4 + K_SCALES])
    qh, qs = b[:, 4 + K_SCALES:4 + K_SCALES + QK_K // 8], b[:, 4 + K_SCALES + QK_K // 8:]
    n = b.shape[0]
    high = ((qh.reshape(n, 1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)) & np.uint8(1)).reshape(n, -1)
    return (_nibbles(qs, 32) | (high << np.uint8(4))).astype(np.int8), d * sc, -(dmin * mn)


def _q6_k(b: np.ndarray) -> Parsed:
    n = b.shape[0]
    ql, qh = b[:, :QK_K // 2], b[:, QK_K // 2:QK_K // 2 + QK_K // 4]
    scales = np.ascontiguousarray(b[:, QK_K // 2 + QK_K // 4:QK_K // 2 + QK_K // 4 + QK_K // 16]).view(np.int8)
    d = _f16(b[:, -2:])
    low = _nibbles(ql, 64).reshape(n, -1, 32)
    high = ((qh.reshape(n, -1, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1))
            & np.uint8(3)).reshape(n, -1, 32)
    q = (low | (high << np.uint8(4))).astype(np.int16) - 32
    return q.reshape(n, -1).astype(np.int8), d * scales.astype(np.float32), None


T = GGMLQuantizationType
PARSERS: dict[GGMLQuantizationType, tuple[str, int, Callable[[np.ndarray], Parsed]]] = {
    T.Q4_0: (U4, 32, _q4_0), T.Q4_1: (U4, 32, _q4_1), T.Q4_K: (U4, 32, _q4_k),
    T.Q5_0: (I8, 32, _q5_0), T.Q5_1: (I8, 32, _q5_1), T.Q5_K: (I8, 32, _q5_k),
    T.Q6_K: (I8, 16, _q6_k), T.Q8_0: (I8, 32, _q8_0),
}  # block type -> (code layout, group, parser)
DENSE = {T.F32: np.float32, T.F16: np.float16, T.BF16: None}  # dense types: served as F32 codes


def pack(raw: np.ndarray, qtype: GGMLQuantizationType, rows: int, cols: int) -> Packed:
    """The file's bytes of one [rows, cols] tensor (any shape holding them in order) as affine groups.

    UnsupportedBlocks for a block type with no parser (``dequantized`` serves those, with a warning)."""
    name = qtype.name
    if qtype in DENSE:
        return Packed(F32, cols, dense(raw, qtype, rows, cols), np.ones((rows, 1), np.float32), None, name)
    if qtype not in PARSERS:
        raise UnsupportedBlocks(f"no kernel for GGUF block type {name}")
    fmt, group, parse = PARSERS[qtype]
    block, nbytes = GGML_QUANT_SIZES[qtype]
    if cols % block or np.asarray(raw).size != rows * cols // block * nbytes:
        raise NotWholeBlocks(f"a {name} tensor of {rows} x {cols} does not hold whole blocks of {block}")
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1, nbytes)
    codes, scales, offsets = parse(blocks)
    codes = codes.reshape(rows, cols)
    shaped = (rows, cols // group)
    scales = np.ascontiguousarray(np.broadcast_to(scales, (blocks.shape[0], block // group)), np.float32)
    offsets = None if offsets is None else np.ascontiguousarray(
        np.broadcast_to(offsets, (blocks.shape[0], block // group)), np.float32).reshape(shaped)
    packed = pack_u4(codes) if fmt == U4 else np.ascontiguousarray(codes, np.int8)
    return Packed(fmt, group, packed, scales.reshape(shaped), offsets, name)


def dense(raw: np.ndarray, qtype: GGMLQuantizationType, rows: int, cols: int) -> np.ndarray:
    """A dense tensor's values as float32 [rows, cols]."""
    arr = np.ascontiguousarray(raw)
    if qtype == T.BF16:
        bits = arr.view(np.uint16).astype(np.uint32) << np.uint32(16)
        return bits.view(np.float32).reshape(rows, cols)
    return arr.view(DENSE[qtype]).astype(np.float32).reshape(rows, cols)


def dequantized(raw: np.ndarray, qtype: GGMLQuantizationType, rows: int, cols: int) -> Packed:
    """A block type with no kernel, de-quantized by gguf-py into F32 codes (the caller warns in one line)."""
    from gguf.quants import dequantize

    values = dequantize(np.ascontiguousarray(raw, dtype=np.uint8), qtype).astype(np.float32).reshape(rows, cols)
    return Packed(F32, cols, values, np.ones((rows, 1), np.float32), None, qtype.name)


def quantize_int8(weight: np.ndarray) -> Packed:
    """Per-channel symmetric int8 of a dense float [rows, cols] weight (``[model] weights = "int8"``):
    a scale a row, max |w| / 127, codes rounded to nearest."""
    w = np.asarray(weight, np.float32)
    scale = np.abs(w).max(axis=1, keepdims=True) / np.float32(127)
    safe = np.where(scale == 0, np.float32(1), scale)
    codes = np.clip(np.rint(w / safe), -127, 127).astype(np.int8)
    return Packed(I8, w.shape[1], codes, scale.astype(np.float32), None, "int8")
