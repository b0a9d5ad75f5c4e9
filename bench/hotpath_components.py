"""The warm path per component, before (a git ref) vs after (this tree), in one interleaved run.

Each code version runs in its own worker process (two `handler` packages cannot share one interpreter): the
parent alternates the workers block by block (order reversed every round), so both see the same machine
load. Each worker times, per block, every component in turn on the same model, inputs and threads:

- `floor`: the raw ONNX Runtime session (`session.run`) on ready numpy feeds: the model run alone;
- `tokenize`: the task's encoder, texts → encodings → the id and mask arrays (`tokenize` + `fill`);
- `model`: the backend's `run` inside a request's buffer arena (what the task calls);
- `format`: the answer's floats (`float_lists`: float32's shortest text); pooling and normalization are
  in the packed graph, so inside `floor`/`model`;
- `metrics`: one invocation's EMF line (`metrics.invocation`, to /dev/null, line-buffered like stdout);
- `task`: the embedding task's whole call (request checks, arena, tokenize, model, format);
- `handler`: `Runtime.handle` on a direct invoke with a context (event source, log context, metrics on);
- `marshal`: `handler` plus awslambdaric's response encoder (what a Lambda invocation pays in process);
- `http`: `Runtime.handle_http` on the native route (the HTTP host's worker: body bytes → answer bytes).

Overhead: `handler` over `floor`, as the median of the per-call differences (each call's floor runs just
before it, so a shared machine's load hits both alike) and as the difference of the medians. The answers
of both versions (awslambdaric's JSON and the HTTP body) are compared byte for byte.
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


def _components(rt: Any, texts: list[str], marshaller: Any, float_lists: Any, logs: Any) -> dict[str, Any]:
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
        "format": lambda: float_lists(out),
        "metrics": lambda: rt.metrics.invocation(inv, 4.2, False),
        "task": lambda: task(event),
        "handler": lambda: rt.handle(event, context),
        "marshal": lambda: marshaller.marshal_response(rt.handle(event, context)),
        "http": lambda: rt.handle_http(body),
    }


def worker(code_root: str, threads: int) -> None:
    """Serve timing blocks on stdin/stdout for the `handler` package under `code_root`."""
    sys.path.insert(0, code_root)
    from awslambdaric.lambda_runtime_marshaller import LambdaMarshaller

    from handler.core.config import Config
    from handler.observability import logs
    from handler.runtime.invocation import Runtime
    from handler.tasks.text import float_lists

    env = {"WARMSTART_METRICS": "emf", "AWS_LAMBDA_FUNCTION_NAME": "bench", "AWS_LAMBDA_FUNCTION_VERSION": "1"}
    config = Config(model_dir=ROOT / "models" / "default", backend="onnx", threads=threads or None)
    rt = Runtime.start(config, environ=env, emit=None)
    sink = open(os.devnull, "w", buffering=1)  # noqa: SIM115 (open for the worker's life; stdout-like: a write a line)
    rt.metrics._write = sink.write
    marshaller = LambdaMarshaller()
    print(json.dumps({"threads": rt.init_report["threads"]}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        texts: list[str] = cmd["texts"]
        if cmd.get("answer"):
            lam = marshaller.marshal_response(rt.handle({"inputs": texts}, _Context()))[0]
            http = rt.handle_http(json.dumps({"inputs": texts}).encode())[1]
            print(json.dumps({"answer": hashlib.sha256(lam.encode() + b"\0" + http).hexdigest()}), flush=True)
            continue
        fns = _components(rt, texts, marshaller, float_lists, logs)
        times: dict[str, list[float]] = {name: [] for name in fns}
        for _ in range(cmd["calls"]):
            for name, fn in fns.items():
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
        print(json.dumps(times), flush=True)


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
        env = {**os.environ, "PYTHONPATH": str(code_root)}
        args = [sys.executable, __file__, "--worker", str(code_root), str(threads)]
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.threads = self._read()["threads"]

    def _read(self) -> Any:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"bench worker exited ({self.proc.wait()})")
        return json.loads(line)

    def ask(self, **cmd: Any) -> Any:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(30)


def compare(ref: str, texts: list[str], threads: int, rounds: int, block: int) -> dict[str, Any]:
    """Medians per component for `ref` (before) and this tree (after), interleaved block by block."""
    workers = {"before": _Worker(_export(ref), threads), "after": _Worker(ROOT, threads)}
    try:
        answers = {name: w.ask(texts=texts, answer=True)["answer"] for name, w in workers.items()}
        for w in workers.values():  # warm-up block, not kept
            w.ask(texts=texts, calls=max(5, block // 4))
        times: dict[str, dict[str, list[float]]] = {name: {c: [] for c in COMPONENTS} for name in workers}
        for r in range(rounds):
            order = ("before", "after") if r % 2 == 0 else ("after", "before")
            for name in order:
                for c, xs in workers[name].ask(texts=texts, calls=block).items():
                    times[name][c].extend(xs)
        result: dict[str, Any] = {"identical_answers": answers["before"] == answers["after"], "threads": {}}
        for name, w in workers.items():
            result["threads"][name] = w.threads
            t = times[name]
            result[name] = {c: statistics.median(xs) * 1e3 for c, xs in t.items()}
            result[name]["overhead"] = (
                statistics.median(h - f for h, f in zip(t["handler"], t["floor"], strict=True)) * 1e3
            )
            result[name]["overhead_medians"] = result[name]["handler"] - result[name]["floor"]
            result[name]["n"] = len(times[name]["floor"])
        return result
    finally:
        for w in workers.values():
            w.close()


def table(label: str, r: dict[str, Any]) -> str:
    b, a = r["before"], r["after"]
    rows = [
        f"{label}: median ms per call (n={a['n']} each), before = {r['ref']}, after = this tree; "
        f"answers byte-identical: {r['identical_answers']}",
        f"  {'component':10s} {'before':>9s} {'after':>9s} {'after/before':>12s}",
    ]
    for c in (*COMPONENTS, "overhead", "overhead_medians"):
        ratio = a[c] / b[c] if b[c] > 0 else float("nan")
        rows.append(f"  {c:10s} {b[c]:9.3f} {a[c]:9.3f} {ratio:11.2f}x")
    return "\n".join(rows)


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "--worker":
    worker(sys.argv[2], int(sys.argv[3]))
