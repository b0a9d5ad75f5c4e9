"""Request values → numpy arrays of the dtype a model takes: exactly, or refused with `InvalidInputError`.

Two routes in, both checked before anything is allocated past what the request itself holds:

- nested JSON lists: numpy's own conversion wraps integers (`2**32 + 7` into int32 is 7) and overflows floats
  to `inf` without a word, so each value's range is checked against the dtype first. Integers must fit an
  integer dtype, or lie within ±2**mantissa of a float dtype (where every integer is exact); floats round to
  the nearest value of a float dtype as any float conversion does, but a finite value never becomes `inf`.
- `.npy` bytes: the header is read here (never `np.load`, which allocates whatever shape the header declares
  before it reads a byte of data), and its dtype, shape, element count and byte count are checked against
  the model and the body; the array then aliases the decoded body, no second copy.
"""

from __future__ import annotations

import ast
import math
import struct
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

from handler.core.errors import InvalidInputError, ModelOutputError
from handler.core.types import JSON

if TYPE_CHECKING:  # types only: numpy.typing's import dedents docstrings with regexes, at init
    import numpy.typing as npt

NPY_MAGIC = b"\x93NUMPY"
MAX_NPY_HEADER = 10_000  # numpy's own limit for headers it parses without `allow_pickle`
_NPY_HEADER = {1: ("<H", "latin1"), 2: ("<I", "latin1"), 3: ("<I", "utf8")}  # major version → length, encoding
# Which JSON value kinds (numpy's guess) may go into a dtype kind: bools anywhere, integers into numbers,
# floats into floats only (a float into an integer dtype is refused rather than truncated).
_KIND_OK = {"f": ("f", "i", "u", "b"), "i": ("i", "u", "b"), "u": ("i", "u", "b"), "b": ("b",)}


def _refuse(name: str, message: str) -> InvalidInputError:
    return InvalidInputError(f"inputs.{name}: {message}")


def int_range(dtype: np.dtype[Any]) -> tuple[int, int]:
    """The integers `dtype` holds exactly: its whole range for integer dtypes, ±2**(mantissa bits) for floats."""
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return int(info.min), int(info.max)
    exact = 2 ** (np.finfo(dtype).nmant + 1)
    return -exact, exact


def from_list(name: str, value: JSON, dtype: np.dtype[Any], max_elements: int) -> npt.NDArray[Any]:
    try:
        array = np.asarray(value)
    except (ValueError, TypeError) as e:  # ragged nesting
        raise _refuse(name, f"not a rectangular nested list ({e})") from None
    if array.size > max_elements:
        raise _refuse(name, f"{array.size} elements; at most {max_elements} (WARMSTART_MAX_ELEMENTS)")
    if array.dtype.kind == "f" and array.size and bool((np.abs(array) >= 2.0**63).any()):
        # Integers past int64 beside a negative one come back as rounded float64s: look at what was sent.
        # (Only for such magnitudes: an ordinary float list is never walked in Python.)
        objects = np.asarray(value, dtype=object)
        if all(isinstance(x, int) for x in objects.flat):
            array = objects
    kind = array.dtype.kind
    if kind == "O":  # Python ints numpy cannot hold in 64 bits, maybe beside floats; or not numbers at all
        leaves = list(array.flat)
        if all(isinstance(x, int) for x in leaves):
            kind = "i"
        elif all(isinstance(x, int | float) for x in leaves):
            kind = "f"
    if array.size == 0 and kind == "f":  # `[]` (numpy calls it float64): empty in any dtype
        return array.astype(dtype)
    if kind not in _KIND_OK.get(dtype.kind, ()):
        raise _refuse(
            name,
            f"values of kind {array.dtype.name}, the model takes {dtype} "
            '(nested lists of numbers, or {"npy": base64})',
        )
    if kind == "b":
        return array.astype(dtype)
    if kind in "iu":
        lo, hi = _minmax(array)
        valid = int_range(dtype)
        if lo < valid[0] or hi > valid[1]:
            exact = " exactly" if dtype.kind == "f" else ""
            fits = f"integers in [{valid[0]}, {valid[1]}]"
            raise _refuse(name, f"values in [{_show(lo)}, {_show(hi)}] do not fit {dtype}{exact} ({fits})")
        return array.astype(dtype)
    try:
        floats = array.astype(np.float64)
    except OverflowError:  # a Python int past float64's range, beside floats
        lo, hi = _minmax(np.asarray([x for x in array.flat if isinstance(x, int)], dtype=object))
        raise _refuse(name, f"integers in [{_show(lo)}, {_show(hi)}] overflow {dtype}") from None
    with np.errstate(over="ignore"):  # overflow is checked just below, and refused with the values
        out = floats.astype(dtype)
    overflow = np.isinf(out) & np.isfinite(floats)
    if overflow.any():
        bad = floats[overflow]
        limit = float(np.finfo(dtype).max)
        raise _refuse(name, f"values in [{bad.min()}, {bad.max()}] overflow {dtype} (finite values in ±{limit:.8g})")
    return out


def _show(value: int) -> str:
    """An integer for a message: in full up to 20 digits, else its leading digits and exponent."""
    digits = str(abs(value))
    if len(digits) <= 20:
        return str(value)
    return f"{'-' if value < 0 else ''}{digits[0]}.{digits[1:4]}e+{len(digits) - 1}"


def _minmax(array: npt.NDArray[Any]) -> tuple[int, int]:
    if array.dtype.kind == "O":
        values = [int(x) for x in array.flat]
        return min(values), max(values)
    return int(array.min()), int(array.max())


def from_npy(name: str, raw: bytes, dtype: np.dtype[Any], max_elements: int) -> npt.NDArray[Any]:
    """A `.npy` body → an array over it; header, dtype, element count and size are checked first."""
    shape, fortran, offset = _npy_header(name, raw, dtype)
    count = math.prod(shape)
    if count > max_elements:
        raise _refuse(name, f"shape {list(shape)} is {count} elements; at most {max_elements} (WARMSTART_MAX_ELEMENTS)")
    sides = math.prod(d for d in shape if d)  # a 0 side makes no elements, yet numpy refuses the others' product
    if sides > max_elements:
        raise _refuse(name, f"shape {list(shape)}: its non-zero sides make {sides}; at most {max_elements}")
    need, have = count * dtype.itemsize, len(raw) - offset
    if need != have:
        raise _refuse(
            name, f"the .npy header declares shape {list(shape)} of {dtype} ({need} bytes); the body has {have}"
        )
    flat = np.frombuffer(raw, dtype=dtype, count=count, offset=offset)
    return flat.reshape(shape, order="F" if fortran else "C")


def _npy_header(name: str, raw: bytes, dtype: np.dtype[Any]) -> tuple[tuple[int, ...], bool, int]:
    """(shape, fortran_order, data offset), read by hand: `np.load` allocates the declared shape first, and
    numpy's header readers warn (an error under pytest) on some malformed headers."""
    if raw[:6] != NPY_MAGIC or len(raw) < 10 or raw[6] not in _NPY_HEADER:
        raise _refuse(name, "not a .npy array (no NPY magic string with a known version)")
    length_format, encoding = _NPY_HEADER[raw[6]]
    start = 8 + struct.calcsize(length_format)
    if len(raw) < start:
        raise _refuse(name, "not a .npy array (truncated header)")
    (length,) = struct.unpack_from(length_format, raw, 8)
    if length > MAX_NPY_HEADER or start + length > len(raw):
        raise _refuse(name, f"a .npy header of {length} bytes; at most {MAX_NPY_HEADER}, within the body")
    try:
        header = ast.literal_eval(raw[start : start + length].decode(encoding))
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError, UnicodeDecodeError):
        header = None
    if not isinstance(header, dict) or set(header) != {"descr", "fortran_order", "shape"}:
        raise _refuse(name, "not a .npy array (the header is not a dict of descr, fortran_order and shape)")
    shape, fortran, descr = header["shape"], header["fortran_order"], header["descr"]
    if not isinstance(shape, tuple) or not all(type(d) is int and d >= 0 for d in shape):
        raise _refuse(name, f"the .npy header's shape {shape!r} is not a tuple of non-negative integers")
    if not isinstance(fortran, bool):
        raise _refuse(name, f"the .npy header's fortran_order {fortran!r} is not true or false")
    if descr != np.lib.format.dtype_to_descr(dtype):
        raise _refuse(name, f"dtype {_dtype_name(descr)}, the model takes {dtype}")
    return shape, fortran, start + length


def _dtype_name(descr: Any) -> str:
    """`'<f8'` → `float64` for the message; what is no dtype string stays as it was sent."""
    try:
        with warnings.catch_warnings():  # numpy 2 warns on deprecated aliases ('a'): a name for a message only
            warnings.simplefilter("ignore")
            return str(np.dtype(descr)) if isinstance(descr, str) else repr(descr)
    except (TypeError, ValueError, SyntaxError):  # numpy parses comma strings with literal_eval: '01' is a SyntaxError
        return repr(descr)


def finite(array: npt.NDArray[Any], what: str, fix: str = "") -> npt.NDArray[Any]:
    """`array` as it is when every value is finite (an integer array always is), else `ModelOutputError`:
    an answer is JSON, which has no NaN or infinity (`handler.api.encode`). Measured 1.4 us for 1 x 384
    float32, 2.5 us for 32 x 384."""
    if array.dtype.kind not in "fc" or np.isfinite(array).all():
        return array
    bad = ~np.isfinite(array)
    first = np.unravel_index(int(bad.argmax()), array.shape)
    raise ModelOutputError(
        f"the model's {what}: {int(bad.sum())} of {array.size} values are NaN or infinite (the first at "
        f"{list(map(int, first))}: {array[first]}); a JSON answer cannot carry them{fix}"
    )
