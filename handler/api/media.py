"""Content-Type and Accept on the HTTP host: JSON everywhere, `application/x-npy` for tensors.

Negotiated from the headers alone, on the event loop, before a request is queued (a 415 or 406 costs no
worker); decoding and encoding run on the worker with the model.

- Request `Content-Type`: JSON (`application/json`, `*/*+json`, `text/plain`, or none) for every task;
  `application/x-npy` (one `.npy` array) for a `tensor` model with exactly one input.
- Response `Accept`: JSON (`application/json`, `application/*`, `*/*`, or none); `application/x-npy` for a
  `tensor` model with exactly one output (the output itself) and for `embedding` (float32 `[n, dim]`).
  Errors are always JSON, whatever was asked.
"""

from __future__ import annotations

import base64
import io
from typing import Any, Literal

import numpy as np

from handler.core.errors import RequestError

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


def response_kind(accept: str | None) -> Kind:
    """The first media range (highest q first, then in order) that we can produce."""
    ranges: list[tuple[float, int, str]] = []
    for i, part in enumerate((accept or "").split(",")):
        media, *params = (p.strip() for p in part.split(";"))
        q = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        if media and q > 0:
            ranges.append((-q, i, media.lower()))
    if not ranges:
        return "json"
    for _, _, media in sorted(ranges):
        if media in (JSON_TYPE, "application/*", "*/*") or media.endswith("+json"):
            return "json"
        if media == NPY_TYPE:
            return "npy"
    raise NotAcceptableError(f"Accept {accept!r}: answers are {JSON_TYPE}, or {NPY_TYPE} for tensor and embedding")


def dump_npy(array: np.ndarray[Any, Any]) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def npy_answer(body: dict[str, Any]) -> bytes:
    """A task's answer as one .npy array (a tensor task was asked for `output_format: npy`)."""
    if "embeddings" in body:
        return dump_npy(np.asarray(body["embeddings"], dtype=np.float32))
    if "outputs" in body:
        outputs = body["outputs"]
        if len(outputs) != 1:
            raise NotAcceptableError(
                f"{NPY_TYPE} holds one array; this model has outputs {sorted(outputs)}: accept {JSON_TYPE}"
            )
        (value,) = outputs.values()
        return base64.b64decode(value["npy"])
    raise NotAcceptableError(f"this model's answers are {JSON_TYPE} only ({NPY_TYPE}: tensor and embedding)")
