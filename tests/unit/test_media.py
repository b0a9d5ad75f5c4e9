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


@pytest.mark.parametrize(
    ("accept", "answers", "kind"),
    [
        ("application/x-npy, application/json;q=0.5", ("json",), "json"),  # a JSON-only route falls back
        ("*/*", ("json", "npy"), "json"),  # a tie goes to the route's first
        ("application/x-npy, application/json", ("json", "npy"), "npy"),  # then to the range listed first
        ("*/*, application/json;q=0", ("json", "npy"), "npy"),  # the most specific range decides
        ("application/*;q=0.2, application/x-npy;q=0.9", ("json", "npy"), "npy"),
        ("application/json;q=nan, application/x-npy;q=0.1", ("json", "npy"), "npy"),  # a bad q refuses
    ],
)
def test_response_kind_among_a_routes_answers(accept: str, answers: tuple[str, ...], kind: str) -> None:
    assert response_kind(accept, answers) == kind  # type: ignore[arg-type]


@pytest.mark.parametrize("accept", ["application/json;q=0", "application/x-npy", "*/*;q=0"])
def test_refused_json_is_406_naming_what_the_route_answers(accept: str) -> None:
    """`q=0` refuses a type (RFC 9110): `application/json;q=0` was answered JSON."""
    with pytest.raises(NotAcceptableError, match=r"this route answers application/json$"):
        response_kind(accept, ("json",))


def test_a_q_over_1_is_malformed_not_a_preference() -> None:
    """Found by the media fuzzer: `application/x-npy;q=2` was read as weight 2 and answered .npy; q is at most 1
    (RFC 9110), so the range is malformed and refuses, like `q=abc`."""
    with pytest.raises(NotAcceptableError):
        response_kind("application/json;q=abc, application/x-npy;q=2", ("json", "npy"))
    assert response_kind("application/x-npy;q=2, application/json;q=0.1", ("json", "npy")) == "json"


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
