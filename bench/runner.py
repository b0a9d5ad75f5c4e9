"""The harness every bench runs on: children under a CPU quota, a warm or cold page cache, interleaved rounds,
medians with their ranges, and the rows written as JSON and markdown.

Why one module: a figure is only as honest as the way it was taken, and each bench used to take it its own way
(its own spawn, its own medians, some variants in short processes of their own). Here:

- `Quota`: a cgroup v1 `cpu` group with a CFS quota (root); a child joins it before exec, so the whole start
  runs under it. One group per side when two sides must get the same CPUs at the same time.
- `evict` / `drop_page_cache`: a cold page cache, by file (posix_fadvise DONTNEED: exactly the files a start
  opens, found with `opened_files`) or for the whole machine (/proc/sys/vm/drop_caches).
- `order`: the variants' order per round, rotated, so a neighbour's burst or a drift hits every variant alike.
- `Child`: a long-lived child spoken to in JSON lines; warm figures come from children that stay up, asked in
  turn within each round (a fresh short process per variant measures its own scheduling luck).
- `lambda_start`: spawn → first answer through the real awslambdaric against the tests' runtime stub.
- `Stat`, `ratios`, `Results`: medians with min-max, ratios taken within a round, runs.json + results.md.

Stdlib only at import (handler/ is never imported here: it would set OPENBLAS_NUM_THREADS in this process, and
every baseline started from it would inherit it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CGROUP = Path("/sys/fs/cgroup/cpu")
MODEL = ROOT / "models" / "default"  # what `make setup` packs
OPTIMIZED = ROOT / "build" / "bench" / "model-optimized"  # the default model + `warmstart optimize`
FLOOR = ROOT / "build" / "bench" / "floor-ort"  # the tuned floor's build step on the default model
RESULTS = ROOT / "bench-results"
LAMBDA_MB_PER_VCPU = 1769
# Lambda's memory sizes for the vCPU shares the benches use.
LAMBDA_MB = {0.29: 512, 0.5: 884, 0.58: 1024, 1.0: 1769, 1.7: 3008, 2.0: 3538}
EVENT = {"inputs": ["A cold start is the time from nothing to the first answer."]}
_OURS = ("AWS_", "WARMSTART_", "OPENBLAS_", "OMP_")


def base_env(environ: dict[str, str] | None = None, **extra: str) -> dict[str, str]:
    """A child's environment: none of this shell's AWS_/WARMSTART_/thread variables, the repository on the path,
    no model hub."""
    env = {k: v for k, v in (os.environ if environ is None else environ).items() if not k.startswith(_OURS)}
    return {**env, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", **extra}


def lambda_env(vcpus: float, model: Path = MODEL, **extra: str) -> dict[str, str]:
    """As Lambda starts a function of `vcpus`' memory size on demand (no warm-up inference at init)."""
    return base_env(
        AWS_LAMBDA_FUNCTION_NAME="bench",
        AWS_LAMBDA_INITIALIZATION_TYPE="on-demand",
        AWS_LAMBDA_FUNCTION_MEMORY_SIZE=str(LAMBDA_MB.get(vcpus, round(vcpus * LAMBDA_MB_PER_VCPU))),
        WARMSTART_MODEL=str(model),
        **extra,
    )


def compile_bytecode(*dirs: Path) -> None:
    """Byte-compile `dirs` as the images do (their Dockerfiles run compileall): a child started with
    PYTHONDONTWRITEBYTECODE set would otherwise compile every handler module from source at each start."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", *map(str, dirs)], check=True)


def need_root() -> str | None:
    """Why quotas and cache drops cannot run here, or None."""
    if os.geteuid() != 0 or not CGROUP.is_dir():
        return f"needs root and a cgroup v1 cpu controller at {CGROUP}"
    return None


OWN_SHARES = 262_144  # cgroup v1's most: 256x a task at the default weight


class Quota:
    """A cgroup v1 cpu group with a CFS quota; a child joins it by writing its pid before exec."""

    def __init__(self, name: str = "", vcpus: float | None = None) -> None:
        self.path = CGROUP / f"warmstart-bench-{os.getpid()}{'-' + name if name else ''}"
        self.path.mkdir(exist_ok=True)
        (self.path / "cpu.cfs_period_us").write_text("100000")
        self.vcpus: float | None = None
        if vcpus is not None:
            self.set(vcpus)

    def set(self, vcpus: float) -> None:
        if not vcpus > 0:
            raise ValueError(f"a CPU quota is a positive number of vCPUs, not {vcpus!r}")
        (self.path / "cpu.cfs_quota_us").write_text(str(int(vcpus * 100000)))
        self.vcpus = vcpus

    def own(self, shares: int = OWN_SHARES) -> None:
        """Raise the group's cpu.shares, so the host's other jobs yield their CPUs to it: its quota's CPUs its own,
        as a Lambda's are. On a saturated host a group at the default weight gets about one task's share, however
        many of its threads could run: a start that overlaps two threads shows nothing there."""
        (self.path / "cpu.shares").write_text(str(int(shares)))

    def wrap(self, argv: Sequence[str]) -> list[str]:
        # sh joins the group, then execs the command: everything it starts runs under the quota.
        return ["sh", "-c", f'echo $$ > {self.path}/cgroup.procs && exec "$@"', "sh", *argv]

    def close(self) -> None:
        with contextlib.suppress(OSError):  # a child still in it (killed, not yet reaped): leave it
            self.path.rmdir()

    def __enter__(self) -> Quota:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def evict(paths: Iterable[str]) -> int:
    """Drop the files' clean, unmapped pages from the page cache; returns how many files were touched."""
    n = 0
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            n += 1
        finally:
            os.close(fd)
    return n


def drop_page_cache() -> None:
    """The whole machine's clean page cache (root). Coarser than `evict`: every neighbour pays for it too."""
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("1\n")


def opened_files(argv: Sequence[str], env: dict[str, str], cwd: Path = ROOT, event: Any = EVENT) -> set[str]:
    """Every regular file a Lambda start of `argv` opens (strace), plus the interpreter: what a cold start reads."""
    with tempfile.NamedTemporaryFile(prefix="strace-", suffix=".txt") as trace:
        lambda_start(["strace", "-f", "-qq", "-e", "trace=openat,open", "-o", trace.name, *argv], env, cwd, event)
        text = Path(trace.name).read_text(errors="replace")
    files = {os.path.realpath(sys.executable)}
    for m in re.finditer(r'open(?:at)?\([^"]*"([^"]+)"[^)]*\)\s*=\s*\d+', text):
        path = m.group(1)
        if not path.startswith(("/proc", "/sys", "/dev")) and os.path.isfile(path):
            files.add(os.path.realpath(path))
    return files


def cpu_time_ms(pid: int) -> float:
    """CPU time of a live process's threads so far (ns from schedstat): steadier than wall time on a shared host."""
    total = 0
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e6


def process_cpu_ms(pid: int) -> float:
    """User + system CPU of a process, every thread it ever had (utime + stime of /proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return math.nan


def lambda_start(
    argv: Sequence[str],
    env: dict[str, str],
    cwd: Path = ROOT,
    event: Any = EVENT,
    warm_calls: int = 0,
    warm_events: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Spawn a Lambda runtime client (`python -m awslambdaric HANDLER`, perhaps wrapped) against a fresh runtime
    stub and invoke `event` once: first_ms spawn → first answer; init_ms spawn → the runtime's first `GET /next`
    (Lambda's Init Duration); cpu_ms and peak RSS at the answer; then `warm_calls` more, their median warm_ms
    (or `warm_events`, name → event, in turn: each one's median in warm_ms_by; one not answered raises); the
    init report line if the handler printed one."""
    sys.path.insert(0, str(ROOT))
    from tests.integration.runtime_stub import RuntimeStub  # the integration tests' stub: one fake Runtime API

    with RuntimeStub() as stub:
        first_next: list[float] = []
        handler_cls = stub.server.RequestHandlerClass
        do_get = handler_cls.do_GET  # type: ignore[attr-defined]

        def timed_get(self: Any) -> None:
            if not first_next:
                first_next.append(time.perf_counter())
            do_get(self)

        handler_cls.do_GET = timed_get  # type: ignore[attr-defined]
        t0 = time.perf_counter()
        # Its own process group: strace's tracees (and sh's child) die with it, or they would hold the pipe open.
        proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env={**env, "AWS_LAMBDA_RUNTIME_API": stub.address},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            outcome = stub.invoke(event, timeout=600)
            first_ms = (time.perf_counter() - t0) * 1000
            cpu_ms, rss = cpu_time_ms(proc.pid), peak_rss_mb(proc.pid)
            events = warm_events or {"event": event}
            warm: dict[str, list[float]] = {name: [] for name in events}
            for _ in range(warm_calls if outcome.kind == "response" else 0):
                for name, each in events.items():
                    t1 = time.perf_counter()
                    reply = stub.invoke(each)
                    warm[name].append((time.perf_counter() - t1) * 1000)
                    if reply.kind != "response":
                        raise RuntimeError(f"{name}: {reply.body[:500]!r}")
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        logs = proc.communicate()[0].decode(errors="replace")
    if outcome.kind != "response":
        raise RuntimeError(f"{list(argv)}: {outcome.body[:500]!r}\n{logs[-3000:]}")
    init = next((json.loads(line) for line in logs.splitlines() if line.startswith('{"warmstart":"init"')), None)
    return {
        "first_ms": first_ms,
        "init_ms": (first_next[0] - t0) * 1000 if first_next else math.nan,
        "cpu_ms": cpu_ms,
        "peak_rss_mb": rss,
        "warm_ms": statistics.median(next(iter(warm.values()))) if warm_calls else math.nan,
        "warm_ms_by": {name: statistics.median(times) for name, times in warm.items() if times},
        "init": init,
        "body": outcome.body,
    }


class Child:
    """A long-lived child spoken to in JSON lines: one request a line on its stdin, one answer a line on its
    stdout starting with `mark` (other lines are the child's own output, passed over). The first answer is the
    child's own, once it is ready; `ready_ms` is spawn → that line."""

    def __init__(self, argv: Sequence[str], env: dict[str, str], mark: str, cwd: Path = ROOT) -> None:
        self.mark = mark.encode()
        self.err = tempfile.TemporaryFile()  # noqa: SIM115 (closed in close())
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.err,
            start_new_session=True,
        )
        self.hello = self._read()
        self.ready_ms = (time.perf_counter() - t0) * 1000

    @property
    def pid(self) -> int:
        return self.proc.pid

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.flush()
        return self._read()

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(self.mark):
                answer: dict[str, Any] = json.loads(line[len(self.mark) :])
                return answer
        self.err.seek(0)
        why = self.err.read().decode(errors="replace")[-3000:]
        self.close()
        raise RuntimeError(f"{self.proc.args!r} ended without an answer:\n{why}")

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout, self.err):
            if f is not None and not f.closed:
                with contextlib.suppress(OSError):  # a pipe the dead child left unread
                    f.close()


def order(names: Sequence[str], rnd: int) -> list[str]:
    """The variants' order in round `rnd`: rotated by one each round, reversed every other round, so every
    variant runs first, last and after each other one in turn."""
    if not names:
        return []
    k = rnd % len(names)
    turned = [*names[k:], *names[:k]]
    return turned if rnd % 2 == 0 else turned[::-1]


@dataclass(frozen=True)
class Stat:
    """A median with its range."""

    median: float
    lo: float
    hi: float
    n: int

    @classmethod
    def of(cls, xs: Iterable[float]) -> Stat:
        vals = [x for x in xs if not math.isnan(x)]
        if not vals:
            return cls(math.nan, math.nan, math.nan, 0)
        return cls(statistics.median(vals), min(vals), max(vals), len(vals))

    def fmt(self, digits: int = 0, unit: str = "") -> str:
        if not self.n:
            return "-"
        m = f"{self.median:,.{digits}f}{unit}"
        return m if self.n == 1 else f"{m} ({self.lo:,.{digits}f}-{self.hi:,.{digits}f})"


def ratios(rows: Sequence[dict[str, Any]], key: str, a: str, b: str, by: str = "variant", **match: Any) -> list[float]:
    """a's `key` over b's, one ratio per round in which both ran with the same `match` fields."""
    out = []
    for rnd in sorted({r["round"] for r in rows}):
        pick = [r for r in rows if r["round"] == rnd and all(r.get(k) == v for k, v in match.items())]
        xa = [r[key] for r in pick if r[by] == a]
        xb = [r[key] for r in pick if r[by] == b]
        if xa and xb and xb[0]:
            out.append(xa[0] / xb[0])
    return out


def fmt_ratio(xs: Sequence[float]) -> str:
    """The median of the rounds' ratios and their range: how far to trust it."""
    s = Stat.of(xs)
    if not s.n:
        return "-"
    return f"{s.median:.2f}x" + (f" ({s.lo:.2f}-{s.hi:.2f})" if s.n > 1 else "")


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


@dataclass
class Results:
    """A run's rows and what it ran on; `save` writes runs.json and results.md under `out`."""

    bench: str
    meta: dict[str, Any] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.meta = {
            "bench": self.bench,
            "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "cpus": os.cpu_count(),
            "load": round(os.getloadavg()[0], 1),
            "argv": sys.argv[1:],
            **self.meta,
        }

    def add(self, **row: Any) -> dict[str, Any]:
        self.rows.append(row)
        shown = " ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items() if k != "init")
        print(f"{self.bench}: {shown}"[:240], file=sys.stderr)
        return row

    def pick(self, **match: Any) -> list[dict[str, Any]]:
        return [r for r in self.rows if all(r.get(k) == v for k, v in match.items())]

    def stat(self, key: str, **match: Any) -> Stat:
        return Stat.of(r[key] for r in self.pick(**match) if key in r)

    def header(self) -> str:
        m = self.meta
        return (
            f"`{m['bench']}` {' '.join(m['argv'])}, {m['when']}, host {m['cpus']} CPUs shared with other jobs "
            f"(load average {m['load']} at the start); medians (min-max) over interleaved rounds."
        )

    def save(self, out: Path, markdown: str) -> None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "runs.json").write_text(json.dumps({"meta": self.meta, "rows": self.rows}, indent=1, default=str))
        (out / "results.md").write_text(self.header() + "\n\n" + markdown.rstrip() + "\n")
        print(self.header() + "\n\n" + markdown)
        print(f"written: {out / 'runs.json'}, {out / 'results.md'}", file=sys.stderr)


def parser(doc: str | None, rounds: int, out: str) -> argparse.ArgumentParser:
    """The flags every bench shares: --rounds and --out (where runs.json and results.md go)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=rounds, help="interleaved rounds (default %(default)s)")
    ap.add_argument("--out", type=Path, default=RESULTS / out, help="runs.json and results.md (default %(default)s)")
    return ap


def csv(text: str, valid: Iterable[str], what: str = "variants") -> list[str]:
    """A comma-separated choice from a closed set; an unknown name is refused with the valid ones."""
    names, allowed = [n for n in text.split(",") if n], list(valid)
    bad = [n for n in names if n not in allowed]
    if bad or not names:
        raise SystemExit(f"unknown {what} {bad or [text]}; valid: {', '.join(allowed)}")
    return names


def ref_checkout(ref: str, work: Path = ROOT / "build" / "bench") -> Path:
    """`handler/` as on git ref `ref`, extracted (no worktree): the `before` of a before/after run."""
    out = work / f"ref-{re.sub(r'[^A-Za-z0-9_.-]', '_', ref)}"
    if not (out / "handler" / "app.py").is_file():
        out.mkdir(parents=True, exist_ok=True)
        blob = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "handler"], check=True, capture_output=True)
        with tempfile.TemporaryFile() as f:
            f.write(blob.stdout)
            f.seek(0)
            with tarfile.open(fileobj=f) as tar:
                tar.extractall(out, filter="data")
    return out


def prepare_optimized(portable: Path = MODEL, model: Path = OPTIMIZED) -> Path:
    """An optimized copy of a packed model (portable files linked, not copied), as an image build makes it."""
    import shutil

    sys.path.insert(0, str(ROOT))
    from infra.pack.opt_layout import LAYOUT_VERSION
    from infra.pack.optimize import optimize  # deferred: pulls onnxruntime into this process
    from infra.pack.wordpiece import prove

    raw = json.loads((portable / "manifest.json").read_text())
    # The source and the layout optimize writes: a copy made before a layout change is made again.
    want = json.dumps({"manifest": raw, "layout": LAYOUT_VERSION})
    stamp = model / ".source-manifest.json"
    if stamp.is_file() and stamp.read_text() == want:
        return model
    shutil.rmtree(model, ignore_errors=True)
    model.mkdir(parents=True)
    for name in raw["files"]:
        os.link(portable / name, model / name)
    (model / "manifest.json").write_text(json.dumps(raw))
    optimize(model)
    prove(model)
    stamp.write_text(want)
    return model


def prepare_floor(packed: Path = MODEL, out: Path = FLOOR) -> Path:
    """The tuned floor's files for the packed model at `packed`, made by its own build script
    (bench/handlers/floor_ort_build.py, run as a script: the harness imports no bench module), once: kept while
    the source manifest and the installed onnxruntime are unchanged."""
    probe = [sys.executable, "-c", "import onnxruntime; print(onnxruntime.__version__)"]
    ort_version = subprocess.run(probe, check=True, capture_output=True, text=True).stdout.strip()
    want = json.dumps({"manifest": (packed / "manifest.json").read_text(), "onnxruntime": ort_version})
    stamp = out / ".source.json"
    if stamp.is_file() and stamp.read_text() == want:
        return out
    script = ROOT / "bench" / "handlers" / "floor_ort_build.py"
    subprocess.run([sys.executable, str(script), str(packed), str(out)], check=True, stdout=subprocess.DEVNULL)
    stamp.write_text(want)
    return out


@contextlib.contextmanager
def quotas(*names: str) -> Iterator[dict[str, Quota]]:
    """One cgroup per name, closed on the way out."""
    made = {n: Quota(n) for n in names}
    try:
        yield made
    finally:
        for q in made.values():
            q.close()
