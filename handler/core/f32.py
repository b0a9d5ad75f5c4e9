"""float32 values as JSON text without numpy: each value as its shortest round-tripping decimal, written exactly as
orjson writes a numpy float32 (`handler.api.encode`), so an answer made here has the same bytes as one made there.

Why: a Lambda start of the default embedding model answers its first requests before numpy is imported
(`handler.core.numpy_gate`); numpy is ~1/3 of such a start. The model's output arrives as float32 bytes
(`array('f')`), and a Python float holds each float32 value exactly, so the text is found here: the fewest
significant digits p (1 to 9; 9 always round-trip) whose correctly rounded decimal (`'%.{p-1}e'`) parses back to
the same float32, formatted as orjson formats it (plain from 1e-6 up to below 1e13, else `1.5e-7` / `1e+13`).

The check parses the decimal as a float64 then rounds it to float32 (`array('f')`, the C cast): exact where a
candidate of 8 or fewer digits cannot lie within half a float64 ulp of a float32 rounding midpoint without being on
it. That holds for 1e-4 <= |v| < 1e12 (the decimal and the midpoint differ by at least 1 / lcm of their
denominators: 5**11 * 2**25 relative at the worst, well above 2**-53). Values outside that range, and powers of
two (whose rounding interval is narrower below than above, so the nearest p-digit decimal can miss while another
p-digit one is inside), are checked with exact fractions instead: ~0.2% of a normalized embedding's values.
tests/unit/test_f32.py compares every output with orjson's over random bit patterns of the whole range and edges.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: `fractions` imports `decimal` (~1 ms), and only rare values need it
    from fractions import Fraction

_FORMATS = [f"%.{p - 1}e" for p in range(10)]  # index p: p significant digits
_F32 = struct.Struct("<f")
_BITS = struct.Struct("<I")
_LOW, _HIGH = 1e-4, 1e12  # where the float64 round trip is exact for <= 8 digits (the docstring)


def _text(sign: str, digits: str, exp: int) -> str:
    """orjson's layout of a float32 with significant `digits` (no trailing zeros) times 10**exp, the first digit
    being the units: plain from 1e-6 to below 1e13 (integers end `.0`), else scientific (`1.5e-7`, `1e+13`)."""
    if -6 <= exp <= 12:
        if exp < 0:
            return f"{sign}0.{'0' * (-exp - 1)}{digits}"
        whole = digits[: exp + 1].ljust(exp + 1, "0")
        return f"{sign}{whole}.{digits[exp + 1 :] or '0'}"
    mantissa = f"{digits[0]}.{digits[1:]}" if len(digits) > 1 else digits
    return f"{sign}{mantissa}e{'+' if exp > 0 else '-'}{-exp if exp < 0 else exp}"


def _parts(candidate: str) -> tuple[str, int]:
    """'%.{p}e' text of a positive value → (significant digits without trailing zeros, decimal exponent)."""
    mantissa, _, exp = candidate.partition("e")
    return mantissa.replace(".", "").rstrip("0") or "0", int(exp)


def _rounds_to(value: Fraction, bits: int) -> bool:
    """Whether the exact decimal `value` (> 0) rounds to the positive float32 with these bits (nearest, ties to an
    even mantissa): it lies between the midpoints to the float32s either side (on one only when `bits` is even)."""
    from fractions import Fraction  # deferred: see the TYPE_CHECKING import

    here = Fraction(_F32.unpack(_BITS.pack(bits))[0])
    below = Fraction(_F32.unpack(_BITS.pack(bits - 1))[0]) if bits else -here
    above = Fraction(_F32.unpack(_BITS.pack(bits + 1))[0]) if bits < 0x7F7FFFFF else here + (here - below)
    low, high = (below + here) / 2, (here + above) / 2
    if bits & 1:
        return low < value < high
    return low <= value <= high


def _exact(v: float) -> tuple[str, int]:
    """The shortest digits of positive float32 `v` by exact arithmetic: at each length the nearest decimal, and for
    a power of two the next one up too (the wider side of its interval)."""
    from fractions import Fraction  # deferred: see the TYPE_CHECKING import

    bits = _BITS.unpack(_F32.pack(v))[0]
    for p in range(1, 10):
        digits, exp = _parts(_FORMATS[p] % v)
        tries = [(digits, exp)]
        if not bits & 0x7FFFFF and p < 9:  # a power of two: the p-digit decimal above the nearest one
            unit = Fraction(10) ** (exp - p + 1)
            up = Fraction(int(digits.ljust(p, "0")), 1) * unit + unit
            tries.append(_parts(_FORMATS[p] % up))
        for d, e in tries:
            if _rounds_to(Fraction(int(d)) * Fraction(10) ** (e - len(d) + 1), bits):
                return d, e
    return _parts(_FORMATS[9] % v)  # unreachable: 9 digits always round-trip


def texts(values: Sequence[float]) -> list[str]:
    """Each float32 value (held exactly as a Python float; finite: callers refuse NaN and infinities first) as
    orjson writes it. The common range goes in passes over all values at once: 8 digits, then 9 for those 8 does
    not hold, and 7, 6, ... for those that held, while the shorter length still round-trips. ~0.55 ms for 384
    values, ~19 ms for 32 x 384 (orjson from numpy: 0.0076 / 0.25 ms): a lean start's first answers only."""
    f32 = values if isinstance(values, array) and values.typecode == "f" else array("f", values)
    bits = array("I")
    bits.frombytes(f32.tobytes())
    sizes = list(map(abs, f32))
    out: list[str] = [""] * len(sizes)
    best: list[str] = [""] * len(sizes)
    pending = []
    for i, a, b in zip(range(len(sizes)), sizes, bits, strict=True):
        if _LOW <= a < _HIGH and b & 0x7FFFFF:
            pending.append(i)
        elif a == 0:
            out[i] = "-0.0" if b else "0.0"
        else:
            out[i] = _text("-" if b >> 31 else "", *_exact(a))
    bulk, p = pending, 8
    while pending:
        form = _FORMATS[p]
        candidates = [form % sizes[i] for i in pending]
        held = []
        for i, c, back in zip(pending, candidates, array("f", map(float, candidates)), strict=True):
            if back == sizes[i]:
                best[i] = c
                held.append(i)
            elif p == 8:
                best[i] = _FORMATS[9] % sizes[i]
        pending, p = (held, p - 1) if p > 1 else ([], 0)
    for i in bulk:
        out[i] = _text("-" if bits[i] >> 31 else "", *_parts(best[i]))
    return out


class F32Rows:
    """A float32 matrix without numpy: its values row-major in an `array('f')` and its width. `handler.api.encode`
    writes it as a JSON list of rows, each value as orjson writes a numpy float32 (`json`)."""

    __slots__ = ("values", "width")

    def __init__(self, values: array[float], width: int) -> None:
        if width < 1 or len(values) % width:
            raise ValueError(f"{len(values)} values are not rows of {width}")
        self.values, self.width = values, width

    def __len__(self) -> int:
        return len(self.values) // self.width

    def json(self) -> bytes:
        words, w = texts(self.values), self.width
        rows = ["[" + ",".join(words[r : r + w]) + "]" for r in range(0, len(words), w)]
        return ("[" + ",".join(rows) + "]").encode()
