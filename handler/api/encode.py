"""The one JSON encoder at the edge: an answer (dicts, lists, numpy arrays and scalars) → UTF-8 JSON bytes.

Tasks hand their float32 outputs over as numpy arrays; this is the only place they become text, once, for
every way out: the HTTP host's bodies, a Lambda HTTP event's `body` string and its envelope, a direct
invoke's answer (handed to awslambdaric as bytes, which it posts as they are: `Runtime.lambda_reply`).
orjson writes each float32 as its shortest round-tripping decimal (`0.039299347`, not float64's
`0.03929934650659561`), and parsing that text back gives the same float32 (tests/unit/test_encode.py).
Measured against the vectorized shortest-float code it replaced + `json.dumps` (awslambdaric's simplejson
on Lambda): 1x384 0.007 ms against 0.139, 32x384 0.21 against 4.7 (5.3), 256x384 2.2 against 35 (37).

orjson writes NaN and infinities as `null` (valid JSON, but a silent hole in a vector): tasks refuse such
outputs before they get here (`handler.tasks.arrays.finite`: a 500 `ModelOutputError`), so a `null` in an
answer is never a float.

A lean start (`handler.core.numpy_gate`) answers before numpy is imported: its vectors are a
`handler.core.f32.F32Rows`, written by `f32` with the same bytes, and while numpy is not in `sys.modules` orjson
runs without its numpy option (with it, meeting a type it does not know, orjson imports numpy to check it).

orjson is imported by the first call, not with this module: a Lambda init that encodes nothing (on demand,
no warm-up) does not pay its ~0.6 ms of import; an init that warms up calls `load()`, so neither does the
first request there (SnapStart, provisioned concurrency, the HTTP host).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from handler.core.f32 import F32Rows

_encode: Callable[[Any], bytes] | None = None


def _default(obj: Any) -> Any:
    """What orjson does not take as it is: a numpy array that is not C-contiguous (a transposed or strided
    view) is copied contiguous; one of a dtype orjson does not write (strings, objects) and another numpy
    scalar (np.str_ ...) become Python values. A lean answer's `F32Rows` is written by `handler.core.f32`."""
    if isinstance(obj, F32Rows):
        import orjson  # imported by load() already

        return orjson.Fragment(obj.json())
    import numpy as np

    if isinstance(obj, np.ndarray):
        return obj.tolist() if obj.flags.c_contiguous else np.ascontiguousarray(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


_INT_RANGE = range(-(2**63), 2**64)  # what orjson writes as an integer
_DEPTH = 128  # below orjson's limit of 254 levels; deeper values are written as fragments of their own


def _fit(obj: Any, depth: int, fragment: Callable[[bytes], Any], encode: Callable[[Any], bytes]) -> Any:
    """`obj` with each integer orjson cannot write as its decimal text, and each container nested past
    `_DEPTH` written on its own (its own depth starts again): both as orjson fragments, pasted as they are."""
    if isinstance(obj, int) and not isinstance(obj, bool) and obj not in _INT_RANGE:
        return fragment(str(obj).encode())
    if isinstance(obj, dict | list | tuple):
        if depth >= _DEPTH:
            return fragment(encode(obj))
        if isinstance(obj, dict):
            return {k: _fit(v, depth + 1, fragment, encode) for k, v in obj.items()}
        return [_fit(v, depth + 1, fragment, encode) for v in obj]
    return obj


def load() -> Callable[[Any], bytes]:
    """The encoder, orjson imported (once)."""
    global _encode
    if _encode is None:
        import orjson  # deferred: see the module's docstring

        plain = orjson.OPT_NON_STR_KEYS  # int keys as strings, as json.dumps does
        arrays = orjson.OPT_SERIALIZE_NUMPY | plain
        dumps_, modules = orjson.dumps, sys.modules

        def encode(obj: Any) -> bytes:
            # No numpy imported, no numpy values: the option would only make orjson import numpy (module's doc).
            option = arrays if "numpy" in modules else plain
            try:
                return dumps_(obj, default=_default, option=option)
            except orjson.JSONEncodeError:
                # Valid JSON values orjson will not write, echoed from a caller (a ping's correlation_id): an
                # integer past 64 bits, nesting past its depth of 254. Rare, so only then a second pass.
                return dumps_(_fit(obj, 0, orjson.Fragment, encode), default=_default, option=option)

        _encode = encode
    return _encode


def dumps(obj: Any) -> bytes:
    """`obj` as compact UTF-8 JSON bytes: numpy arrays and scalars as JSON numbers (float32 at its shortest),
    text as UTF-8 (not \\u escapes)."""
    return (_encode or load())(obj)
