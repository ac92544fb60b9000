"""The safetensors dtypes the engine lacks, read into a wider engine dtype that holds every
value exactly: uint16 -> int32, uint32 -> int64, bfloat16 and float8_e8m0 -> float32, the
float8 kinds e4m3/e5m2 (and their fnuz variants) -> float16. The rest are refused.

Pure Python on bytes (no array library): each conversion is a few slice assignments and
`bytes.translate` tables, exact by construction and checked when a table is built.
"""

from __future__ import annotations

import math
import struct

from .. import backend

# the format's dtypes the engine lacks and cannot hold exactly: (bits per element, why)
REFUSED = {
    "U64": (64, "uint64 values up to 2**64 - 1 do not fit the engine's widest integer, int64"),
    "C64": (64, "the engine has no complex dtype"),
    "F4": (4, "the engine has no packed 4-bit float"),
    "F6_E2M3": (6, "the engine has no packed 6-bit float"),
    "F6_E3M2": (6, "the engine has no packed 6-bit float"),
}


def _minifloat_table(exp_bits: int, man_bits: int, bias: int, kind: str) -> list[float]:
    """The value of each of the 256 bytes of an 8-bit float.

    kind "ieee": the top exponent is inf (mantissa 0) or nan; "fn": only the all-ones
    pattern (either sign) is nan, no inf; "fnuz": only 0x80 (negative zero's pattern) is
    nan, no inf; "e8m0": unsigned, a power of two, 0xFF nan.
    """
    values = []
    for b in range(256):
        if kind == "e8m0":
            values.append(math.nan if b == 0xFF else math.ldexp(1.0, b - 127))
            continue
        sign = -1.0 if b & 0x80 else 1.0
        e = (b >> man_bits) & ((1 << exp_bits) - 1)
        m = b & ((1 << man_bits) - 1)
        top = (1 << exp_bits) - 1
        if kind == "ieee" and e == top:
            values.append(sign * math.inf if m == 0 else math.nan)
        elif kind == "fn" and e == top and m == (1 << man_bits) - 1:
            values.append(math.nan)
        elif kind == "fnuz" and b == 0x80:
            values.append(math.nan)
        elif e == 0:
            values.append(sign * math.ldexp(m, 1 - bias - man_bits))
        else:
            values.append(sign * math.ldexp((1 << man_bits) + m, e - bias - man_bits))
    return values


def _byte_tables(values: list[float], fmt: str) -> list[bytes]:
    """One bytes.translate table per byte of the wider float `fmt` ('<e' or '<f'): table k
    maps an 8-bit float to byte k of the same value in the wider format. Exact by check."""
    packed = []
    for v in values:
        p = struct.pack(fmt, v)
        back = struct.unpack(fmt, p)[0]
        assert back == v or (math.isnan(v) and math.isnan(back)), (v, back)
        packed.append(p)
    return [bytes(p[k] for p in packed) for k in range(struct.calcsize(fmt))]


_SIGN_FILL = bytes(0xFF if b & 0x80 else 0 for b in range(256))


def _widen_int(raw: bytes, size: int, wide: int, signed: bool) -> bytearray:
    """Little-endian integers of `size` bytes as `wide`-byte ones: the low bytes copied,
    the rest 0, or 0xFF where a signed value is negative."""
    out = bytearray(len(raw) // size * wide)
    for k in range(size):
        out[k::wide] = raw[k::size]
    if signed:
        fill = raw[size - 1::size].translate(_SIGN_FILL)
        for k in range(size, wide):
            out[k::wide] = fill
    return out


def _widen_float(raw: bytes, tables: list[bytes]) -> bytearray:
    """8-bit floats as wider floats, byte by byte through the tables of _byte_tables."""
    wide = len(tables)
    out = bytearray(len(raw) * wide)
    for k, table in enumerate(tables):
        out[k::wide] = raw.translate(table)
    return out


def _bfloat16(raw: bytes) -> bytearray:
    """bfloat16 is the top half of a float32: put its two bytes above two zero bytes."""
    out = bytearray(len(raw) * 2)
    out[2::4] = raw[0::2]
    out[3::4] = raw[1::2]
    return out


_F8 = {  # code: (exp bits, mantissa bits, bias, kind, wider format, engine dtype)
    "F8_E4M3": (4, 3, 7, "fn", "<e", backend.float16),
    "F8_E5M2": (5, 2, 15, "ieee", "<e", backend.float16),
    "F8_E4M3FNUZ": (4, 3, 8, "fnuz", "<e", backend.float16),
    "F8_E5M2FNUZ": (5, 2, 16, "fnuz", "<e", backend.float16),
    "F8_E8M0": (8, 0, 127, "e8m0", "<f", backend.float32),
}
_F8_TABLES: dict = {}  # built on first use


def _f8_tables(code: str) -> list[bytes]:
    if code not in _F8_TABLES:
        e, m, bias, kind, fmt, _ = _F8[code]
        _F8_TABLES[code] = _byte_tables(_minifloat_table(e, m, bias, kind), fmt)
    return _F8_TABLES[code]


# code: (bytes per element in the file, engine dtype, raw bytes -> engine bytes)
CONVERTED = {
    "U16": (2, backend.int32, lambda raw: _widen_int(raw, 2, 4, signed=False)),
    "U32": (4, backend.int64, lambda raw: _widen_int(raw, 4, 8, signed=False)),
    "BF16": (2, backend.float32, _bfloat16),
    **{code: (1, spec[5], lambda raw, code=code: _widen_float(raw, _f8_tables(code)))
       for code, spec in _F8.items()},
}
