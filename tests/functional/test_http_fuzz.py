"""Fuzzing the HTTP host's routes in process (starlette TestClient, hypothesis): random methods, real paths,
random content-type / accept / content-length headers, random JSON (wrong types, nesting, huge numbers,
unicode, lists and objects where strings go) and raw bytes. Every answer is JSON, typed when not 2xx, never
a 500, and the host still answers /ping. Then media types x fields x routes: every route x Accept (with
parameters and q-values) x Content-Type (charsets, forms, garbage) x `encoding_format` / `dimensions` /
`output_format`: an error's type is in docs/events.md's table, a 2xx answer's media type is one Accept
allows, and a .npy answer is the route's JSON answer as one array."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from handler.api import compat
from handler.http_host.host import Host
from handler.http_host.routes import ALL_METHODS, GET_ROUTES, create_app
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


# -- media types x fields x routes (issue 32) ----------------------------------------------------------------

ERROR_TYPES = frozenset(
    re.findall(
        r"^\| `(\w+)` \|",
        (Path(__file__).resolve().parents[2] / "docs" / "events.md").read_text().split("## Errors", 1)[1],
        re.M,
    )
)
# A body each POST route takes (on the default embedding model, or refuses with a typed 400 for its task).
ROUTE_BODIES: dict[str, dict[str, Any]] = {
    "/invocations": {"inputs": ["x y"]},
    "/v1/embeddings": {"input": "x y"},
    "/embed": {"inputs": "x y"},
    "/similarity": {"inputs": {"source_sentence": "a", "sentences": ["b", "c"]}},
    "/rerank": {"query": "q", "texts": ["a"]},
    "/v1/rerank": {"query": "q", "documents": ["d"]},
    "/v2/rerank": {"query": "q", "documents": ["d"]},
    "/predict": {"inputs": "x"},
    "/tokenize": {"inputs": "x"},
    "/decode": {"ids": [101, 102]},
    "/": {"inputs": "x"},
}
# Where a route's JSON answer keeps the array its .npy answer holds.
JSON_ARRAY: dict[str, Callable[[Any], Any]] = {
    "/invocations": lambda a: a["embeddings"],
    "/v1/embeddings": lambda a: [d["embedding"] for d in a["data"]],
}
GET_PATHS = [p for p in GET_ROUTES if p not in ("/metrics", "/docs")]  # text by design: Prometheus' format, a page
ACCEPTS = [
    "application/json",
    "application/x-npy",
    "*/*",
    "application/*",
    "text/html",
    "application/vnd.api+json",
    "application/x-npy;q=0.9, application/json;q=0.1",
    "application/json;q=0, application/x-npy",
    "application/json;q=0",
    "*/*;q=0",
    "application/x-npy, */*;q=0.1",
    "application/json;q=abc, application/x-npy;q=2",
    "text/csv;charset=utf-8, application/x-npy;q=0.5",
    ";;;, ,",
    "\x7fgarbage/\u00e9",
]
CONTENT_TYPES = [
    "application/json",
    "application/json; charset=utf-8",
    "application/json; charset=latin-1",
    "application/json;charset=UTF-16",
    "text/plain; charset=utf-8",
    "application/x-npy",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x",
    "garbage",
    ";;",
]
FIELD_VALUES: dict[str, list[Any]] = {
    "encoding_format": ["float", "base64", "BASE64", "garbage", None, 3],
    "dimensions": [8, 384, 385, 0, -1, "8", 1.5, True, None],
    "output_format": ["list", "npy", "garbage", None],
}


def _accepts(accept: str | None, media: str) -> bool:
    """Whether `media` is allowed by `accept`, read independently of `handler.api.media`: some range with a
    valid q > 0 names it (exactly, as `type/*`, as `*/*`, or `*+json` for JSON) and no exact range has q=0."""
    ranges = [[x.strip().lower() for x in part.split(";")] for part in (accept or "").split(",")]
    ranges = [r for r in ranges if r[0]]
    if not ranges:
        return True
    allowed = refused = False
    for name, *params in ranges:
        q = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip() == "q":
                try:
                    q = float(value) if 0 <= float(value) <= 1 else 0.0
                except ValueError:
                    q = 0.0
        exact = name == media or (media == "application/json" and name.endswith("+json"))
        if exact and q == 0:
            refused = True
        if q > 0 and (exact or name in ("*/*", media.split("/")[0] + "/*")):
            allowed = True
    return allowed and not refused


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    path=st.sampled_from([*ROUTE_BODIES, *GET_PATHS]),
    accept=st.none() | st.sampled_from(ACCEPTS),
    content_type=st.none() | st.sampled_from(CONTENT_TYPES),
    fields=st.fixed_dictionaries({}, optional={k: st.sampled_from(v) for k, v in FIELD_VALUES.items()}),
    npy_body=st.booleans(),
)
def test_media_types_fields_and_routes(
    client: TestClient,
    path: str,
    accept: str | None,
    content_type: str | None,
    fields: dict[str, Any],
    npy_body: bool,
) -> None:
    """Never a 500; an error is JSON with a type from the error table; a 2xx answer's media type is one the
    request's Accept allows (GET routes answer JSON whatever Accept says: a probe is never refused for it),
    and a .npy answer loads."""
    # As bytes: a header is latin-1 on the wire, and the client refuses to encode a str that is not ASCII.
    hdrs = {k: v.encode("latin-1") for k, v in (("accept", accept), ("content-type", content_type)) if v is not None}
    if path in GET_PATHS:
        r = client.get(path, headers=hdrs)
    else:
        if npy_body:
            buf = io.BytesIO()
            np.save(buf, np.ones((1, 3), np.float32))
            content = buf.getvalue()
        else:
            body = {**ROUTE_BODIES[path], **fields}
            content = json.dumps(body).encode("utf-16" if "utf-16" in (content_type or "").lower() else "utf-8")
        r = client.post(path, content=content, headers=hdrs)
    media = r.headers.get("content-type", "").split(";")[0]
    assert r.status_code != 500, (path, hdrs, fields, r.text[:300])
    if media == "application/x-npy":
        assert r.status_code == 200 and path not in GET_PATHS, (path, hdrs, r.status_code)
        assert _accepts(accept, media), (path, hdrs)
        array = np.load(io.BytesIO(r.content), allow_pickle=False)
        # The same answer as JSON, as one array: the route's answer, not what is behind it.
        json_hdrs = {**hdrs, "accept": b"application/json"}
        as_json = client.post(path, content=content, headers=json_hdrs).json()
        assert np.allclose(array, np.asarray(JSON_ARRAY.get(path, lambda a: a)(as_json), np.float32)), path
        return
    assert media == "application/json", (path, hdrs, r.status_code, r.text[:200])
    parsed = r.json()
    if r.status_code >= 400:
        assert parsed["error"]["type"] in ERROR_TYPES, parsed
        assert isinstance(parsed["error"]["message"], str), parsed
    elif path not in GET_PATHS:
        assert _accepts(accept, media), (path, hdrs, r.status_code, r.text[:200])
