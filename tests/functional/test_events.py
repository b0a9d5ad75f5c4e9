"""Every event under tests/events/ through the runtime, in process, as `handler.app.lambda_handler` sees it."""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Callable
from typing import Any

import pytest

from handler.core.config import LAMBDA_PAYLOAD_LIMIT
from handler.core.errors import RequestError
from handler.runtime.invocation import Runtime
from tests.conftest import DIM, MODEL_KEY, event_names, invoke

HTTP_OK = [
    "apigw_v1.json",
    "http_api_v2.json",
    "function_url.json",
    "http_api_v2_base64.json",
    "alb.json",
    "alb_multivalue.json",
]
HTTP_BAD = {
    "bad_json_v2.json": (400, "InvalidJSONError"),
    "bad_utf8_base64_v2.json": (400, "InvalidEncodingError"),
    "bad_base64_v2.json": (400, "InvalidEncodingError"),
    "get_method_v2.json": (405, "MethodNotAllowedError"),
    "ping_over_http_v2.json": (400, "InvalidInputError"),
}
DIRECT_BAD = {
    "empty_inputs.json": "InvalidInputError",
    "wrong_types.json": "InvalidInputError",
    "missing_inputs.json": "InvalidInputError",
}
# OpenAI's route behind API Gateway on a named stage: HTTP API (payload 2.0 and 1.0) puts "/<stage>" in front
# of the path; a REST API's `path` never has it (stage "v1": the path's own "/v1" must stay).
STAGED = [
    "http_api_v2_named_stage.json",
    "http_api_v2_stage_v1.json",
    "http_api_v1_named_stage.json",
    "apigw_v1_stage_v1.json",
]
PINGS = ["warmer.json", "serverless_plugin_warmup.json", "eventbridge_scheduled.json"]
UNSUPPORTED = {
    "s3_put.json": "an S3 event",
    "sqs.json": "an SQS event",
    "sns.json": "an SNS event",
    "dynamodb_stream.json": "a DynamoDB stream event",
    "kinesis.json": "a Kinesis event",
    "cloudwatch_logs.json": "a CloudWatch Logs event",
    "vpc_lattice_v1.json": "a VPC Lattice event",
    "vpc_lattice_v2.json": "a VPC Lattice event",
    "eventbridge_custom.json": "an EventBridge event",
}
V2 = {"version": "2.0", "requestContext": {"http": {"method": "POST"}}}


def test_every_event_file_is_exercised() -> None:
    covered = {"direct.json", *HTTP_OK, *STAGED, *HTTP_BAD, *DIRECT_BAD, *PINGS, *UNSUPPORTED}
    assert set(event_names()) == covered


def assert_embeddings(body: dict[str, Any], count: int) -> list[list[float]]:
    assert body["model"] == MODEL_KEY
    vectors = body["embeddings"]
    assert len(vectors) == count
    for v in vectors:
        assert len(v) == DIM
        assert all(isinstance(x, float) for x in v)
        assert math.isclose(math.fsum(x * x for x in v), 1.0, abs_tol=1e-4)  # normalized
    return vectors  # type: ignore[no-any-return]


def assert_still_serves(runtime: Runtime) -> None:
    assert_embeddings(invoke(runtime, {"inputs": ["alive"]}, None), 1)


def http_body(response: dict[str, Any]) -> dict[str, Any]:
    assert isinstance(response["body"], str)
    return json.loads(response["body"])  # type: ignore[no-any-return]


def assert_http_shape(name: str, response: dict[str, Any], status: int) -> None:
    assert response["statusCode"] == status
    assert response["isBase64Encoded"] is False
    if name.startswith("alb"):
        assert response["statusDescription"].startswith(f"{status} ")
        assert len(response["statusDescription"]) > 4
    else:
        assert "statusDescription" not in response
    if name == "alb_multivalue.json":
        assert "headers" not in response
        assert response["multiValueHeaders"] == {"content-type": ["application/json"]}
    else:
        assert "multiValueHeaders" not in response
        assert response["headers"] == {"content-type": "application/json"}


# --- valid requests -------------------------------------------------------------------------------------


def test_direct_invoke(onnx_runtime: Runtime, load_event: Callable[[str], Any]) -> None:
    body = invoke(onnx_runtime, load_event("direct.json"), None)
    assert_embeddings(body, 2)
    assert body["usage"]["tokens"] > 2


@pytest.mark.parametrize("name", HTTP_OK)
def test_http_sources(name: str, onnx_runtime: Runtime, load_event: Callable[[str], Any]) -> None:
    response = invoke(onnx_runtime, load_event(name), None)
    assert_http_shape(name, response, 200)
    vectors = assert_embeddings(http_body(response), 2)
    # Same texts as direct.json: the body reached the model intact.
    direct = invoke(onnx_runtime, load_event("direct.json"), None)["embeddings"]
    assert vectors == direct


@pytest.mark.parametrize("name", STAGED)
def test_openai_route_on_a_named_stage(name: str, onnx_runtime: Runtime, load_event: Callable[[str], Any]) -> None:
    """Was 404 UnknownModelError: the stage prefix hid the route, and OpenAI's "model" was read as ours."""
    event = load_event(name)
    response = invoke(onnx_runtime, event, None)
    assert_http_shape(name, response, 200)
    body = http_body(response)
    assert body["object"] == "list" and body["model"] == MODEL_KEY, body
    direct = invoke(onnx_runtime, load_event("direct.json"), None)["embeddings"]  # the same two texts
    assert [d["embedding"] for d in body["data"]] == direct
    # The native route still answers on the same stage, at any other path.
    event["body"] = json.dumps({"inputs": ["x"]})
    for key in ("rawPath", "path"):
        if key in event:
            event[key] = event[key].replace("/v1/embeddings", "/embed")
    assert_embeddings(http_body(invoke(onnx_runtime, event, None)), 1)


def test_alb_status_description_is_ok(onnx_runtime: Runtime, load_event: Callable[[str], Any]) -> None:
    assert invoke(onnx_runtime, load_event("alb.json"), None)["statusDescription"] == "200 OK"


def test_a_single_string_is_one_input(onnx_runtime: Runtime) -> None:
    assert_embeddings(invoke(onnx_runtime, {"inputs": "just one"}, None), 1)


# --- bad requests ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(HTTP_BAD))
def test_bad_http_events(name: str, onnx_runtime: Runtime, load_event: Callable[[str], Any]) -> None:
    status, error_type = HTTP_BAD[name]
    response = invoke(onnx_runtime, load_event(name), None)
    assert_http_shape(name, response, status)
    error = http_body(response)["error"]
    assert error["type"] == error_type
    assert error["message"]
    assert_still_serves(onnx_runtime)


def test_ping_body_over_http_is_not_a_ping(onnx_runtime: Runtime, load_event: Callable[[str], Any]) -> None:
    body = http_body(invoke(onnx_runtime, load_event("ping_over_http_v2.json"), None))
    assert "warm" not in body
    assert '"inputs"' in body["error"]["message"]


@pytest.mark.parametrize("name", sorted(DIRECT_BAD))
def test_bad_direct_events_raise_typed_errors(
    name: str, onnx_runtime: Runtime, load_event: Callable[[str], Any]
) -> None:
    with pytest.raises(RequestError) as info:
        invoke(onnx_runtime, load_event(name), None)
    assert type(info.value).__name__ == DIRECT_BAD[name]
    assert str(info.value)
    assert_still_serves(onnx_runtime)


def test_wrong_type_message_names_the_input(onnx_runtime: Runtime, load_event: Callable[[str], Any]) -> None:
    with pytest.raises(RequestError, match=r"inputs\[1\] must be a string, got int"):
        invoke(onnx_runtime, load_event("wrong_types.json"), None)


@pytest.mark.parametrize("name", ["alb.json", "alb_multivalue.json", "apigw_v1.json"])
def test_bad_body_on_other_http_sources(name: str, onnx_runtime: Runtime, load_event: Callable[[str], Any]) -> None:
    event = load_event(name)
    event["body"] = "{not json"
    response = invoke(onnx_runtime, event, None)
    assert_http_shape(name, response, 400)
    assert http_body(response)["error"]["type"] == "InvalidJSONError"
    if name.startswith("alb"):
        assert response["statusDescription"] == "400 Bad Request"
    assert_still_serves(onnx_runtime)


@pytest.mark.parametrize("method", ["GET", "PUT", "delete"])
def test_v1_methods_other_than_post_are_405(
    method: str, onnx_runtime: Runtime, load_event: Callable[[str], Any]
) -> None:
    event = load_event("apigw_v1.json")
    event["httpMethod"] = method
    response = invoke(onnx_runtime, event, None)
    assert response["statusCode"] == 405
    assert method.upper() in http_body(response)["error"]["message"]


@pytest.mark.parametrize("body", [None, ""])
def test_missing_body_is_400(body: str | None, onnx_runtime: Runtime, load_event: Callable[[str], Any]) -> None:
    event = load_event("http_api_v2.json")
    event["body"] = body
    response = invoke(onnx_runtime, event, None)
    assert response["statusCode"] == 400
    assert http_body(response)["error"]["type"] == "InvalidJSONError"


@pytest.mark.parametrize("base64_encoded", [False, True])
def test_body_over_6mb_is_413(base64_encoded: bool, onnx_runtime: Runtime, load_event: Callable[[str], Any]) -> None:
    raw = json.dumps({"inputs": ["a" * (LAMBDA_PAYLOAD_LIMIT + 1)]})
    event = load_event("http_api_v2.json")
    event["body"] = base64.b64encode(raw.encode()).decode() if base64_encoded else raw
    event["isBase64Encoded"] = base64_encoded
    response = invoke(onnx_runtime, event, None)
    assert response["statusCode"] == 413
    assert http_body(response)["error"]["type"] == "PayloadTooLargeError"
    assert_still_serves(onnx_runtime)


def test_body_over_6mb_through_alb_is_413(onnx_runtime: Runtime, load_event: Callable[[str], Any]) -> None:
    event = load_event("alb.json")
    event["body"] = "[" + " " * LAMBDA_PAYLOAD_LIMIT + "]"
    response = invoke(onnx_runtime, event, None)
    assert response["statusCode"] == 413
    assert response["statusDescription"].startswith("413 ")


def test_deeply_nested_json_body_is_400_not_500(onnx_runtime: Runtime) -> None:
    response = invoke(onnx_runtime, {**V2, "body": "[" * 100_000}, None)
    assert response["statusCode"] == 400
    assert http_body(response)["error"]["type"] == "InvalidJSONError"
    assert_still_serves(onnx_runtime)


def test_lone_surrogate_input_is_an_encoding_error(onnx_runtime: Runtime) -> None:
    # JSON may carry "\ud800"; the decoded str then cannot become UTF-8 for the tokenizer.
    with pytest.raises(RequestError) as info:
        invoke(onnx_runtime, json.loads('{"inputs": ["ok", "bad \\ud800"]}'), None)
    assert type(info.value).__name__ == "InvalidEncodingError"
    assert "inputs[1]" in str(info.value)
    response = invoke(onnx_runtime, {**V2, "body": '{"inputs": ["\\udfff"]}'}, None)
    assert response["statusCode"] == 400
    assert http_body(response)["error"]["type"] == "InvalidEncodingError"
    assert_still_serves(onnx_runtime)


@pytest.mark.parametrize("request_context", [5, "x", ["elb"], None])
def test_odd_request_context_is_a_direct_invoke(request_context: Any, onnx_runtime: Runtime) -> None:
    with pytest.raises(RequestError) as info:
        invoke(onnx_runtime, {"version": "2.0", "httpMethod": "POST", "requestContext": request_context}, None)
    assert type(info.value).__name__ == "InvalidInputError"


# --- limits ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def limited(model_dir: Any) -> Runtime:
    """Limits set the way a deployment sets them: through the environment."""
    env = {
        "WARMSTART_MODEL": str(model_dir),
        "WARMSTART_BACKEND": "onnx",
        "WARMSTART_MAX_INPUTS": "3",
        "WARMSTART_MAX_CHARS": "10",
        "WARMSTART_WARMUP": "0",
    }
    return Runtime.start(environ=env, emit=None)


def test_limits_allow_up_to_the_boundary(limited: Runtime) -> None:
    assert_embeddings(invoke(limited, {"inputs": ["0123456789", "a", ""]}, None), 3)


@pytest.mark.parametrize(
    ("inputs", "error_type", "fragment"),
    [
        (["a", "b", "c", "d"], "TooManyInputsError", "WARMSTART_MAX_INPUTS"),
        (["ok", "01234567890"], "InputTooLongError", "inputs[1]"),
    ],
)
def test_limits_direct(inputs: list[str], error_type: str, fragment: str, limited: Runtime) -> None:
    with pytest.raises(RequestError) as info:
        invoke(limited, {"inputs": inputs}, None)
    assert type(info.value).__name__ == error_type
    assert fragment in str(info.value)
    assert_still_serves(limited)


def test_limits_over_http(limited: Runtime, load_event: Callable[[str], Any]) -> None:
    event = load_event("function_url.json")
    event["body"] = json.dumps({"inputs": ["x"] * 4})
    response = invoke(limited, event, None)
    assert response["statusCode"] == 400
    assert http_body(response)["error"]["type"] == "TooManyInputsError"
    event["body"] = json.dumps({"inputs": ["y" * 11]})
    assert http_body(invoke(limited, event, None))["error"]["type"] == "InputTooLongError"
    assert_still_serves(limited)


# --- raw bytes (awslambdaric passes bytes when the payload's content type is not JSON) ---------------------


@pytest.mark.parametrize("wrap", [bytes, bytearray])
def test_raw_json_bytes_work(wrap: type, onnx_runtime: Runtime) -> None:
    event = wrap(json.dumps({"inputs": ["héllo wörld"]}).encode())
    body = invoke(onnx_runtime, event, None)
    assert body["embeddings"] == invoke(onnx_runtime, {"inputs": ["héllo wörld"]}, None)["embeddings"]


@pytest.mark.parametrize(
    ("raw", "error_type"),
    [
        (b'{"inputs": ["caf\xe9"]}', "InvalidEncodingError"),
        (b"\xff\xfe\x00", "InvalidEncodingError"),
        (b'{"inputs": [', "InvalidJSONError"),
        (b"", "InvalidJSONError"),
        (b"[" * 100_000, "InvalidJSONError"),
        (b'"just a string"', "InvalidInputError"),
    ],
)
def test_bad_raw_bytes_raise_typed_errors(raw: bytes, error_type: str, onnx_runtime: Runtime) -> None:
    with pytest.raises(RequestError) as info:
        invoke(onnx_runtime, raw, None)
    assert type(info.value).__name__ == error_type
    assert_still_serves(onnx_runtime)


def test_raw_bytes_over_6mb(onnx_runtime: Runtime) -> None:
    with pytest.raises(RequestError) as info:
        invoke(onnx_runtime, b" " * (LAMBDA_PAYLOAD_LIMIT + 1), None)
    assert type(info.value).__name__ == "PayloadTooLargeError"


@pytest.mark.parametrize("name", sorted(UNSUPPORTED))
def test_events_from_triggers_we_do_not_serve_say_so(
    name: str, onnx_runtime: Runtime, load_event: Callable[[str], Any]
) -> None:
    """They used to get `InvalidInputError: request has no "inputs" field`; still raised (a trigger's retries
    and dead-letter queue see a failure), now typed and naming the trigger."""
    with pytest.raises(RequestError) as info:
        invoke(onnx_runtime, load_event(name), None)
    assert type(info.value).__name__ == "UnsupportedEventSourceError"
    assert str(info.value).startswith(f"{UNSUPPORTED[name]}")
    assert "warmstart serves direct invokes, API Gateway, Function URLs and ALB" in str(info.value)
    assert_still_serves(onnx_runtime)


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_nan_answer_is_a_500_on_every_way_out(new_runtime: Callable[..., Runtime], bad: float) -> None:
    """A model answering NaN or an infinity: no JSON carries it (never `NaN`, never a silent `null`). A direct
    invoke raises `ModelOutputError` (awslambdaric's errorType); an HTTP event and the HTTP host answer 500
    with the class in the message; the instance keeps serving."""
    from handler.core.errors import ModelOutputError

    rt = new_runtime()
    real = rt.backend.run
    broken = {"on": True}

    def run(feeds: Any) -> Any:
        out = real(feeds)
        if broken["on"]:
            for array in out.values():
                array[0, 3] = bad
        return out

    rt.backend.run = run  # type: ignore[method-assign]
    with pytest.raises(ModelOutputError, match=r"the model's vectors: 1 of 384 values are NaN or infinite"):
        rt.lambda_reply({"inputs": ["hello"]}, None)
    event = {**V2, "body": json.dumps({"inputs": ["hello"]})}
    response = invoke(rt, event)
    error = json.loads(response["body"])["error"]
    assert response["statusCode"] == 500 and error["type"] == "InternalError"
    assert error["message"].startswith("ModelOutputError: the model's vectors") and "[0, 3]" in error["message"]
    status, body, _ = rt.handle_http(json.dumps({"inputs": ["hello"]}).encode())
    assert status == 500 and json.loads(body)["error"]["message"].startswith("ModelOutputError:")
    json.loads(body, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))  # strict JSON, no NaN number
    assert b"null" not in body
    broken["on"] = False
    assert_embeddings(invoke(rt, {"inputs": ["still serving"]}), 1)
