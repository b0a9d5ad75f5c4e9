"""Latency during a hot swap against steady state, and what the swap costs in memory.

K client threads send single-sentence embedding requests through `Runtime.handle` (as several requests at
once do on the HTTP host or Lambda Managed Instances). First a steady phase; then the same load while the
default model is hot-swapped N times, back and forth between the packed default (0.1.0) and a copy of it
packed as 0.2.0 (copied files, not links: two versions really are two sets of pages). A request counts as
"during the swap" when it overlaps the reload's run (fetch → SHA-256 of every file → session → warm-up →
swap) or what follows it until the old version is freed and its heap trimmed (a helper thread may do that
after the reply, at a moment with no request in flight: `Reloader.releases` counts them). RSS is sampled
every 5 ms: the peak during the overlap is what two resident versions cost.

The runtime runs as on Lambda (`AWS_LAMBDA_FUNCTION_NAME` set: no spinning intra-op threads).

Usage: .venv/bin/python bench/hotpath/reload.py [--clients 2] [--seconds 5] [--rounds 5] [--think-ms 0]
    [--json out.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from handler.core.config import Config  # noqa: E402
from handler.observability.report import memory_mb  # noqa: E402
from handler.runtime.invocation import Runtime  # noqa: E402
from tests.model_versions import write_version  # noqa: E402

MODEL = ROOT / "models" / "default"
TEXT = "How long does a hot swap of the model make a request wait?"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


class Load:
    """K threads sending requests until stopped; every request's (start, end, model) is kept."""

    def __init__(self, runtime: Runtime, clients: int, think_s: float = 0.0) -> None:
        self.runtime = runtime
        self.think_s = think_s
        self.records: list[tuple[float, float, str]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._client, daemon=True) for _ in range(clients)]

    def _client(self) -> None:
        while not self._stop.is_set():
            t0 = time.perf_counter()
            try:
                reply = self.runtime.handle({"inputs": [TEXT]})
            except Exception as e:
                with self._lock:
                    self.errors.append(f"{type(e).__name__}: {e}")
                continue
            t1 = time.perf_counter()
            with self._lock:
                self.records.append((t0, t1, reply["model"]))
            if self.think_s:
                time.sleep(self.think_s)

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()

    def between(self, t0: float, t1: float, overlapping: bool = False) -> list[float]:
        with self._lock:
            records = list(self.records)
        if overlapping:
            return [(e - s) * 1000 for s, e, _ in records if s < t1 and e > t0]
        return [(e - s) * 1000 for s, e, _ in records if s >= t0 and e <= t1]


class RssSampler:
    def __init__(self, every_s: float = 0.005) -> None:
        self.samples: list[tuple[float, float]] = []
        self._every = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            self.samples.append((time.perf_counter(), memory_mb().get("rss_mb", 0.0)))

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def peak(self, t0: float, t1: float) -> float:
        return max((r for t, r in self.samples if t0 <= t <= t1), default=float("nan"))

    def median(self, t0: float, t1: float) -> float:
        values = [r for t, r in self.samples if t0 <= t <= t1]
        return statistics.median(values) if values else float("nan")


def released_count(runtime: Runtime) -> int:
    return int(getattr(runtime.reloader, "releases", 0))


def wait_released(runtime: Runtime, before: int, timeout_s: float = 5.0) -> None:
    """Until the old version is freed and trimmed. A runtime without `Reloader.releases` (older commits, for
    side-by-side runs): until nothing replaced is left resident, plus the trim's ~10 ms."""
    deadline = time.perf_counter() + timeout_s
    registry = runtime.registry
    while time.perf_counter() < deadline:
        if hasattr(runtime.reloader, "releases"):
            if released_count(runtime) > before:
                return
        elif not registry.retiring() and not getattr(registry, "_graveyard", None):
            time.sleep(0.01)
            return
        time.sleep(0.002)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=2, help="client threads (K)")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of the steady phase")
    parser.add_argument("--rounds", type=int, default=5, help="hot swaps (N)")
    parser.add_argument("--gap", type=float, default=1.5, help="seconds of plain load between swaps")
    parser.add_argument(
        "--think-ms", type=float, default=0.0, help="each client's pause between requests (0: back to back)"
    )
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="warmstart-bench-reload-"))
    other = write_version(MODEL, tmp / "v2", "0.2.0")
    env = {"WARMSTART_MODEL": str(MODEL), "AWS_LAMBDA_FUNCTION_NAME": "bench-reload"}
    runtime = Runtime.start(Config.from_environ(env), environ=env, emit=None)
    versions = [other, MODEL]

    load, rss = Load(runtime, args.clients, args.think_ms / 1000), RssSampler()
    rss.start()
    load.start()
    time.sleep(1.0)  # the clients' first requests and the arena's growth are not the steady state
    s0 = time.perf_counter()
    time.sleep(args.seconds)
    s1 = time.perf_counter()
    steady = load.between(s0, s1)

    swaps: list[dict[str, Any]] = []
    windows: list[tuple[float, float]] = []
    for i in range(args.rounds):
        gc.collect()  # before the gap: a request this full collection stalls must not overlap the window
        time.sleep(args.gap)
        before = rss.median(time.perf_counter() - 0.5, time.perf_counter())
        released = released_count(runtime)
        t0 = time.perf_counter()
        reply = runtime.handle({"warmstart": "reload", "model": str(versions[i % 2]), "wait": True})
        replied = time.perf_counter()
        wait_released(runtime, released)
        t1 = time.perf_counter()
        windows.append((t0, t1))
        time.sleep(0.3)
        during = load.between(t0, t1, overlapping=True)
        swaps.append(
            {
                "old": reply["old"],
                "new": reply["new"],
                "reload_ms": round((replied - t0) * 1000, 1),
                "freed_after_ms": round((t1 - replied) * 1000, 1),
                "phases_ms": reply["phases_ms"],
                "requests": len(during),
                "p99_ms": round(pct(during, 99), 2) if during else None,
                "max_ms": round(max(during), 2) if during else None,
                "rss_before_mb": before,
                "rss_peak_mb": rss.peak(t0, t1 + 0.3),
                "rss_after_mb": rss.median(t1 + 0.1, t1 + 0.3),
            }
        )
    end = time.perf_counter()
    load.stop()
    rss.stop()

    # Two baselines: the steady phase, and the requests between swaps (same minutes, same neighbours: on a
    # shared machine the noise drifts, and this one drifts with the swaps).
    with load._lock:
        records = list(load.records)
    between = [
        (e - s) * 1000
        for s, e, _ in records
        if s >= s1 and e <= end and all(e < w0 or s > w1 + 0.3 for w0, w1 in windows)
    ]
    during_all = [ms for w0, w1 in windows for ms in load.between(w0, w1, overlapping=True)]
    steady_p50, steady_p99 = pct(steady, 50), pct(steady, 99)
    between_p99 = pct(between, 99)
    swap_p99, swap_max = pct(during_all, 99), max(during_all)
    weights_mb = runtime.registry.describe()["loaded"][0]["weights_mb"]
    overlap = [s["rss_peak_mb"] - s["rss_before_mb"] for s in swaps]
    residual = [s["rss_after_mb"] - s["rss_before_mb"] for s in swaps]
    summary = {
        "clients": args.clients,
        "think_ms": args.think_ms,
        "steady": {"requests": len(steady), "p50_ms": round(steady_p50, 2), "p99_ms": round(steady_p99, 2)},
        "between_swaps": {"requests": len(between), "p99_ms": round(between_p99, 2)},
        "during_swaps": {"requests": len(during_all), "p99_ms": round(swap_p99, 2), "max_ms": round(swap_max, 2)},
        "swaps": swaps,
        "p99_ratio": round(swap_p99 / steady_p99, 2),
        "max_ratio": round(swap_max / steady_p99, 2),
        "max_ratio_between": round(swap_max / between_p99, 2),
        "errors": len(load.errors),
        "weights_mb": weights_mb,
        "rss_overlap_mb_median": round(statistics.median(overlap), 1),
        "rss_residual_mb_median": round(statistics.median(residual), 1),
    }
    print(
        f"clients {args.clients} (think {args.think_ms:g} ms), steady {len(steady)} requests: "
        f"p50 {steady_p50:.2f} ms, p99 {steady_p99:.2f} ms"
    )
    print(
        f"{'swap':<34} {'reload ms':>9} {'freed +ms':>9} {'reqs':>5} {'p99 ms':>8} {'max ms':>8} "
        f"{'RSS +peak':>10} {'RSS +after':>10}"
    )
    for s in swaps:
        print(
            f"{s['old'] + ' → ' + s['new'].split('@')[1]:<34} {s['reload_ms']:>9.0f} {s['freed_after_ms']:>9.0f} "
            f"{s['requests']:>5} "
            f"{s['p99_ms'] or 0:>8.2f} {s['max_ms'] or 0:>8.2f} {s['rss_peak_mb'] - s['rss_before_mb']:>+10.1f} "
            f"{s['rss_after_mb'] - s['rss_before_mb']:>+10.1f}"
        )
    print(f"between swaps: {len(between)} requests, p99 {between_p99:.2f} ms")
    print(
        f"during swaps: {len(during_all)} requests, p99 {swap_p99:.2f} ms = {summary['p99_ratio']}x steady p99; "
        f"max {swap_max:.2f} ms = {summary['max_ratio']}x steady p99, {summary['max_ratio_between']}x the p99 "
        f"between swaps (target: ≤ 2x); errors {len(load.errors)}"
    )
    print(
        f"memory: weights {weights_mb} MB per version; RSS peak during the overlap "
        f"+{summary['rss_overlap_mb_median']} MB (median of {len(swaps)}), "
        f"{summary['rss_residual_mb_median']:+} MB once the old version is unloaded"
    )
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
