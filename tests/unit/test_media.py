"""Content-Type and Accept negotiation (header-only) and the .npy answers."""

from __future__ import annotations

import io

import numpy as np
import pytest

from handler.api.media import (
    NotAcceptableError,
    UnsupportedMediaTypeError,
    npy_answer,
    request_kind,
    response_kind,
)


@pytest.mark.parametrize(
    ("content_type", "kind"),
    [
        (None, "json"),
        ("application/json", "json"),
        ("application/json; charset=utf-8", "json"),
        ("application/vnd.api+json", "json"),
        ("text/plain", "json"),
        ("application/x-npy", "npy"),
        ("Application/X-NPY", "npy"),
    ],
)
def test_request_kind(content_type: str | None, kind: str) -> None:
    assert request_kind(content_type) == kind


@pytest.mark.parametrize("content_type", ["text/csv", "application/x-www-form-urlencoded", "image/png"])
def test_unsupported_content_type_is_415_naming_what_is_read(content_type: str) -> None:
    with pytest.raises(UnsupportedMediaTypeError, match="application/json") as info:
        request_kind(content_type)
    assert info.value.status == 415


@pytest.mark.parametrize(
    ("accept", "kind"),
    [
        (None, "json"),
        ("", "json"),
        ("*/*", "json"),
        ("application/x-npy", "npy"),
        ("text/csv, application/x-npy", "npy"),
        ("application/json;q=0.5, application/x-npy", "npy"),
        ("application/x-npy;q=0, application/json", "json"),
        ("text/html, */*;q=0.1", "json"),
    ],
)
def test_response_kind(accept: str | None, kind: str) -> None:
    assert response_kind(accept) == kind


def test_nothing_acceptable_is_406() -> None:
    with pytest.raises(NotAcceptableError) as info:
        response_kind("text/csv")
    assert info.value.status == 406


def test_npy_answers() -> None:
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    answer = npy_answer({"embeddings": array.tolist()})
    loaded = np.load(io.BytesIO(answer))
    assert loaded.dtype == np.float32 and np.array_equal(loaded, array)
    with pytest.raises(NotAcceptableError, match="one array"):
        npy_answer({"outputs": {"a": {"npy": ""}, "b": {"npy": ""}}})
    with pytest.raises(NotAcceptableError):
        npy_answer({"results": []})
