"""Load under a CPU quota: the HTTP host (`python -m handler`) in a cgroup, closed-loop clients at rising concurrency.

    sudo .venv/bin/python bench/load/run.py [--quotas 1 2] [--users 1 8 32] [--duration 15]
        [--variants ours,main,ours+WARMSTART_BATCH_WAIT_MS=0] [--ref main] [--rounds 1]
        [--route /v1/embeddings] [--client builtin|locust]
        [--memory-mb 1024] [--retry-after honor|ignore] [--out bench/results] [--name load]

For each CPU quota: a cgroup (v1 `cpu` + `memory`, or v2) with that quota and the memory limit per variant;
each variant's server started inside its own (its worker pool and intra-op threads sized by what it reads
from its own cgroup): `ours` is this checkout, `main` is `handler/` as on git ref --ref (extracted with git
archive) serving the same model. Steps run interleaved, variant by variant at each concurrency, round by
round, so a noisy neighbour hurts every variant alike. Each step is a closed loop (each user sends its next
request when its last is answered; one keep-alive connection per user), one short sentence per request on
--route (OpenAI's `/v1/embeddings` by default, or `/invocations`). Per step: successful req/s, p50/p99 of all
answers, the non-200 share (503 apart), the server's CPU milliseconds per answered request (its process CPU
time over the step), its peak RSS, OOM kills. Writes NAME.md (tables), NAME.json (every step, for other
benches: bench/peers/run.py reads it) and NAME.png. The headline per quota: the highest throughput whose
p99 is at most twice the unloaded (1 user) p99.

`run_load(url, users, duration, payload)` is the closed loop alone, for any server (bench/peers/run.py
drives infinity-emb with it); it needs no root. `--client locust` drives the steps with locust instead
(bench/load/locustfile.py; heavier on the client's CPU).

Root only (cgroups). The clients run outside the cgroup, on the same machine: on a small shared machine their
own CPU use and the neighbours' show in the figures; the markdown notes the machine's cores and load.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psutil

ROOT = Path(__file__).resolve().parents[2]
LOCUSTFILE = ROOT / "bench" / "load" / "locustfile.py"
MODEL = ROOT / "models" / "default"
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
    variant: str = "ours"
    round: int = 0
    cpu_ms_per_ok: float | None = None  # the server's CPU time over the step / its successful answers

    @property
    def busy_share(self) -> float:
        return self.busy / self.requests if self.requests else 0.0

    @property
    def non_200_share(self) -> float:
        return (self.requests - self.ok) / self.requests if self.requests else 0.0


SENTENCES = [
    "how do I reset my password",
    "the quick brown fox jumps over the lazy dog",
    "serverless inference with a cold start at the floor of the stack",
    "what is the refund policy for annual plans",
    "can I move my subscription to another account without losing data",
    "embeddings for search",
]


def payloads(route: str, model: str = "all-minilm-l6-v2") -> list[bytes]:
    """One sentence per request, in the route's shape (OpenAI's, or the native `/invocations`)."""
    if route == "/v1/embeddings":
        return [json.dumps({"input": s, "model": model}).encode() for s in SENTENCES]
    return [json.dumps({"inputs": [s]}).encode() for s in SENTENCES]


async def _user(
    host: str, port: int, path: str, bodies: list[bytes], offset: int, until: float, out: dict[str, Any]
) -> None:
    """One closed-loop user: one keep-alive connection, the next request when the last is answered."""
    reader, writer = await asyncio.open_connection(host, port)
    heads = [
        (
            f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(b)}\r\n\r\n"
        ).encode()
        + b
        for b in bodies
    ]
    i = offset
    try:
        while time.perf_counter() < until:
            t0 = time.perf_counter()
            writer.write(heads[i % len(heads)])
            i += 1
            status_line = await reader.readline()
            if not status_line:
                raise ConnectionError("closed by the server")
            status = int(status_line.split()[1])
            length, close = 0, False
            while (line := await reader.readline()) not in (b"\r\n", b""):
                key, _, value = line.decode("latin-1").partition(":")
                key = key.strip().lower()
                if key == "content-length":
                    length = int(value.strip())
                elif key == "connection" and value.strip().lower() == "close":
                    close = True
            await reader.readexactly(length)
            out["latencies"].append((time.perf_counter() - t0) * 1000)
            out["status"][status] = out["status"].get(status, 0) + 1
            if close:
                writer.close()
                reader, writer = await asyncio.open_connection(host, port)
    except (OSError, ConnectionError, asyncio.IncompleteReadError, ValueError, IndexError) as e:
        out["errors"].append(type(e).__name__)
    finally:
        writer.close()


def run_load(url: str, users: int, duration: float, payload: bytes | list[bytes] | dict[str, Any]) -> dict[str, Any]:
    """A closed loop of `users` clients against `url` (http://host:port/path) for `duration` seconds, each
    POSTing `payload` (JSON bytes, a list of them taken in turn, or a dict) back to back on its own keep-alive
    connection. Returns requests, ok (200s), non_200 (answers other than 200 plus connection errors), busy
    (503s), status counts, rps (200s per second), p50_ms and p99_ms of all answers."""
    parsed = urlsplit(url)
    host, port, path = parsed.hostname or "127.0.0.1", parsed.port or 80, parsed.path or "/"
    if isinstance(payload, dict):
        bodies = [json.dumps(payload).encode()]
    elif isinstance(payload, bytes):
        bodies = [payload]
    else:
        bodies = list(payload)
    out: dict[str, Any] = {"latencies": [], "status": {}, "errors": []}

    async def main() -> float:
        t0 = time.perf_counter()
        until = t0 + duration
        await asyncio.gather(*(_user(host, port, path, bodies, u, until, out) for u in range(users)))
        return time.perf_counter() - t0

    seconds = asyncio.run(main())
    latencies = sorted(out["latencies"])
    status: dict[int, int] = out["status"]
    answered = len(latencies)
    ok = status.get(200, 0)

    def pct(q: float) -> float:
        return latencies[min(answered - 1, int(q * answered))] if answered else float("nan")

    return {
        "users": users,
        "seconds": round(seconds, 3),
        "requests": answered + len(out["errors"]),
        "ok": ok,
        "busy": status.get(503, 0),
        "non_200": answered - ok + len(out["errors"]),
        "status": {str(k): v for k, v in sorted(status.items())},
        "connection_errors": len(out["errors"]),
        "rps": ok / seconds if seconds else 0.0,
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
    }


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


@dataclass
class Server:
    variant: str
    cpus: float
    cgroup: Cgroup
    proc: subprocess.Popen[bytes]
    port: int


def start_server(variant: str, cpus: float, memory_mb: int, ref_root: Path | None) -> Server:
    """`python -m handler` of `variant` (ours: this checkout; main: --ref's handler/) in its own cgroup."""
    cgroup = Cgroup(f"warmstart-bench-{os.getpid()}-{variant}-{cpus}", cpus, memory_mb)
    port = free_port()
    base, *settings = variant.split("+")
    root = ROOT if base == "ours" else ref_root
    assert root is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WARMSTART_", "AWS_LAMBDA_"))}
    env.update(
        PORT=str(port), HOST="127.0.0.1", WARMSTART_LOG_LEVEL="error", PYTHONPATH=str(root), WARMSTART_MODEL=str(MODEL)
    )
    env.update(kv.split("=", 1) for kv in settings)  # e.g. ours+WARMSTART_BATCH_WAIT_MS=0
    proc = subprocess.Popen(
        [sys.executable, "-m", "handler"], cwd=root, env=env, preexec_fn=cgroup.enter, stdout=subprocess.DEVNULL
    )
    server = Server(variant, cpus, cgroup, proc, port)
    try:
        wait_ready(port, proc)
    except BaseException:
        stop_server(server)
        raise
    return server


def stop_server(server: Server) -> None:
    server.proc.terminate()
    try:
        server.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait()
    server.cgroup.remove()


def cpu_seconds(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return float(t.user + t.system)


def measure(
    server: Server, users: int, duration: int, route: str, client: str, tmp: Path, retry_after: str, round_: int
) -> Step:
    rss = RssPeak(server.proc.pid)
    cpu0 = cpu_seconds(server.proc.pid)
    if client == "locust":
        r = locust_step(server.port, users, duration, tmp, retry_after)
        rps = r["ok"] / r["seconds"]
    else:
        r = run_load(f"http://127.0.0.1:{server.port}{route}", users, duration, payloads(route))
        rps = r["rps"]
        r["other"] = r["non_200"] - r["busy"]
    cpu_ms = (cpu_seconds(server.proc.pid) - cpu0) * 1000
    step = Step(
        server.cpus, users, r["requests"], r["ok"], r["busy"], r["other"], rps, r["p50_ms"], r["p99_ms"],
        rss.stop(), server.cgroup.oom_kills(), server.variant, round_, cpu_ms / r["ok"] if r["ok"] else None,
    )  # fmt: skip
    print(
        f"{server.variant} cpus={server.cpus} users={users}: {step.rps:.1f} ok/s p50 {step.p50_ms:.1f} ms "
        f"p99 {step.p99_ms:.1f} ms non-200 {step.non_200_share:.1%} (503 {step.busy_share:.1%}) "
        f"cpu {step.cpu_ms_per_ok or float('nan'):.1f} ms/req rss {step.rss_mb:.0f} MB oom {step.oom_kills}",
        flush=True,
    )
    return step


def run_quota(
    cpus: float,
    memory_mb: int,
    users: list[int],
    duration: int,
    tmp: Path,
    retry_after: str,
    variants: list[str] | None = None,
    ref_root: Path | None = None,
    rounds: int = 1,
    route: str = "/invocations",
    client: str = "builtin",
) -> list[Step]:
    """Every variant's server at this quota, started once; the steps interleaved variant by variant at each
    concurrency (the order reversed every other round)."""
    variants = variants or ["ours"]
    servers: list[Server] = []
    steps: list[Step] = []
    try:
        for v in variants:
            servers.append(start_server(v, cpus, memory_mb, ref_root))
        for server in servers:  # warm: the first requests after init, connection set-up
            run_load(f"http://127.0.0.1:{server.port}{route}", 1, 2, payloads(route))
        for r in range(rounds):
            for n in users:
                for server in servers if r % 2 == 0 else servers[::-1]:
                    steps.append(measure(server, n, duration, route, client, tmp, retry_after, r))
                    if server.proc.poll() is not None:
                        raise RuntimeError(f"{server.variant} exited with {server.proc.returncode}")
    finally:
        for server in servers:
            stop_server(server)
    return steps


def _median(values: list[float]) -> float:
    import statistics

    return statistics.median(values) if values else float("nan")


def summary(steps: list[Step]) -> list[Step]:
    """One step per (variant, quota, users): the median over rounds of each figure (counts summed)."""
    groups: dict[tuple[str, float, int], list[Step]] = {}
    for s in steps:
        groups.setdefault((s.variant, s.cpus, s.users), []).append(s)
    out = []
    for (variant, cpus, users), g in groups.items():
        cpu = [s.cpu_ms_per_ok for s in g if s.cpu_ms_per_ok is not None]
        step = Step(
            cpus, users, sum(s.requests for s in g), sum(s.ok for s in g), sum(s.busy for s in g),
            sum(s.other for s in g), _median([s.rps for s in g]), _median([s.p50_ms for s in g]),
            _median([s.p99_ms for s in g]), max(s.rss_mb for s in g), max(s.oom_kills for s in g), variant,
            len(g), _median(cpu) if cpu else None,
        )  # fmt: skip
        out.append(step)
    return out


def headline(steps: list[Step]) -> tuple[Step | None, float]:
    """The step with the highest throughput whose p99 is at most twice the unloaded (1 user) p99."""
    unloaded = steps[0].p99_ms
    within = [s for s in steps if s.p99_ms <= 2 * unloaded and s.other == 0]
    return (max(within, key=lambda s: s.rps) if within else None), unloaded


def markdown(steps: list[Step], memory_mb: int, duration: int, retry_after: str, route: str, rounds: int) -> str:
    """Tables per quota (medians over rounds), each variant's row beside the others', and ours over main."""
    load = os.getloadavg()
    rows = summary(steps)
    lines = [
        "# Load under a CPU quota (bench/load/run.py)",
        "",
        f"Machine: {os.cpu_count()} cores, load average {load[0]:.1f} at the end (shared machine). "
        f"Memory limit {memory_mb} MB. Closed loop, {duration} s per step, {rounds} round(s) interleaved "
        f"(medians); one short sentence per request (`POST {route}`). Clients {retry_after} Retry-After on 503 "
        "(locust only). CPU ms/req: the server process's CPU time over the step per 200 answer.",
        "",
    ]
    for cpus in dict.fromkeys(s.cpus for s in rows):
        at = [s for s in rows if s.cpus == cpus]
        lines += [f"## {cpus:g} vCPU", ""]
        for variant in dict.fromkeys(s.variant for s in at):
            mine = sorted((s for s in at if s.variant == variant), key=lambda s: s.users)
            best, unloaded = headline(mine)
            if best is not None:
                lines.append(
                    f"- {variant}: max throughput with p99 <= 2x unloaded p99 ({unloaded:.0f} ms): "
                    f"**{best.rps:.1f} req/s** at {best.users} users; "
                    f"at {mine[-1].users} users {mine[-1].rps / mine[0].rps:.2f}x its own 1-user req/s."
                )
        lines += [
            "",
            "| variant | users | ok req/s | p50 ms | p99 ms | non-200 | 503 | CPU ms/req | peak RSS MB | OOM |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for s in sorted(at, key=lambda s: (s.users, s.variant)):
            cpu = f"{s.cpu_ms_per_ok:.1f}" if s.cpu_ms_per_ok is not None else "-"
            lines.append(
                f"| {s.variant} | {s.users} | {s.rps:.1f} | {s.p50_ms:.1f} | {s.p99_ms:.1f} | {s.non_200_share:.1%} | "
                f"{s.busy_share:.1%} | {cpu} | {s.rss_mb:.0f} | {s.oom_kills} |"
            )
        variants = list(dict.fromkeys(s.variant for s in at))
        if "ours" in variants and len(variants) > 1:
            base = next(v for v in variants if v != "ours")
            lines += ["", f"ours / {base} (same round's medians): "]
            parts = []
            for n in sorted({s.users for s in at}):
                o = next((s for s in at if s.variant == "ours" and s.users == n), None)
                b = next((s for s in at if s.variant == base and s.users == n), None)
                if o and b and b.rps:
                    parts.append(f"{n} users: req/s {o.rps / b.rps:.2f}x, p50 {o.p50_ms / b.p50_ms:.2f}x")
            lines.append("; ".join(parts) + ".")
        lines.append("")
    return "\n".join(lines)


def plot(steps: list[Step], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = summary(steps)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for key in dict.fromkeys((s.variant, s.cpus) for s in rows):
        line = sorted((s for s in rows if (s.variant, s.cpus) == key), key=lambda s: s.users)
        users = [s.users for s in line]
        label = f"{key[0]} {key[1]:g} vCPU"
        axes[0].plot(users, [s.rps for s in line], marker="o", label=label)
        axes[1].plot(users, [s.p99_ms for s in line], marker="o", label=label)
        axes[2].plot(users, [100 * s.non_200_share for s in line], marker="o", label=label)
    for ax, title in zip(axes, ("successful req/s", "p99 latency (ms)", "non-200 share (%)"), strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent users (closed loop)")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend()
    axes[1].set_yscale("log")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def valid_variant(variant: str) -> bool:
    base, *settings = variant.split("+")
    return base in ("ours", "main") and all("=" in kv for kv in settings)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quotas", "--cpus", dest="quotas", type=float, nargs="+", default=[1.0, 2.0])
    p.add_argument("--memory-mb", type=int, default=1024)
    p.add_argument("--users", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--duration", "--step-s", dest="duration", type=int, default=15, help="seconds per step")
    p.add_argument(
        "--variants",
        default="ours",
        help="comma-separated: ours (this checkout), main (--ref's), each optionally +KEY=VALUE (its server's env)",
    )
    p.add_argument("--ref", default="main", help="git ref of the `main` variant")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--route", default="/v1/embeddings", choices=["/v1/embeddings", "/invocations"])
    p.add_argument("--client", default="builtin", choices=["builtin", "locust"])
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    p.add_argument("--retry-after", choices=["honor", "ignore"], default="honor", help="what locust does on a 503")
    p.add_argument("--name", default="load", help="output file stem (NAME.md, NAME.json, NAME.png)")
    args = p.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench_load needs root (it creates cgroups)")
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if bad := [v for v in variants if not valid_variant(v)]:
        sys.exit(f"--variants: {bad}; valid: ours or main, each optionally +KEY=VALUE (its server's env)")
    if args.client == "locust" and args.route != "/invocations":
        sys.exit("--client locust posts to /invocations: add --route /invocations")
    args.out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="bench-load-"))
    ref_root = None
    if any(v.split("+")[0] == "main" for v in variants):
        from bench.runner import ref_checkout

        ref_root = ref_checkout(args.ref, ROOT / "build" / "bench")
    steps: list[Step] = []
    try:
        for cpus in args.quotas:
            steps += run_quota(
                cpus, args.memory_mb, args.users, args.duration, tmp, args.retry_after,
                variants, ref_root, args.rounds, args.route, args.client,
            )  # fmt: skip
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if steps:
            (args.out / f"{args.name}.json").write_text(
                json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "steps": [asdict(s) for s in steps]})
            )
    (args.out / f"{args.name}.md").write_text(
        markdown(steps, args.memory_mb, args.duration, args.retry_after, args.route, args.rounds)
    )
    plot(steps, args.out / f"{args.name}.png")
    print(f"wrote {args.out / args.name}.md, .json and .png")


if __name__ == "__main__":
    main()
