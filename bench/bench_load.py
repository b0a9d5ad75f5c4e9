"""Load under a CPU quota: the HTTP host (`python -m handler`) in a cgroup, driven by locust at rising concurrency.

    sudo .venv/bin/python bench/bench_load.py [--cpus 0.5 1 2] [--memory-mb 1024] [--users 1 2 4 8 16 32 64]
                                              [--step-s 15] [--retry-after honor|ignore] [--out bench/results]

For each CPU quota: a cgroup (v1 `cpu` + `memory`, or v2) with that quota and the memory limit; the server
started inside it (its worker pool and intra-op threads sized by what it reads from its own cgroup); then
locust headless, closed loop (each user sends its next request when the last is answered), one step per
concurrency. Per step: successful throughput, p50/p99 of all answers, 503 share, other errors, the server's
peak RSS, and OOM kills. Writes `load.md` (tables) and `load.png` (throughput and p99 against concurrency).
The headline per quota: the highest throughput whose p99 is at most twice the unloaded p99 (1 user).

Root only (cgroups). Locust runs outside the cgroup, on the same machine: on a small shared machine its own
CPU use and the neighbours' show in the figures; the markdown notes the machine's cores and load.
"""

from __future__ import annotations

import argparse
import csv
import http.client
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
LOCUSTFILE = ROOT / "bench" / "load" / "locustfile.py"
CGROUP = Path("/sys/fs/cgroup")
PERIOD_US = 100_000


@dataclass
class Step:
    cpus: float
    users: int
    requests: int
    ok: int
    busy: int
    other: int
    rps: float  # successful answers per second
    p50_ms: float
    p99_ms: float
    rss_mb: float
    oom_kills: int

    @property
    def busy_share(self) -> float:
        return self.busy / self.requests if self.requests else 0.0


class Cgroup:
    """A cgroup with a CPU quota and a memory limit; v1 (cpu + memory hierarchies) or v2, whichever is mounted."""

    def __init__(self, name: str, cpus: float, memory_mb: int) -> None:
        self.v2 = (CGROUP / "cgroup.controllers").is_file()
        if self.v2:
            self.dirs = [CGROUP / name]
        else:
            # memory nested under this process's own memory cgroup, so the parent's accounting still holds.
            own = dict(line.split(":", 2)[1:] for line in Path("/proc/self/cgroup").read_text().splitlines())
            self.dirs = [CGROUP / "cpu" / name, CGROUP / "memory" / own.get("memory", "/").strip("/") / name]
        for d in self.dirs:
            d.mkdir(parents=True, exist_ok=True)
        if self.v2:
            (self.dirs[0] / "cpu.max").write_text(f"{int(cpus * PERIOD_US)} {PERIOD_US}")
            (self.dirs[0] / "memory.max").write_text(str(memory_mb * 2**20))
        else:
            (self.dirs[0] / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (self.dirs[0] / "cpu.cfs_quota_us").write_text(str(int(cpus * PERIOD_US)))
            (self.dirs[1] / "memory.limit_in_bytes").write_text(str(memory_mb * 2**20))

    def enter(self) -> None:
        """In the child, before exec: move this process into every hierarchy's cgroup."""
        for d in self.dirs:
            (d / "cgroup.procs").write_text(str(os.getpid()))

    def oom_kills(self) -> int:
        path = self.dirs[-1] / ("memory.events" if self.v2 else "memory.oom_control")
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def remove(self) -> None:
        for d in self.dirs:
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)


def wait_ready(port: int, proc: subprocess.Popen[bytes], timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("the server exited during startup")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/ping")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError("no /ping answer")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RssPeak:
    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            try:
                self.peak = max(self.peak, self.proc.memory_info().rss)
            except psutil.Error:
                return

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak / 2**20


def locust_step(port: int, users: int, seconds: int, tmp: Path, retry_after: str = "honor") -> dict[str, Any]:
    prefix = tmp / f"u{users}"
    cmd = [
        sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--only-summary",
        "-u", str(users), "-r", str(users), "-t", f"{seconds}s", "--host", f"http://127.0.0.1:{port}",
        "--csv", str(prefix), "--loglevel", "ERROR", "--stop-timeout", "5",
    ]  # fmt: skip
    env = {**os.environ, "BENCH_RETRY_AFTER": retry_after}
    subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, timeout=seconds + 60, check=False)
    with open(f"{prefix}_stats.csv") as f:
        rows = {r["Name"]: r for r in csv.DictReader(f)}
    total = rows["Aggregated"]
    failures: dict[str, int] = {}
    with open(f"{prefix}_failures.csv") as f:
        for r in csv.DictReader(f):
            failures[r["Error"]] = failures.get(r["Error"], 0) + int(r["Occurrences"])
    busy = sum(n for e, n in failures.items() if "busy-503" in e)
    requests = int(total["Request Count"])
    return {
        "requests": requests,
        "busy": busy,
        "other": int(total["Failure Count"]) - busy,
        "ok": requests - int(total["Failure Count"]),
        "p50_ms": float(total["50%"]),
        "p99_ms": float(total["99%"]),
        "seconds": seconds,
    }


def run_quota(cpus: float, memory_mb: int, users: list[int], step_s: int, tmp: Path, retry_after: str) -> list[Step]:
    cgroup = Cgroup(f"warmstart-bench-{os.getpid()}-{cpus}", cpus, memory_mb)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WARMSTART_", "AWS_LAMBDA_"))}
    env.update(PORT=str(port), HOST="127.0.0.1", WARMSTART_LOG_LEVEL="error")
    proc = subprocess.Popen(
        [sys.executable, "-m", "handler"], cwd=ROOT, env=env, preexec_fn=cgroup.enter, stdout=subprocess.DEVNULL
    )
    steps: list[Step] = []
    try:
        wait_ready(port, proc)
        locust_step(port, 1, 3, tmp)  # warm: the first requests after init, connection set-up
        for n in users:
            rss = RssPeak(proc.pid)
            r = locust_step(port, n, step_s, tmp, retry_after)
            step = Step(
                cpus, n, r["requests"], r["ok"], r["busy"], r["other"], r["ok"] / r["seconds"],
                r["p50_ms"], r["p99_ms"], rss.stop(), cgroup.oom_kills(),
            )  # fmt: skip
            steps.append(step)
            print(
                f"cpus={cpus} users={n}: {step.rps:.1f} ok/s p50 {step.p50_ms:.0f} ms p99 {step.p99_ms:.0f} ms "
                f"503 {step.busy_share:.1%} other {step.other} rss {step.rss_mb:.0f} MB oom {step.oom_kills}",
                flush=True,
            )
            if proc.poll() is not None:
                print(f"server exited with {proc.returncode}", flush=True)
                break
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        cgroup.remove()
    return steps


def headline(steps: list[Step]) -> tuple[Step | None, float]:
    """The step with the highest throughput whose p99 is at most twice the unloaded (1 user) p99."""
    unloaded = steps[0].p99_ms
    within = [s for s in steps if s.p99_ms <= 2 * unloaded and s.other == 0]
    return (max(within, key=lambda s: s.rps) if within else None), unloaded


def markdown(results: dict[float, list[Step]], memory_mb: int, step_s: int, retry_after: str) -> str:
    load = os.getloadavg()
    lines = [
        "# Load under a CPU quota (bench/bench_load.py)",
        "",
        f"Machine: {os.cpu_count()} cores, load average {load[0]:.1f} at the end (shared machine). "
        f"Memory limit {memory_mb} MB. locust headless, closed loop, {step_s} s per step; one short sentence "
        f"per request (`POST /invocations`). Clients {retry_after} Retry-After on 503.",
        "",
    ]
    for cpus, steps in results.items():
        best, unloaded = headline(steps)
        lines += [f"## {cpus} vCPU", ""]
        if best is not None:
            above = [s for s in steps if s.users > best.users]
            share = ", ".join(f"{s.users} users: {s.busy_share:.1%}" for s in above) or "none measured"
            lines += [
                f"Max throughput with p99 <= 2x unloaded p99 ({unloaded:.0f} ms): **{best.rps:.1f} req/s** at "
                f"{best.users} users (p99 {best.p99_ms:.0f} ms). 503 share above it: {share}.",
                "",
            ]
        lines += [
            "| users | ok req/s | p50 ms | p99 ms | 503 share | other errors | peak RSS MB | OOM kills |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        lines += [
            f"| {s.users} | {s.rps:.1f} | {s.p50_ms:.0f} | {s.p99_ms:.0f} | {s.busy_share:.1%} | {s.other} | "
            f"{s.rss_mb:.0f} | {s.oom_kills} |"
            for s in steps
        ]
        lines.append("")
    return "\n".join(lines)


def plot(results: dict[float, list[Step]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for cpus, steps in results.items():
        users = [s.users for s in steps]
        axes[0].plot(users, [s.rps for s in steps], marker="o", label=f"{cpus} vCPU")
        axes[1].plot(users, [s.p99_ms for s in steps], marker="o", label=f"{cpus} vCPU")
        axes[2].plot(users, [100 * s.busy_share for s in steps], marker="o", label=f"{cpus} vCPU")
    for ax, title in zip(axes, ("successful req/s", "p99 latency (ms)", "503 share (%)"), strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent users (closed loop)")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend()
    axes[1].set_yscale("log")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpus", type=float, nargs="+", default=[0.5, 1.0, 2.0])
    p.add_argument("--memory-mb", type=int, default=1024)
    p.add_argument("--users", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    p.add_argument("--step-s", type=int, default=15)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    p.add_argument("--retry-after", choices=["honor", "ignore"], default="honor", help="what clients do on a 503")
    p.add_argument("--name", default="load", help="output file stem (NAME.md, NAME.png)")
    args = p.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench_load needs root (it creates cgroups)")
    args.out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="bench-load-"))
    try:
        results = {
            cpus: run_quota(cpus, args.memory_mb, args.users, args.step_s, tmp, args.retry_after) for cpus in args.cpus
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    (args.out / f"{args.name}.md").write_text(markdown(results, args.memory_mb, args.step_s, args.retry_after))
    plot(results, args.out / f"{args.name}.png")
    print(f"wrote {args.out / args.name}.md and .png")


if __name__ == "__main__":
    main()
