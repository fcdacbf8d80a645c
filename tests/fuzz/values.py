"""Hypothesis strategies for one protobuf field's values, by field type (no message is named here).

Strings: empty, blank, short random text of any code point but surrogates (protobuf cannot encode
them), odd code points (NUL, controls, bidi overrides, noncharacters, U+10FFFF), huge (up to a few
hundred KB, built by repeating a short piece so the draw stays small), and the ``FuzzDictionary``'s
known-good words alone or with junk appended, so validation can be passed and deeper code reached.
Integers: the type's extremes, the limits' boundaries (v-1, v, v+1), small values and any value in
range. Floats: NaN, ±inf, -0.0, subnormals, the largest finite value, and anything of the width.
Enums: known numbers and unknown ones. Bytes: empty, random, invalid UTF-8, huge.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from google.protobuf.descriptor import FieldDescriptor
from hypothesis import strategies as st

F = FieldDescriptor

SHORT_TEXT = 24  # longest random short text / bytes
HUGE_MIN = 1_000  # huge strings: from this many characters (long ones: from SHORT_TEXT) ...
HUGE_MAX = 300_000  # ... to this many (a few hundred KB)
SMALL_INT = 16  # small non-negative ints are drawn often: counts, k, m, token ids
PIECE_MAX = 8  # a huge string repeats a piece of at most this many characters

ODD_CHARS = (
    "\x00\x01\x1b\x7f\u0085\u00a0\u00ad\u0301\u200b\u200d\u200e\u202e\u2028\u3000"
    "\ufeff\ufdd0\ufffd\uffff\U0001f600\U0001f3f3\ufe0f\U000e0001\U0010fffe\U0010ffff\ue000"
)
BLANK_CHARS = " \t\n\r\v\f\u00a0\u2003\u3000"
INVALID_UTF8 = (
    b"\xff",  # never valid
    b"\xfe\xff",  # a UTF-16 byte order mark
    b"\xc0\x80",  # overlong NUL
    b"\xe2\x82",  # truncated 3-byte sequence
    b"\xed\xa0\x80",  # an encoded surrogate (CESU-8)
    b"\xf4\x90\x80\x80",  # past U+10FFFF
    b"\x80\x80\x80",  # continuation bytes alone
    b"ok\xf0\x9f\x98",  # valid text, then a cut 4-byte sequence
)

INT_RANGES: dict[int, tuple[int, int]] = {
    F.TYPE_INT32: (-(2**31), 2**31 - 1),
    F.TYPE_SINT32: (-(2**31), 2**31 - 1),
    F.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    F.TYPE_UINT32: (0, 2**32 - 1),
    F.TYPE_FIXED32: (0, 2**32 - 1),
    F.TYPE_INT64: (-(2**63), 2**63 - 1),
    F.TYPE_SINT64: (-(2**63), 2**63 - 1),
    F.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    F.TYPE_UINT64: (0, 2**64 - 1),
    F.TYPE_FIXED64: (0, 2**64 - 1),
}
WIDTH_BITS = {F.TYPE_FLOAT: 32, F.TYPE_DOUBLE: 64}
FLOAT_MAX = {32: 3.4028234663852886e38, 64: 1.7976931348623157e308}
FLOAT_TINY = {32: 1.401298464324817e-45, 64: 5e-324}  # the smallest subnormal
INTERESTING_INTS = (0, 1, -1, 2, 2**7, 2**8, 2**15, 2**16, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**53 + 1)


@dataclass(frozen=True)
class FuzzDictionary:
    """Known-good values a fuzzer mixes in (like an AFL dictionary): names the servers accept
    (a tenant with documents, the served tokenizer id, draft modes, chat roles) and the numbers
    the limits are set to (their neighbours are drawn too)."""

    strings: tuple[str, ...] = ()
    ints: tuple[int, ...] = ()

    @classmethod
    def of(cls, strings: Iterable[str] = (), limits: Iterable[int] = ()) -> FuzzDictionary:
        near = {v + d for v in limits for d in (-1, 0, 1)}
        return cls(tuple(dict.fromkeys(s for s in strings if s)), tuple(sorted(near)))


def _repeat(piece: str, size: int) -> str:
    return (piece * (size // len(piece) + 1))[:size]


def texts(words: FuzzDictionary) -> st.SearchStrategy[str]:
    chars = st.characters(exclude_categories=("Cs",))  # any code point protobuf can carry
    short = st.text(chars, max_size=SHORT_TEXT)
    odd = st.text(st.sampled_from(ODD_CHARS), min_size=1, max_size=SHORT_TEXT)
    blank = st.text(st.sampled_from(BLANK_CHARS), min_size=1, max_size=PIECE_MAX)
    boundaries = [n for n in words.ints if 0 < n <= HUGE_MAX] or [HUGE_MIN]  # lengths at the limits
    sizes = st.one_of(st.integers(HUGE_MIN, HUGE_MAX), st.integers(SHORT_TEXT + 1, HUGE_MIN),
                      st.sampled_from(boundaries))
    huge = st.builds(_repeat, st.text(chars, min_size=1, max_size=PIECE_MAX), sizes)
    options = [short, st.just(""), odd, blank, huge]
    if words.strings:  # first: hypothesis starts from its simplest draws, and a known word passes the checks
        def known() -> st.SearchStrategy[str]:  # a new object each time: one_of drops a repeated branch
            return st.sampled_from(words.strings)

        options = [known(), *options, known(), st.builds(str.__add__, known(), st.one_of(odd, short))]
    return st.one_of(options)


def _repeat_bytes(piece: bytes, size: int) -> bytes:
    return (piece * (size // len(piece) + 1))[:size]


def binaries() -> st.SearchStrategy[bytes]:
    huge = st.builds(_repeat_bytes, st.binary(min_size=1, max_size=PIECE_MAX), st.integers(HUGE_MIN, HUGE_MAX))
    return st.one_of(st.just(b""), st.binary(max_size=SHORT_TEXT), st.sampled_from(INVALID_UTF8), huge)


def integers(lo: int, hi: int, words: FuzzDictionary) -> st.SearchStrategy[int]:
    edges = {lo, hi, lo + 1, hi - 1, *INTERESTING_INTS, *(-v for v in INTERESTING_INTS), *words.ints}
    inside = sorted(v for v in edges if lo <= v <= hi)
    return st.one_of(st.integers(0, SMALL_INT), st.sampled_from(inside), st.integers(lo, hi))  # small (0) first


def floats(bits: int) -> st.SearchStrategy[float]:
    top, tiny = FLOAT_MAX[bits], FLOAT_TINY[bits]
    specials = [0.0, -0.0, math.nan, -math.nan, math.inf, -math.inf, tiny, -tiny, top, -top, 1.0, -1.0, 0.5, 1e-7]
    return st.one_of(st.sampled_from(specials), st.floats(0, 2, width=bits), st.floats(width=bits))


def enums(field_descriptor: FieldDescriptor) -> st.SearchStrategy[int]:
    known = [v.number for v in field_descriptor.enum_type.values]
    lo, hi = INT_RANGES[F.TYPE_INT32]
    return st.one_of(st.sampled_from(known), st.integers(lo, hi))  # proto3 enums are open: unknown numbers parse


def scalar_values(field_descriptor: FieldDescriptor, words: FuzzDictionary) -> st.SearchStrategy[object]:
    """Values of one non-message field's type."""
    kind = field_descriptor.type
    if kind == F.TYPE_STRING:
        return texts(words)
    if kind == F.TYPE_BYTES:
        return binaries()
    if kind == F.TYPE_BOOL:
        return st.booleans()
    if kind == F.TYPE_ENUM:
        return enums(field_descriptor)
    if kind in WIDTH_BITS:
        return floats(WIDTH_BITS[kind])
    if kind in INT_RANGES:
        return integers(*INT_RANGES[kind], words)
    raise TypeError(f"no strategy for field {field_descriptor.full_name} of type {kind}")
