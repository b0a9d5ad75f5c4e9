"""Fuzzing the HTTP host's routes in process (starlette TestClient, hypothesis): random methods, real paths,
random content-type / accept / content-length headers, random JSON (wrong types, nesting, huge numbers,
unicode, lists and objects where strings go) and raw bytes. Every answer is JSON, typed when not 2xx, never
a 500, and the host still answers /ping."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from handler.api import compat
from handler.http_host.host import Host
from handler.http_host.routes import ALL_METHODS, create_app
from handler.runtime.invocation import Runtime
from handler.runtime.workers import Sizing, WorkerPool

PATHS = [*compat.ROUTES, "/ping", "/healthz", "/health", "/info", "/status", "/metrics", "/nope", "/invocations/x"]
FIELDS = ["prompt_name", "encoding_format", "dimensions", "model", "inputs", "input", "query", "texts", "documents"]
FIELDS += ["top_n", "return_documents", "return_text", "normalize", "truncate", "raw_scores", "warmstart"]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.sampled_from(["float", "base64", "query", "text-embedding-3-small", "all-minilm-l6-v2", "", "Left"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)
# A body every route would take, with one field swapped for a list or an object (where a string goes).
VALID = {"inputs": ["x"], "input": "x", "query": "q", "texts": ["a", "b"], "documents": ["d"]}
swapped = st.builds(
    lambda key, value: {**VALID, key: value},
    st.sampled_from(FIELDS),
    st.lists(scalars, max_size=2) | st.dictionaries(st.text(max_size=4), scalars, max_size=2),
)
bodies = st.one_of(
    swapped,
    st.dictionaries(st.sampled_from(FIELDS), values, max_size=5),
    st.fixed_dictionaries(
        {"inputs": st.lists(st.text(max_size=30), min_size=1, max_size=3)},
        optional={k: values for k in FIELDS if k != "inputs"},
    ),
    values,
)
headers = st.fixed_dictionaries(
    {},
    optional={
        "content-type": st.sampled_from(
            [
                "application/json",
                "text/plain",
                "application/x-npy",
                "image/png",
                "*/*",
                "application/json; charset=latin-1",
                "",
            ]
        ),
        "accept": st.sampled_from(["application/json", "application/x-npy", "text/html", "*/*", "image/*;q=0", ""]),
    },
)


@pytest.fixture(scope="module")
def client(new_runtime: Callable[..., Runtime]) -> Iterator[TestClient]:
    runtime = new_runtime()
    workers = WorkerPool(Sizing(min_workers=1, max_workers=2, max_queue=8), cpus=2)
    with TestClient(create_app(Host(lambda: runtime, workers)), raise_server_exceptions=False) as c:
        yield c


def check(client: TestClient, method: str, path: str, content: bytes, hdrs: dict[str, str], body: Any) -> None:
    r = client.request(method, path, content=content, headers=hdrs)
    if path == "/metrics" and r.status_code == 200:
        return  # Prometheus' text format, by design
    if r.headers.get("content-type") == "application/x-npy":
        assert r.status_code == 200
        return
    assert r.headers.get("content-type", "").startswith("application/json"), (r.status_code, r.text[:200])
    parsed = r.json() if method != "HEAD" else {"error": {"type": "", "message": ""}}  # HEAD: no body, by HTTP
    assert r.status_code != 500, (method, path, hdrs, body, parsed)
    if r.status_code >= 300:
        assert isinstance(parsed["error"]["type"], str) and isinstance(parsed["error"]["message"], str), parsed


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    method=st.sampled_from(ALL_METHODS),
    path=st.sampled_from(PATHS),
    hdrs=headers,
    body=bodies,
    raw=st.none() | st.binary(max_size=64),
)
def test_every_answer_is_json_never_500(
    client: TestClient, method: str, path: str, hdrs: dict[str, str], body: Any, raw: bytes | None
) -> None:
    content = raw if raw is not None else json.dumps(body).encode()
    check(client, method, path, content, hdrs, body if raw is None else None)
    assert client.get("/ping").status_code == 200


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    path=st.sampled_from(list(compat.ROUTES)),
    body=bodies,
    length=st.sampled_from(["0", "1", "-1", "abc", "99999999999"]),
)
def test_content_length_lies_are_json(client: TestClient, path: str, body: Any, length: str) -> None:
    content = json.dumps(body).encode()
    r = client.post(path, content=content, headers={"content-type": "application/json", "content-length": length})
    assert r.headers.get("content-type", "").startswith("application/json")
    assert r.status_code != 500, r.text[:300]
