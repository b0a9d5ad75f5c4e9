"""Event source detection and body decoding."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from handler.api.sources import Direct, decode_body, infer_source, unsupported_source
from handler.core.config import LAMBDA_PAYLOAD_LIMIT
from handler.core.errors import (
    InvalidEncodingError,
    InvalidJSONError,
    PayloadTooLargeError,
    UnsupportedEventSourceError,
)
from tests.conftest import event_names

EXPECTED = {
    "apigw_v1.json": "api-gateway-v1",
    "http_api_v2.json": "http-api-v2",
    "http_api_v2_base64.json": "http-api-v2",
    "function_url.json": "http-api-v2",
    "bad_json_v2.json": "http-api-v2",
    "bad_utf8_base64_v2.json": "http-api-v2",
    "bad_base64_v2.json": "http-api-v2",
    "get_method_v2.json": "http-api-v2",
    "ping_over_http_v2.json": "http-api-v2",
    "alb.json": "alb",
    "alb_multivalue.json": "alb",
    "http_api_v2_named_stage.json": "http-api-v2",
    "http_api_v2_stage_v1.json": "http-api-v2",
    "http_api_v1_named_stage.json": "api-gateway-v1",
    "apigw_v1_stage_v1.json": "api-gateway-v1",
}
UNSUPPORTED = {
    "s3_put.json": "an S3 event",
    "sqs.json": "an SQS event",
    "sns.json": "an SNS event",
    "dynamodb_stream.json": "a DynamoDB stream event",
    "kinesis.json": "a Kinesis event",
    "cloudwatch_logs.json": "a CloudWatch Logs event",
    "vpc_lattice_v1.json": "a VPC Lattice event",
    "vpc_lattice_v2.json": "a VPC Lattice event",
    "eventbridge_custom.json": "an EventBridge event ('Document Uploaded' from 'com.example.docs')",
}


@pytest.mark.parametrize("name", event_names())
def test_each_event_file_gets_its_source(name: str, load_event: Callable[[str], Any]) -> None:
    source = infer_source(load_event(name))
    assert source.name == EXPECTED.get(name, "unsupported" if name in UNSUPPORTED else "direct")
    assert source.http is (name in EXPECTED)


@pytest.mark.parametrize("name", sorted(UNSUPPORTED))
def test_triggers_we_do_not_serve_are_named_by_their_shape(name: str, load_event: Callable[[str], Any]) -> None:
    event = load_event(name)
    assert unsupported_source(event) == UNSUPPORTED[name]
    with pytest.raises(UnsupportedEventSourceError) as info:
        infer_source(event).payload(event)
    assert str(info.value) == (
        f"{UNSUPPORTED[name]}: warmstart serves direct invokes, API Gateway, Function URLs and ALB; "
        'send {"inputs": [...]}'
    )
    assert info.value.status == 400
    event["inputs"] = ["text"]  # a direct invoke may carry any other keys: "inputs" makes it a request
    assert isinstance(infer_source(event), Direct)


@pytest.mark.parametrize(
    ("event", "named"),
    [
        ({"Records": [{"eventSource": "aws:kafka"}]}, "an MSK (Kafka) event"),
        ({"eventSource": "aws:kafka", "records": {}}, "an MSK (Kafka) event"),
        ({"eventSource": "aws:rmq", "rmqMessagesByQueue": {}}, "an Amazon MQ (RabbitMQ) event"),
        ({"Records": [{"eventSource": "aws:codecommit"}]}, "an aws:codecommit event"),
        ({"Records": [{}]}, None),
        ({"Records": "x"}, None),
        ({"awslogs": "x"}, None),
        ({"detail-type": "Scheduled Event", "source": "aws.events", "detail": {}}, None),  # a warm ping
        ({"method": "POST"}, None),
    ],
)
def test_other_trigger_shapes(event: dict[str, Any], named: str | None) -> None:
    assert unsupported_source(event) == named


@pytest.mark.parametrize(
    "event",
    [
        None,
        [],
        "text",
        42,
        b'{"inputs": []}',
        {},
        {"version": "2.0"},
        {"version": "2.0", "requestContext": {"http": "POST"}},
        {"version": "1.0", "requestContext": {"http": {"method": "POST"}}},
        {"httpMethod": "POST"},
        {"httpMethod": "POST", "requestContext": "x"},
        {"requestContext": {"elb": "arn"}},
        {"requestContext": 7},
    ],
)
def test_direct_is_the_catch_all(event: Any) -> None:
    assert isinstance(infer_source(event), Direct)


def test_alb_wins_over_v1_although_it_has_http_method(load_event: Callable[[str], Any]) -> None:
    event = load_event("alb.json")
    assert "httpMethod" in event
    assert infer_source(event).name == "alb"


def test_http_api_v1_payload_format_is_v1(load_event: Callable[[str], Any]) -> None:
    event = load_event("apigw_v1.json")
    event["version"] = "1.0"  # HTTP APIs with payload format 1.0 send the REST shape plus a version
    assert infer_source(event).name == "api-gateway-v1"


def v2(raw_path: str, stage: Any) -> dict[str, Any]:
    return {"version": "2.0", "rawPath": raw_path, "requestContext": {"http": {"method": "POST"}, "stage": stage}}


def v1(path: str, stage: Any, version: str | None) -> dict[str, Any]:
    event = {"httpMethod": "POST", "path": path, "requestContext": {"stage": stage, "path": f"/{stage}{path}"}}
    return event if version is None else {"version": version, **event}


@pytest.mark.parametrize(
    ("event", "path"),
    [
        (v2("/prod/v1/embeddings", "prod"), "/v1/embeddings"),
        (v2("/prod", "prod"), "/"),
        (v2("/v1/v1/embeddings", "v1"), "/v1/embeddings"),  # the stage once, the path's own /v1 stays
        (v2("/production/v1/embeddings", "prod"), "/production/v1/embeddings"),  # a whole segment only
        (v2("/prodv1/embeddings", "prod"), "/prodv1/embeddings"),
        (v2("/v1/embeddings", "$default"), "/v1/embeddings"),  # $default: served at the root
        (v2("/v1/embeddings", None), "/v1/embeddings"),
        (v2("/v1/embeddings", ["v1"]), "/v1/embeddings"),  # an odd stage value changes nothing
        (v1("/prod/v1/embeddings", "prod", "1.0"), "/v1/embeddings"),  # HTTP API, payload format 1.0
        (v1("/v1/embeddings", "v1", None), "/v1/embeddings"),  # REST API: `path` never holds the stage
        (v1("/prod/v1/embeddings", "prod", None), "/prod/v1/embeddings"),  # so a REST path is taken as it is
    ],
)
def test_the_stage_prefix_is_stripped_where_api_gateway_adds_it(event: dict[str, Any], path: str) -> None:
    source = infer_source(event)
    assert source.http and source.path(event) == path  # type: ignore[attr-defined]


def test_decode_body() -> None:
    assert decode_body('{"inputs": ["é"]}'.encode()) == {"inputs": ["é"]}
    with pytest.raises(InvalidEncodingError, match="not valid UTF-8"):
        decode_body(b'{"inputs": ["\xc3"]}')
    with pytest.raises(InvalidJSONError, match="not valid JSON"):
        decode_body(b"{inputs}")
    with pytest.raises(InvalidJSONError, match="nested too deeply"):
        decode_body(b"[" * 50_000)
    with pytest.raises(PayloadTooLargeError):
        decode_body(b" " * (LAMBDA_PAYLOAD_LIMIT + 1))
    assert decode_body(b" " * (LAMBDA_PAYLOAD_LIMIT - 2) + b"{}") == {}  # exactly at the limit is fine
