"""The warm path per component, before (a git ref) vs after (this tree), in one interleaved run.

Each code version runs in its own worker process (two `handler` packages cannot share one interpreter): the
parent alternates the workers block by block (order reversed every round), so both see the same machine
load. Each worker times, per block, every component in turn on the same model, inputs and threads:

- `floor`: the raw ONNX Runtime session (`session.run`) on ready numpy feeds: the model run alone;
- `tokenize`: the task's encoder, texts → encodings → the id and mask arrays (`tokenize` + `fill`);
- `model`: the backend's `run` inside a request's buffer arena (what the task calls);
- `format`: the answer's floats as JSON text (`handler.api.encode.dumps` of the float32 array; before it,
  `float_lists` then `json.dumps`); pooling and normalization are in the packed graph, so inside `floor`/`model`;
- `metrics`: one invocation's EMF line (`metrics.invocation`, to /dev/null, line-buffered like stdout);
- `task`: the embedding task's whole call (request checks, arena, tokenize, model, format);
- `handler`: `Runtime.handle` on a direct invoke with a context (event source, log context, metrics on);
- `marshal`: what a Lambda invocation pays in process: the entry point's answer (`Runtime.lambda_reply`'s
  bytes; before it, `handle`'s dict) through awslambdaric's `marshal_response`;
- `http`: `Runtime.handle_http` on the native route (the HTTP host's worker: body bytes → answer bytes).

Every component runs right after another one, most of them after a model run that streams the weights
through the caches, as in a real invocation: its figures are cold-cache costs, several times what the same
call costs in a tight loop (`timeit`).

Overhead (`handler-floor`, `marshal-floor`, `http-floor`): the median of per-call differences from the floor
(each call's floor runs just before it, so a shared machine's load hits both alike), in wall time and in the
calling thread's CPU time. The answers of both versions (awslambdaric's JSON and the HTTP body) are compared
as the float32 vectors they parse to.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
COMPONENTS = ("floor", "tokenize", "model", "format", "metrics", "task", "handler", "marshal", "http")


class _Context:
    aws_request_id = "8f5c2e1a-3b4d-4e6f-9a0b-1c2d3e4f5a6b"

    def get_remaining_time_in_millis(self) -> int:
        return 60_000


def _components(rt: Any, texts: list[str], marshaller: Any, edge: Any, logs: Any) -> dict[str, Any]:
    """The timed calls for one batch of texts, in timing order (the floor first)."""
    import numpy as np

    task, session, context = rt.task, rt.backend.session, _Context()
    event = {"inputs": texts}
    body = json.dumps(event).encode()
    ids, mask = task.encoder.encode(texts)
    feeds = {"input_ids": ids, "attention_mask": mask}
    out = session.run(None, feeds)[0]
    ids_buf, mask_buf = np.empty_like(ids), np.empty_like(mask)
    inv = logs.Invocation(context.aws_request_id, None, False, rt.manifest.key)
    inv.batch, inv.tokens = len(texts), int(mask.sum())

    def tokenize() -> None:
        task.encoder.fill(task.encoder.tokenize(texts), ids_buf, mask_buf)

    def model() -> None:
        with task.pool.request():
            task.backend.run(feeds)

    return {
        "floor": lambda: session.run(None, feeds),
        "tokenize": tokenize,
        "model": model,
        "format": lambda: edge.text(out),
        "metrics": lambda: rt.metrics.invocation(inv, 4.2, False),
        "task": lambda: task(event),
        "handler": lambda: rt.handle(event, context),
        "marshal": lambda: marshaller.marshal_response(edge.reply(event, context)),
        "http": lambda: rt.handle_http(body),
    }


class _Edge:
    """How a version writes its answers: one encoder at the edge (`handler.api.encode`), or, before it, the
    floats through `float_lists` and the text by json (HTTP) or awslambdaric's simplejson (Lambda)."""

    def __init__(self, rt: Any) -> None:
        try:
            from handler.api.encode import dumps

            self.text: Any = dumps
            self.reply: Any = rt.lambda_reply
        except ImportError:
            # the tree before it
            from handler.tasks.text import float_lists  # type: ignore[attr-defined]

            self.text = lambda out: json.dumps(float_lists(out), separators=(",", ":"))
            self.reply = rt.handle


def _vectors(answer: str | bytes) -> bytes:
    import numpy as np

    return np.asarray(json.loads(answer)["embeddings"], np.float32).tobytes()


def worker(code_root: str, threads: int) -> None:
    """Serve timing blocks on stdin/stdout for the `handler` package under `code_root`."""
    sys.path.insert(0, code_root)
    from awslambdaric.lambda_runtime_marshaller import LambdaMarshaller

    from handler.core.config import Config
    from handler.observability import logs
    from handler.runtime.invocation import Runtime

    env = {"WARMSTART_METRICS": "emf", "AWS_LAMBDA_FUNCTION_NAME": "bench", "AWS_LAMBDA_FUNCTION_VERSION": "1"}
    config = Config(model_dir=ROOT / "models" / "default", backend="onnx", threads=threads or None)
    rt = Runtime.start(config, environ=env, emit=None)
    sink = open(os.devnull, "w", buffering=1)  # noqa: SIM115 (open for the worker's life; stdout-like: a write a line)
    rt.metrics._write = sink.write
    marshaller = LambdaMarshaller()
    edge = _Edge(rt)
    print(json.dumps({"threads": rt.init_report["threads"]}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        texts: list[str] = cmd["texts"]
        if cmd.get("answer"):
            lam = marshaller.marshal_response(edge.reply({"inputs": texts}, _Context()))[0]
            http = rt.handle_http(json.dumps({"inputs": texts}).encode())[1]
            print(json.dumps({"answer": hashlib.sha256(_vectors(lam) + _vectors(http)).hexdigest()}), flush=True)
            continue
        fns = _components(rt, texts, marshaller, edge, logs)
        wall: dict[str, list[float]] = {name: [] for name in fns}
        cpu: dict[str, list[float]] = {name: [] for name in fns}
        for _ in range(cmd["calls"]):
            for name, fn in fns.items():
                c0, t0 = time.thread_time(), time.perf_counter()
                fn()
                t1, c1 = time.perf_counter(), time.thread_time()
                wall[name].append(t1 - t0)
                cpu[name].append(c1 - c0)
        print(json.dumps({"wall": wall, "cpu": cpu}), flush=True)


def _export(ref: str) -> Path:
    """The `handler` package as of `ref`, extracted under build/ (the tree only: models are shared)."""
    sha = subprocess.run(["git", "rev-parse", ref], cwd=ROOT, check=True, capture_output=True, text=True).stdout
    dest = ROOT / "build" / "bench-ref" / sha.strip()[:12]
    if not (dest / "handler").is_dir():
        dest.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile() as tar:
            subprocess.run(["git", "archive", ref, "handler"], cwd=ROOT, check=True, stdout=tar)
            tar.seek(0)
            subprocess.run(["tar", "-x", "-C", str(dest)], check=True, stdin=tar)
    return dest


class _Worker:
    def __init__(self, code_root: Path, threads: int) -> None:
        from bench.json_child import JsonChild  # here: the worker runs this file with an older tree on its path

        env = {**os.environ, "PYTHONPATH": str(code_root)}
        self.child = JsonChild([sys.executable, __file__, "--worker", str(code_root), str(threads)], env)
        self.threads = self.child.read()["threads"]

    def ask(self, **cmd: Any) -> Any:
        return self.child.ask(cmd)

    def close(self) -> None:
        self.child.close()


CLOCKS = ("wall", "cpu")
PAIRED = ("handler", "marshal", "http")  # each over the floor, call by call


def compare(ref: str, texts: list[str], threads: int, rounds: int, block: int) -> dict[str, Any]:
    """Medians per component for `ref` (before) and this tree (after), interleaved block by block; per clock:
    `wall` (perf_counter) and `cpu` (the calling thread's CPU time: what a preempted call did not run; at one
    intra-op thread ONNX Runtime runs on the calling thread, so the model is in it too)."""
    workers = {"before": _Worker(_export(ref), threads), "after": _Worker(ROOT, threads)}
    try:
        answers = {name: w.ask(texts=texts, answer=True)["answer"] for name, w in workers.items()}
        for w in workers.values():  # warm-up block, not kept
            w.ask(texts=texts, calls=max(5, block // 4))
        times = {k: {name: {c: [] for c in COMPONENTS} for name in workers} for k in CLOCKS}
        for r in range(rounds):
            order = ("before", "after") if r % 2 == 0 else ("after", "before")
            for name in order:
                got = workers[name].ask(texts=texts, calls=block)
                for k in CLOCKS:
                    for c, xs in got[k].items():
                        times[k][name][c].extend(xs)
        result: dict[str, Any] = {"identical_answers": answers["before"] == answers["after"], "threads": {}}
        for name, w in workers.items():
            result["threads"][name] = w.threads
        for k in CLOCKS:
            result[k] = {}
            for name in workers:
                t = times[k][name]
                row = {c: statistics.median(xs) * 1e3 for c, xs in t.items()}
                for c in PAIRED:  # the median of per-call differences: load that hits one call hits its pair too
                    row[f"{c}-floor"] = statistics.median(x - f for x, f in zip(t[c], t["floor"], strict=True)) * 1e3
                row["n"] = len(t["floor"])
                result[k][name] = row
        return result
    finally:
        for w in workers.values():
            w.close()


def table(label: str, r: dict[str, Any]) -> str:
    rows = [
        f"{label}: median ms per call (n={r['wall']['after']['n']} each), before = {r['ref']}, after = this tree; "
        f"answers parse to the same float32: {r['identical_answers']}",
        f"  {'component':14s} {'wall before':>11s} {'after':>8s} {'ratio':>6s}   {'cpu before':>10s} {'after':>8s} "
        f"{'ratio':>6s}",
    ]
    for c in (*COMPONENTS, *(f"{p}-floor" for p in PAIRED)):
        cells = []
        for k in CLOCKS:
            b, a = r[k]["before"][c], r[k]["after"][c]
            cells.append(f"{b:{11 if k == 'wall' else 10}.3f} {a:8.3f} {a / b if b > 0 else float('nan'):5.2f}x")
        rows.append(f"  {c:14s} {cells[0]}   {cells[1]}")
    return "\n".join(rows)


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "--worker":
    worker(sys.argv[2], int(sys.argv[3]))
