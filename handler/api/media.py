"""Content-Type and Accept on the HTTP host: JSON everywhere, `application/x-npy` for tensors.

Negotiated from the headers alone, on the event loop, before a request is queued (a 415 or 406 costs no
worker); decoding and encoding run on the worker with the model.

- Request `Content-Type`: JSON (`application/json`, `*/*+json`, `text/plain`, or none) for every task;
  `application/x-npy` (one `.npy` array) for a `tensor` model with exactly one input.
- Response `Accept`: negotiated per route (RFC 9110's rules: the most specific range decides, q=0 refuses)
  among what the route answers: JSON everywhere (`application/json`, `*+json`, `application/*`, `*/*`, or
  no Accept); `application/x-npy` on the routes whose answer is an array (`/invocations`, `/v1/embeddings`,
  `/embed`, `/similarity`, `POST /`): a `tensor` model's one output, embeddings as float32 `[n, dim]`
  (`dimensions` applied), `/similarity`'s scores as float32 `[n]`. With `encoding_format: base64` (a JSON
  encoding) it is 406. Errors are always JSON, whatever was asked.
"""

from __future__ import annotations

import base64
import io
from typing import TYPE_CHECKING, Any, Literal

from handler.core.errors import RequestError

if TYPE_CHECKING:  # types only: numpy is imported where an .npy body is written (a genai start never)
    import numpy as np

Kind = Literal["json", "npy"]
JSON_TYPE = "application/json"
NPY_TYPE = "application/x-npy"
MEDIA_TYPES: dict[Kind, str] = {"json": JSON_TYPE, "npy": NPY_TYPE}


class UnsupportedMediaTypeError(RequestError):
    """The body's Content-Type is not one this model reads; the message lists what it reads."""

    status = 415


class NotAcceptableError(RequestError):
    """No media type in Accept is one this model can answer in; the message lists what it can."""

    status = 406


def _bare(media: str) -> str:
    return media.split(";", 1)[0].strip().lower()


def request_kind(content_type: str | None) -> Kind:
    media = _bare(content_type or "")
    if media in ("", JSON_TYPE, "text/plain") or media.endswith("+json"):
        return "json"
    if media == NPY_TYPE:
        return "npy"
    raise UnsupportedMediaTypeError(
        f"Content-Type {media!r} is not read here; send {JSON_TYPE} (any task) or {NPY_TYPE} (a tensor model)"
    )


def _q(params: list[str]) -> float:
    """A media range's weight: its `q` in [0, 1], 1 when absent, 0 (not acceptable) when malformed."""
    for param in params:
        key, _, value = param.partition("=")
        if key.strip().lower() == "q":
            try:
                q = float(value)
            except ValueError:
                return 0.0
            return q if 0.0 <= q <= 1.0 else 0.0  # NaN included
    return 1.0


def _matches(media: str, kind: Kind) -> int:
    """How specifically a media range names `kind`'s type (RFC 9110 12.5.1): 3 exact, 2 `type/*`, 1 `*/*`, 0 not."""
    if media == MEDIA_TYPES[kind] or (kind == "json" and media.endswith("+json")):
        return 3
    if media == "application/*":
        return 2
    return 1 if media == "*/*" else 0


def response_kind(accept: str | None, answers: tuple[Kind, ...] = ("json", "npy")) -> Kind:
    """The media kind to answer in, of those a route `answers` (in the order it prefers them): the one whose
    most specific matching range in Accept has the highest q (a range with q=0 refuses it), ties going to the
    range listed first, then to the route's order. No Accept, or nothing parseable in it: JSON."""
    ranges = []
    for i, part in enumerate((accept or "").split(",")):
        media, *params = (p.strip() for p in part.split(";"))
        if media:
            ranges.append((media.lower(), _q(params), i))
    if not ranges:
        return "json"
    best: tuple[float, int, int] | None = None
    chosen: Kind | None = None
    for order, kind in enumerate(answers):
        matched = [(_matches(media, kind), q, i) for media, q, i in ranges if _matches(media, kind)]
        if not matched:
            continue
        _, q, i = max(matched, key=lambda m: (m[0], m[1]))  # the most specific range decides
        if q > 0 and (best is None or (q, -i, -order) > best):
            best, chosen = (q, -i, -order), kind
    if chosen is None:
        names = " or ".join(MEDIA_TYPES[k] for k in answers)
        raise NotAcceptableError(f"Accept {accept!r}: this route answers {names}")
    return chosen


def npy_request(native: Any) -> Any:
    """The native request when the answer is to be .npy: a tensor request asks its task for .npy outputs; an
    embedding request asking for base64 is refused before the model runs (base64 is a JSON answer's encoding
    of the same float32 vectors .npy holds)."""
    if not isinstance(native, dict):
        return native
    if native.get("encoding_format") == "base64":
        raise NotAcceptableError(
            f'"encoding_format": "base64" encodes vectors in a {JSON_TYPE} answer; {NPY_TYPE} holds them as '
            f"float32 already: drop encoding_format, or accept {JSON_TYPE}"
        )
    if isinstance(native.get("inputs"), dict):
        return {**native, "output_format": "npy"}  # a tensor request: outputs come back as .npy
    return native


def npy_vectors(vectors: list[Any]) -> bytes:
    """Vectors (lists of floats) as one float32 `[n, dim]` array."""
    if any(isinstance(v, str) for v in vectors):  # `npy_request` refuses base64 first; never a 500 if it did not
        raise NotAcceptableError(f"base64 vectors are a {JSON_TYPE} answer: accept {JSON_TYPE}")
    import numpy as np  # deferred: see the TYPE_CHECKING import

    return dump_npy(np.asarray(vectors, dtype=np.float32))


def dump_npy(array: np.ndarray[Any, Any]) -> bytes:
    import numpy as np  # deferred: see the TYPE_CHECKING import

    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def npy_answer(body: dict[str, Any]) -> bytes:
    """A task's answer as one .npy array (a tensor task was asked for `output_format: npy`)."""
    if "embeddings" in body:
        return npy_vectors(body["embeddings"])
    if "outputs" in body:
        outputs = body["outputs"]
        if len(outputs) != 1:
            raise NotAcceptableError(
                f"{NPY_TYPE} holds one array; this model has outputs {sorted(outputs)}: accept {JSON_TYPE}"
            )
        (value,) = outputs.values()
        return base64.b64decode(value["npy"])
    raise NotAcceptableError(f"this model's answers are {JSON_TYPE} only ({NPY_TYPE}: tensor and embedding)")
