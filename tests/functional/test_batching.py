"""Dynamic batching on the HTTP host: requests queued together run as one model run, each answered as a
single call would be (vectors within cosine 1e-5, options per caller), each with its own error; and the
host's worker threads sized with the session's so workers x intra-op threads fit the CPUs."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from handler.api import compat
from handler.core.config import Config
from handler.core.cpu import cpu_budget
from handler.http_host import server as http_server
from handler.models import loader
from handler.runtime.invocation import HttpCall, Runtime
from handler.runtime.workers import Sizing, WorkerPool

OPENAI = compat.ROUTES["/v1/embeddings"]
EMBED = compat.ROUTES["/embed"]
TOKENIZE = compat.ROUTES["/tokenize"]
SENTENCES = [
    "hi",
    "a much longer sentence, so that the short ones in its batch are padded to its length by the host",
    "what is the capital of France?",
    "the quick brown fox jumps over the lazy dog " * 6,
    "ok",
    "dynamic batching must not change what anyone gets back",
]


@pytest.fixture(scope="module")
def runtime(new_runtime: Callable[..., Runtime]) -> Iterator[Runtime]:
    rt = new_runtime()
    rt.workers = WorkerPool(Sizing(min_workers=1, max_workers=1, max_queue=256, batch_wait_s=0), cpus=1)
    yield rt
    rt.workers.shutdown()


def _hold(pool: WorkerPool) -> threading.Event:
    """Keep the one worker busy, so what is submitted next queues up and is taken as one batch."""
    started, release = threading.Event(), threading.Event()

    def job() -> None:
        started.set()
        release.wait(30)

    pool.submit(job)
    assert started.wait(30)
    return release


def _batched(rt: Runtime, calls: list[HttpCall]) -> list[tuple[int, Any]]:
    assert rt.workers is not None
    before = rt.workers.stats()["largest_batch"]
    release = _hold(rt.workers)
    futures = [rt.workers.submit_batch(rt.handle_http_batch, c) for c in calls]
    release.set()
    out = [f.result(60) for f in futures]
    assert rt.workers.stats()["largest_batch"] >= min(len(calls), rt.workers.sizing.max_batch) or before
    return [(status, json.loads(body)) for status, body, _ in out]


def _single(rt: Runtime, call: HttpCall) -> tuple[int, Any]:
    status, body, _ = rt.handle_http(call.raw, call.route, call.content, call.accept, call.limit)
    return status, json.loads(body)


def _openai(body: dict[str, Any]) -> HttpCall:
    return HttpCall(json.dumps(body).encode(), OPENAI)


def _vectors(answer: Any) -> np.ndarray:
    rows = [d["embedding"] for d in answer["data"]]
    if isinstance(rows[0], str):
        rows = [np.frombuffer(base64.b64decode(r), "<f4") for r in rows]
    return np.asarray(rows, dtype=np.float64)


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)  # type: ignore[no-any-return]


def test_batched_answers_equal_single_calls_with_each_callers_options(runtime: Runtime) -> None:
    calls = [_openai({"input": s, "model": "x"}) for s in SENTENCES]
    calls += [
        _openai({"input": [SENTENCES[0], SENTENCES[3]], "dimensions": 64}),  # shortened and renormalized
        _openai({"input": SENTENCES[2], "encoding_format": "base64"}),
        HttpCall(json.dumps({"inputs": SENTENCES[1:3]}).encode(), EMBED),  # another route, same model
    ]
    batched = _batched(runtime, calls)
    assert runtime.workers is not None and runtime.workers.stats()["largest_batch"] == len(calls)
    for call, (status, answer) in zip(calls, batched, strict=True):
        single_status, single = _single(runtime, call)
        assert status == single_status == 200
        if call.route is EMBED:
            a, b = np.asarray(answer, np.float64), np.asarray(single, np.float64)
        else:
            a, b = _vectors(answer), _vectors(single)
            assert answer["usage"] == single["usage"]  # tokens counted without the batch's padding
        assert a.shape == b.shape
        assert _cosines(a, b).min() >= 0.99999
    assert _vectors(batched[len(SENTENCES)][1]).shape == (2, 64)
    assert np.allclose(np.linalg.norm(_vectors(batched[len(SENTENCES)][1]), axis=1), 1, atol=1e-5)
    assert isinstance(batched[len(SENTENCES) + 1][1]["data"][0]["embedding"], str)


def test_one_bad_request_never_fails_its_batch_mates(runtime: Runtime) -> None:
    good = [_openai({"input": s}) for s in SENTENCES[:3]]
    bad = [
        HttpCall(b"{not json", OPENAI),
        _openai({"input": [1, 2, 3]}),  # token ids: refused with what to send
        _openai({"input": "x", "dimensions": 100_000}),  # more than the model has: refused before the run
        _openai({"input": "x", "encoding_format": "hex"}),
        HttpCall(json.dumps({"inputs": "x", "model": "no-such-model"}).encode(), compat.NATIVE),
        HttpCall(json.dumps({"inputs": "tokenize me"}).encode(), TOKENIZE),  # not batched: its own run
    ]
    calls = [good[0], bad[0], good[1], bad[1], bad[2], bad[3], bad[4], good[2], bad[5]]
    batched = _batched(runtime, calls)
    for call, (status, answer) in zip(calls, batched, strict=True):
        single_status, single = _single(runtime, call)
        assert status == single_status, (call.raw, answer)
        if status == 200 and call.route is OPENAI:
            assert _cosines(_vectors(answer), _vectors(single)).min() >= 0.99999
        elif status == 200:
            assert answer == single
        else:
            assert answer["error"]["type"] == single["error"]["type"]  # the same typed error as alone
    assert [s for s, _ in batched] == [200, 400, 200, 400, 400, 400, 404, 200, 200]


def test_a_failing_model_run_falls_back_to_one_run_per_request(
    new_runtime: Callable[..., Runtime], monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = new_runtime()
    rt.workers = WorkerPool(Sizing(min_workers=1, max_workers=1, max_queue=64, batch_wait_s=0), cpus=1)
    real = rt.backend.run
    runs: list[int] = []

    def fragile(feeds: dict[str, np.ndarray]) -> Any:
        rows = feeds["input_ids"].shape[0]
        runs.append(rows)
        if rows > 1:
            raise MemoryError("the batch did not fit")  # as an arena too small for the batch would
        if int(feeds["attention_mask"].sum()) > 20:
            raise RuntimeError("this one input breaks the model")
        return real(feeds)

    monkeypatch.setattr(rt.backend, "run", fragile)
    calls = [_openai({"input": s}) for s in SENTENCES[:3]]  # SENTENCES[1] is over 20 tokens
    batched = _batched(rt, calls)
    assert runs[0] == 3 and sorted(runs[1:]) == [1, 1, 1]
    assert [s for s, _ in batched] == [200, 500, 200]
    assert "this one input breaks the model" in json.dumps(batched[1][1])  # its own error, nobody else's
    rt.workers.shutdown()


def test_http_host_sizes_session_threads_for_its_workers(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The host sizes its pool before init, so workers x intra-op threads fit the CPUs (it used to give every
    worker's runs all the CPUs: 2 workers x 2 spinning threads on 2 CPUs)."""
    monkeypatch.setattr(loader, "host_runs", None)
    cpus = cpu_budget({}).cpus
    workers = max(2, cpus)
    env = {"WARMSTART_WORKERS_MAX": str(workers), "PORT": "8125"}

    def start() -> Runtime:
        return Runtime.start(Config(model_dir=model_dir, backend="onnx", warmup=False), environ=env, emit=None)

    srv = http_server.server(start, env)
    assert srv.host is not None
    try:
        report = srv.host.runtime.init_report
    finally:
        srv.host.close()
    threads = report["threads"]
    assert threads["runs"] == workers
    assert threads["intra_op"] * workers <= max(cpus, workers)  # one thread each at least
    assert threads["intra_op"] == max(1, cpus // workers)
    assert threads["spin"] is (threads["intra_op"] > 1)
    plan = report["http_workers"]
    assert (plan["max_workers"], plan["threads_per_worker"], plan["max_batch"]) == (workers, threads["intra_op"], 32)
    assert plan["no_503_up_to"] == min(plan["max_queue"], workers * plan["max_batch"])
