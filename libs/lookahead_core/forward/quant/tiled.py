"""A weight's codes repacked for the int8-activation kernel (``qdot.cpp``): 16 output rows a tile, one a lane.

The row-major layouts (``blocks.U4``/``I8``, what ``qlinear.cpp`` reads) become, once at load:

- u4: uint8 ``[N/16, K/32, 4, 16, 4]``: byte ``(t, g, j, l, b)`` = code ``32g + 4j + b`` of row ``16t + l``
  in its low nibble, code ``32g + 16 + 4j + b`` in its high one (the same half a byte a weight);
- i8: uint8 ``[N/16, K/4, 16, 4]``: the code plus 128 (unsigned, as VNNI's first operand wants);
- scales, offsets: fp32 ``[N/16, K/G, 16]``.

Pure numpy, invertible (``untile``: the tests' round trip). A weight whose rows are not a multiple of 16 or
whose group the kernel does not take is left row-major (``tileable``) and served by ``qlinear.cpp``.

    tiled = tile_codes(packed.fmt, packed.codes, rows, cols)   # packed: blocks.Packed, fmt u4 or i8
"""

from __future__ import annotations

import numpy as np

from .blocks import I8, U4, U4_GROUP, unpack_u4

LANES = 16  # output rows a tile holds (the kernel's 32-bit lanes of a 512-bit vector)
X_BLOCK = 32  # x elements sharing one int8 scale in the kernel
I8_BIAS = 128  # what i8 codes are stored plus
BYTES_A_LANE = 4  # consecutive k one lane multiplies per instruction (vpdpbusd)


def tileable(fmt: str, group: int, rows: int, cols: int) -> bool:
    """Whether the kernel takes this weight: u4 or i8 codes, rows a multiple of 16, K a multiple of 32 and of
    the group, the group 16 or a multiple of 32 (4-bit codes: a multiple of 32)."""
    if fmt not in (U4, I8) or rows % LANES or cols % X_BLOCK or cols % group:
        return False
    return group % X_BLOCK == 0 or (fmt == I8 and group == LANES)


def tile_codes(fmt: str, codes: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Row-major codes (u4 ``[N, K/2]`` packed, or i8 ``[N, K]``) -> the tiled bytes (flat, uint8)."""
    tiles = rows // LANES
    if fmt == U4:
        full = unpack_u4(codes).reshape(tiles, LANES, cols // U4_GROUP, 2, 4, BYTES_A_LANE)  # (t, l, g, half, j, b)
        low, high = full[:, :, :, 0], full[:, :, :, 1]  # (t, l, g, j, b)
        out = (low | (high << np.uint8(4))).transpose(0, 2, 3, 1, 4)  # (t, g, j, l, b)
    else:
        biased = (codes.astype(np.int16) + I8_BIAS).astype(np.uint8)
        out = biased.reshape(tiles, LANES, cols // BYTES_A_LANE, BYTES_A_LANE).transpose(0, 2, 1, 3)  # (t, c, l, b)
    return np.ascontiguousarray(out).reshape(-1)


def untile_codes(fmt: str, tiled: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """``tile_codes``'s inverse: codes as ``blocks`` holds them (u4 unpacked to ``[N, K]`` uint8, i8 int8)."""
    tiles = rows // LANES
    if fmt == U4:
        t = tiled.reshape(tiles, cols // U4_GROUP, 4, LANES, BYTES_A_LANE).transpose(0, 3, 1, 2, 4)  # (t, l, g, j, b)
        halves = np.stack([t & np.uint8(0x0F), t >> np.uint8(4)], axis=3)  # (t, l, g, half, j, b)
        return halves.reshape(rows, cols)
    t = tiled.reshape(tiles, cols // BYTES_A_LANE, LANES, BYTES_A_LANE).transpose(0, 2, 1, 3).reshape(rows, cols)
    return (t.astype(np.int16) - I8_BIAS).astype(np.int8)


def tile_groups(values: np.ndarray) -> np.ndarray:
    """Scales or offsets ``[N, K/G]`` -> ``[N/16, K/G, 16]`` fp32."""
    rows, groups = values.shape
    return np.ascontiguousarray(values.reshape(rows // LANES, LANES, groups).transpose(0, 2, 1), np.float32)


def untile_groups(values: np.ndarray) -> np.ndarray:
    """``tile_groups``'s inverse."""
    tiles, groups, _ = values.shape
    return np.ascontiguousarray(values.transpose(0, 2, 1).reshape(tiles * LANES, groups))


def tiled_arrays(fmt: str, codes: np.ndarray, scales: np.ndarray,
                 offsets: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """A row-major weight's (codes, scales, offsets) in the int8 kernel's tiled layout."""
    rows = scales.shape[0]
    cols = codes.shape[1] * (2 if fmt == U4 else 1)
    return (tile_codes(fmt, codes, rows, cols), tile_groups(scales),
            None if offsets is None else tile_groups(offsets))
