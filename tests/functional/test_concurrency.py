"""Many requests at once in one process: each gets its own correct answer; pings never wait for inference;
status and leak diagnostics."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from handler.runtime.invocation import Runtime
from handler.runtime.workers import Sizing, WorkerPool

TEXTS = [f"request number {i}: " + "word " * (i % 13) + ("a question?" if i % 2 else "a statement.") for i in range(48)]


@pytest.fixture(scope="module")
def runtime(new_runtime: Callable[..., Runtime]) -> Iterator[Runtime]:
    rt = new_runtime()
    rt.workers = WorkerPool(Sizing(min_workers=2, max_workers=4, max_queue=256), cpus=2)
    yield rt
    rt.workers.shutdown()


def _reference(rt: Runtime, texts: list[str]) -> np.ndarray:
    ids, mask = rt.task.encoder.encode(texts)  # type: ignore[attr-defined]
    out: np.ndarray = rt.backend.run({"input_ids": ids, "attention_mask": mask})["sentence_embedding"]
    return out


def test_many_threads_get_their_own_vectors(runtime: Runtime) -> None:
    expected = {t: _reference(runtime, [t])[0] for t in TEXTS}

    def one(i: int) -> tuple[list[str], list[list[float]]]:
        texts = [TEXTS[i], TEXTS[(i * 7 + 3) % len(TEXTS)]][: 1 + i % 2]  # batches of 1 and 2, mixed lengths
        return texts, runtime.handle({"inputs": texts}, None)["embeddings"]

    with ThreadPoolExecutor(12) as ex:
        results = list(ex.map(one, [i % len(TEXTS) for i in range(240)]))
    for texts, vectors in results:
        assert len(vectors) == len(texts)
        for text, vector in zip(texts, vectors, strict=True):
            np.testing.assert_allclose(vector, expected[text], atol=2e-5)
    assert runtime.pool.stats()["lent"] == 0


def test_results_do_not_alias_pooled_buffers(runtime: Runtime) -> None:
    first = runtime.handle({"inputs": ["the first answer"]}, None)["embeddings"]
    kept = [list(v) for v in first]
    for _ in range(5):
        runtime.handle({"inputs": ["something else entirely, longer than the first"]}, None)
    assert np.array_equal(first, kept)
    vectors, _ = runtime.task.embed(["x"])  # type: ignore[attr-defined]
    assert vectors.flags.owndata  # a copy, not a view of the pooled output buffer


def test_bound_outputs_match_and_go_back_to_the_pool(new_runtime: Callable[..., Runtime]) -> None:
    rt = new_runtime()
    rt.backend.bind_outputs = True  # type: ignore[attr-defined]  (the CUDA path's IOBinding, forced on CPU)
    texts = ["bound outputs", "into pooled buffers, then copied out"]
    got = rt.handle({"inputs": texts}, None)["embeddings"]
    np.testing.assert_allclose(got, _reference(rt, texts), atol=2e-5)
    stats = rt.pool.stats()
    assert stats["lent"] == 0 and stats["misses"] == 3  # ids, mask and the bound output
    again = rt.handle({"inputs": texts}, None)["embeddings"]
    assert np.array_equal(again, got) and rt.pool.stats()["misses"] == 3


def test_pings_are_not_queued_behind_inference(runtime: Runtime) -> None:
    assert runtime.workers is not None
    release = threading.Event()
    blockers = [runtime.workers.submit(release.wait, 10) for _ in range(runtime.workers.sizing.max_workers + 2)]
    try:
        reply = runtime.handle({"warmer": True}, None)
        assert reply["warm"] is True
        assert not release.is_set() and not all(b.done() for b in blockers)
        assert runtime.handle({"warmstart": "status"}, None)["warmstart"] == "status"
    finally:
        release.set()
    for b in blockers:
        b.result(10)


def test_status_reports_counts_pool_threads_and_tracemalloc(new_runtime: Callable[..., Runtime]) -> None:
    rt = new_runtime()
    rt.handle({"inputs": ["a"]}, None)
    rt.handle({"warmer": True}, None)
    first = rt.handle({"warmstart": "status", "tracemalloc": True}, None)
    assert first["tracemalloc"]["started"] is True
    for _ in range(20):
        rt.handle({"inputs": ["b", "c"]}, None)
    second = rt.handle({"warmstart": "status", "tracemalloc": True, "top": 3}, None)
    assert second["invocations"] == {
        "total": 23 + 1,
        "inference": 21,
        "ping": 1,
        "status": 2,
        "rejected": 0,
        "failed": 0,
    }
    assert second["threads"]["count"] >= 1 and second["rss_mb"] > 0
    assert second["pool"]["hits"] > 0 and second["pool"]["lent"] == 0
    leaks = second["tracemalloc"]
    assert len(leaks["top"]) <= 3 and "growth_kb" in leaks
    plain = rt.handle({"warmstart": "status"}, None)
    assert "tracemalloc" not in plain
    rt.diagnostics.stop_tracing()  # process-wide: leave no tracing to the tests after this one


def test_status_rejects_a_bad_top(onnx_runtime: Runtime) -> None:
    from handler.core.errors import InvalidInputError

    with pytest.raises(InvalidInputError):
        onnx_runtime.handle({"warmstart": "status", "tracemalloc": True, "top": 0}, None)


def test_managed_instances_mode_uses_workers_and_splits_threads(model_dir: object) -> None:
    from handler.core.config import Config

    env = {"AWS_LAMBDA_MAX_CONCURRENCY": "2"}
    rt = Runtime.start(Config(model_dir=model_dir, backend="onnx", warmup=False), environ=env, emit=None)  # type: ignore[arg-type]
    assert rt.workers is not None
    assert rt.init_report["workers"]["max_concurrency"] == 2
    assert rt.init_report["threads"]["intra_op"] == max(1, rt.init_report["threads"]["cpus"] // 2)
    assert len(rt.handle({"inputs": ["one", "two"]}, None)["embeddings"]) == 2
    assert rt.workers.stats()["completed"] == 1
    rt.workers.shutdown()
