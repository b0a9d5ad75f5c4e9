"""Arbitrary event shapes, bodies and encodings: every event gets a response or a typed error, and the
instance keeps serving afterwards."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from handler.api.sources import infer_source
from handler.core.errors import RequestError
from handler.runtime.invocation import Runtime
from tests.conftest import DIM, invoke, start

MAX_INPUTS, MAX_CHARS = 4, 64
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

KEYS = st.sampled_from(
    [
        "inputs",
        "warmer",
        "source",
        "hold_ms",
        "correlation_id",
        "detail-type",
        "version",
        "requestContext",
        "httpMethod",
        "body",
        "isBase64Encoded",
        "multiValueHeaders",
        "output_format",
    ]
) | st.text(max_size=8)

# Lone surrogates included, often: JSON escapes such as "\ud800" decode to them.
SURROGATE_TEXT = st.tuples(st.text(max_size=8), st.characters(categories=["Cs"]), st.text(max_size=8)).map("".join)
ANY_TEXT = st.text(max_size=MAX_CHARS + 8) | SURROGATE_TEXT

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=16),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(KEYS, children, max_size=4),
    max_leaves=12,
)

inputs = st.one_of(
    st.lists(ANY_TEXT, min_size=0, max_size=MAX_INPUTS + 2),
    st.lists(st.text(max_size=40), min_size=1, max_size=MAX_INPUTS),  # mostly valid
    ANY_TEXT,
    json_values,
)

payloads = st.one_of(
    st.fixed_dictionaries({"inputs": inputs}, optional={"extra": json_values}),
    st.fixed_dictionaries(
        {"warmer": st.sampled_from([True, "yes", 1, False])},
        optional={
            "hold_ms": st.one_of(st.integers(-5, 10**9), st.floats(), json_values),
            "correlation_id": json_values,
        },
    ),
    st.fixed_dictionaries({"source": st.sampled_from(["serverless-plugin-warmup", "aws.events", "x"])}),
    st.fixed_dictionaries({"source": st.just("aws.events"), "detail-type": st.just("Scheduled Event")}),
    json_values,
)


def dumps(value: Any) -> str:
    return json.dumps(value)  # ensure_ascii: lone surrogates travel as escapes, like a real client's


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


bodies = st.one_of(
    st.tuples(payloads.map(dumps), st.just(False)),
    st.tuples(payloads.map(lambda p: b64(dumps(p).encode())), st.just(True)),
    st.tuples(st.binary(max_size=64).map(b64), st.just(True)),  # random bytes, often not UTF-8
    st.tuples(st.text(max_size=24), st.booleans()),  # random text, often not JSON and not base64
    st.tuples(st.integers(1, 100_000).map(lambda n: "[" * n), st.just(False)),  # nested past any recursion limit
    st.tuples(json_values, st.one_of(st.booleans(), json_values)),  # body of any type, flag of any type
)
methods = st.sampled_from(["POST", "post", "GET", "PUT", "DELETE", "OPTIONS"]) | json_values


@st.composite
def http_events(draw: st.DrawFn) -> dict[str, Any]:
    body, encoded = draw(bodies)
    kind = draw(st.sampled_from(["v2", "v1", "alb", "alb-multi"]))
    if kind == "v2":
        event: dict[str, Any] = {"version": "2.0", "requestContext": {"http": {"method": draw(methods)}}}
    elif kind == "v1":
        context = draw(st.dictionaries(st.sampled_from(["stage", "requestId", "http"]), json_values, max_size=2))
        event = {"httpMethod": draw(methods), "requestContext": context}
    else:
        event = {"httpMethod": draw(methods), "requestContext": {"elb": {"targetGroupArn": "arn:aws:..."}}}
        if kind == "alb-multi":
            event["multiValueHeaders"] = {"content-type": ["application/json"]}
    if draw(st.booleans()):
        event["body"] = body
    if draw(st.booleans()):
        event["isBase64Encoded"] = encoded
    event.update(draw(st.dictionaries(st.sampled_from(["headers", "rawPath", "cookies"]), json_values, max_size=2)))
    return event


@pytest.fixture(scope="module")
def runtime(model_dir: Path) -> Runtime:
    return start(model_dir, "onnx", warmup=False, max_inputs=MAX_INPUTS, max_chars=MAX_CHARS, max_hold_ms=2, threads=1)


def check_embeddings(body: dict[str, Any]) -> None:
    assert len(body["embeddings"])
    assert all(len(v) == DIM for v in body["embeddings"])


def still_serves(runtime: Runtime) -> None:
    check_embeddings(invoke(runtime, {"inputs": ["still serving"]}))


def check_http(runtime: Runtime, event: dict[str, Any]) -> None:
    response = runtime.handle(event, None)
    assert response["statusCode"] in {200, 400, 405, 413}
    body = json.loads(response["body"])
    if response["statusCode"] == 200:
        check_embeddings(body)
    else:
        assert isinstance(body["error"]["type"], str)
        assert body["error"]["type"].endswith("Error")
        assert body["error"]["message"]


def check_direct(runtime: Runtime, event: Any) -> None:
    try:
        result = invoke(runtime, event)  # the JSON bytes awslambdaric posts, as a client reads them
    except RequestError as e:
        assert str(e)
        return
    if result.get("warm") is True:
        assert result["held_ms"] <= 2
    else:
        check_embeddings(result)


def check_any(runtime: Runtime, event: Any) -> None:
    if infer_source(event).http:
        check_http(runtime, event)
    else:
        check_direct(runtime, event)
    still_serves(runtime)


@SETTINGS
@given(event=http_events())
def test_http_shaped_events(runtime: Runtime, event: dict[str, Any]) -> None:
    assert infer_source(event).http
    check_any(runtime, event)


@SETTINGS
@given(event=payloads)
@example(event={"warmer": True, "hold_ms": 0, "correlation_id": -9223372036854775809})  # once failed: orjson's 64 bits
def test_direct_payloads(runtime: Runtime, event: Any) -> None:
    check_any(runtime, event)


@SETTINGS
@given(
    event=st.one_of(
        st.binary(max_size=64),
        payloads.map(lambda p: dumps(p).encode()),
        st.builds(bytearray, st.binary(max_size=32)),
    )
)
def test_raw_bytes_events(runtime: Runtime, event: bytes | bytearray) -> None:
    check_direct(runtime, event)
    still_serves(runtime)


@SETTINGS
@given(event=st.dictionaries(KEYS, json_values, max_size=6) | json_values)
def test_arbitrary_json_events(runtime: Runtime, event: Any) -> None:
    check_any(runtime, event)
