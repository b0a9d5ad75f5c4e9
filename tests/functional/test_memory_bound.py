"""Memory bounded per request on the default model (issue 32 faults 4-5): a request split into model runs
by WARMSTART_BATCH_TOKENS answers what one run answers, on both request paths; a prompt that breaks the
text limits is a typed 4xx, never a 500."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
from starlette.testclient import TestClient

from handler.http_host.host import Host
from handler.http_host.routes import create_app
from handler.runtime.invocation import Runtime
from handler.runtime.workers import Sizing, WorkerPool

# 48 texts of many lengths (3 to ~100 tokens): 48 x the longest is several runs of 512 padded tokens.
TEXTS = [f"sentence {i}: " + "the quick brown fox jumps over the lazy dog " * (i % 11) for i in range(48)]


@pytest.fixture(scope="module")
def whole(new_runtime: Callable[..., Runtime]) -> Runtime:
    return new_runtime()


@pytest.fixture(scope="module")
def split(new_runtime: Callable[..., Runtime]) -> Runtime:
    return new_runtime(batch_tokens=512, max_chars=1000)


def cosines(a: Any, b: Any) -> Any:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@contextmanager
def recording(rt: Runtime) -> Iterator[list[tuple[int, int]]]:
    """The (rows, longest) of each model run `rt` makes meanwhile."""
    runs: list[tuple[int, int]] = []
    backend = rt.task.backend  # type: ignore[attr-defined]
    run = backend.run
    backend.run = lambda feeds: runs.append(feeds["input_ids"].shape) or run(feeds)
    try:
        yield runs
    finally:
        del backend.run
    assert len(runs) > 1 and all(rows * longest <= 512 for rows, longest in runs), runs


def test_split_runs_answer_as_one_run(whole: Runtime, split: Runtime) -> None:
    with recording(split):
        got = split.handle({"inputs": TEXTS}, None)
    want = whole.handle({"inputs": TEXTS}, None)
    assert got["usage"] == want["usage"]
    assert cosines(got["embeddings"], want["embeddings"]).min() >= 0.99999


@pytest.fixture
def client(split: Runtime) -> Iterator[TestClient]:
    workers = WorkerPool(Sizing(min_workers=1, max_workers=1, max_queue=4, batch_tokens=512), cpus=1)
    with TestClient(create_app(Host(lambda: split, workers))) as c:
        yield c


def test_http_batch_path_splits_a_big_request(client: TestClient, split: Runtime, whole: Runtime) -> None:
    with recording(split):
        r = client.post("/invocations", json={"inputs": TEXTS})
    assert r.status_code == 200, r.text
    want = whole.handle({"inputs": TEXTS}, None)["embeddings"]
    assert cosines(r.json()["embeddings"], want).min() >= 0.99999


@pytest.mark.parametrize(
    ("body", "status", "error"),
    [
        ({"inputs": ["a"] * 8, "prompt": "p" * 4000}, 400, "InputTooLongError"),
        ({"inputs": ["a" * 600], "prompt": "p" * 600}, 400, "InputTooLongError"),
        ({"inputs": ["a"], "prompt": "\ud800"}, 400, "InvalidEncodingError"),
    ],
)
def test_bad_prompt_is_a_typed_4xx(client: TestClient, body: Any, status: int, error: str) -> None:
    # json.dumps escapes a lone surrogate as "\ud800", as a client's JSON would carry it
    r = client.post("/invocations", content=json.dumps(body), headers={"content-type": "application/json"})
    assert (r.status_code, r.json()["error"]["type"]) == (status, error), r.text
    assert client.post("/invocations", json={"inputs": ["still serving"], "prompt": "q: "}).status_code == 200
