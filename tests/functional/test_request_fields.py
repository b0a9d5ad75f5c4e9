"""Request fields of the wrong JSON type, through the real runtime by every way in (a direct invoke, Lambda
HTTP events on the native and compatible paths, the HTTP host's body path): a typed 4xx naming what is
valid, never a 500 or a raw Python error, and the instance keeps serving. (The property test in
tests/test_property_fields.py covers every field; these are the faults found by hand, issue 24.)"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from handler.api.compat import ROUTES
from handler.core.errors import InvalidInputError
from handler.runtime.invocation import Runtime
from tests.conftest import DIM, http_v2_event


@pytest.fixture(scope="module")
def runtime(new_runtime: Callable[..., Runtime]) -> Runtime:
    return new_runtime()


def assert_refused(runtime: Runtime, path: str, body: dict[str, Any], fragment: str) -> None:
    """`body` is refused with InvalidInputError (message holding `fragment`) by every way in, no fault counted."""
    failed = runtime.counted().get("failed", 0)
    if path in ("/invocations", "/embed"):  # a direct invoke reads the native request
        with pytest.raises(InvalidInputError, match=fragment):
            runtime.handle(body, None)
    response = runtime.handle(http_v2_event(path, body), None)
    error = json.loads(response["body"])["error"]
    assert (response["statusCode"], error["type"]) == (400, "InvalidInputError"), error
    assert fragment in error["message"]
    status, raw, _ = runtime.handle_http(json.dumps(body).encode(), ROUTES[path])
    error = json.loads(raw)["error"]
    assert (status, error["type"]) == (400, "InvalidInputError") and fragment in error["message"], error
    assert runtime.counted().get("failed", 0) == failed  # rejected, not a fault
    assert len(runtime.handle({"inputs": ["still serving"]}, None)["embeddings"][0]) == DIM


@pytest.mark.parametrize("name", [["query"], {"query": "q: "}, 7])
@pytest.mark.parametrize("path", ["/invocations", "/embed"])
def test_prompt_name_of_another_type(runtime: Runtime, path: str, name: Any) -> None:
    """Was a 500 `InternalError` ("TypeError: unhashable type"), and errorType TypeError on a direct invoke."""
    assert_refused(runtime, path, {"inputs": ["x"], "prompt_name": name}, '"prompt_name" must be a string')


@pytest.mark.parametrize("value", [{}, [], "", 0, False])
def test_encoding_format_of_another_type(runtime: Runtime, value: Any) -> None:
    """Was read as "float" (a falsy value); now refused, listing the valid choices."""
    assert_refused(runtime, "/invocations", {"inputs": ["x"], "encoding_format": value}, "valid: float, base64")
    assert_refused(runtime, "/v1/embeddings", {"input": ["x"], "encoding_format": value}, "valid: float, base64")
