"""`warmstart tune`: which memory size? Cold and warm latency under each size's real CPU quota, and cost.

What AWS Lambda Power Tuning does, locally and with the cold start it leaves out: for each memory size the
local Lambda runs instances under that size's cgroup quota (memory/1,769 vCPU) and memory limit, K cold
starts (instances retired in between) and M warm invocations of one payload. Cost per million invocations
is Lambda's request price plus GB-seconds of Billed Duration, INIT included for on-demand cold starts
(Lambda bills it since August 2025), at `--cold-fraction` cold starts; SnapStart (`--snapshot`) pays a
per-GB restore charge instead. Writes a markdown table and a PNG plot, and recommends the cheapest size
that meets a latency target.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from handler.core.cpu import LAMBDA_MB_PER_VCPU
from infra.local.cgroups import vcpus_for
from infra.local.config import LocalLambdaConfig

# Lambda prices, us-east-1, first pricing tier, as published on https://aws.amazon.com/lambda/pricing/
# (checked 2025-11-01). Other regions and the volume tiers differ: these are for comparing sizes.
PRICES_AS_OF = "2025-11-01"
PRICE_PER_REQUEST = 0.20 / 1_000_000
PRICE_PER_GB_S = {"x86_64": 0.0000166667, "arm64": 0.0000133334}
SNAPSTART_RESTORE_PER_GB = 0.0001397998  # per GB restored (x86_64; the cache charge is per hour, left out)

DEFAULT_SIZES = (512, 1024, 1769, 3008)
MIN_MB, MAX_MB = 128, 10_240  # Lambda's memory sizes
MAX_COLD, MAX_WARM = 1000, 100_000
MAX_PAYLOAD = 6_291_456  # Lambda's synchronous request limit (infra.local.invocation.MAX_REQUEST_PAYLOAD)
Metric = Literal["warm-p50", "warm-p99", "cold-p50"]
METRICS: tuple[Metric, ...] = ("warm-p50", "warm-p99", "cold-p50")


class TuneError(ValueError):
    """Arguments `warmstart tune` refuses, or a measurement that could not run: one line, exit 1."""


@dataclass
class SizeResult:
    memory_mb: int
    vcpus: float
    cold_ms: list[float] = field(default_factory=list)  # Init (or Restore) Duration + first Duration
    cold_billed_ms: list[int] = field(default_factory=list)
    warm_ms: list[float] = field(default_factory=list)  # REPORT Duration of warm invocations
    warm_billed_ms: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def cold_p50(self) -> float:
        return statistics.median(self.cold_ms) if self.cold_ms else math.nan

    @property
    def warm_p50(self) -> float:
        return statistics.median(self.warm_ms) if self.warm_ms else math.nan

    @property
    def warm_p99(self) -> float:
        return percentile(self.warm_ms, 0.99)

    def metric(self, name: Metric) -> float:
        return {"warm-p50": self.warm_p50, "warm-p99": self.warm_p99, "cold-p50": self.cold_p50}[name]

    def cost_per_million(self, arch: str, cold_fraction: float, snapshot: bool) -> float:
        """Dollars per million invocations, `cold_fraction` of them cold starts."""
        gb = self.memory_mb / 1024
        if not self.warm_billed_ms:
            return math.nan
        warm = PRICE_PER_REQUEST + gb * statistics.mean(self.warm_billed_ms) / 1000 * PRICE_PER_GB_S[arch]
        cold = warm
        if self.cold_billed_ms:
            cold = PRICE_PER_REQUEST + gb * statistics.mean(self.cold_billed_ms) / 1000 * PRICE_PER_GB_S[arch]
            if snapshot:
                cold += gb * SNAPSTART_RESTORE_PER_GB
        return 1_000_000 * ((1 - cold_fraction) * warm + cold_fraction * cold)


@dataclass
class TuneResult:
    sizes: list[SizeResult]
    payload_bytes: int
    cold_fraction: float
    snapshot: bool
    target_ms: float | None
    metric: Metric
    host_cpus: int
    cgroups: str

    def recommendation(self) -> tuple[SizeResult | None, str]:
        usable = [s for s in self.sizes if not s.errors and not math.isnan(s.metric(self.metric))]
        if not usable:
            return None, "no size ran without errors"
        by_cost = sorted(usable, key=lambda s: s.cost_per_million("x86_64", self.cold_fraction, self.snapshot))
        if self.target_ms is None:
            best = by_cost[0]
            return best, f"{best.memory_mb} MB: the cheapest (no --target-ms given)"
        meeting = [s for s in by_cost if s.metric(self.metric) <= self.target_ms]
        if meeting:
            best = meeting[0]
            return best, f"{best.memory_mb} MB: the cheapest with {self.metric} ≤ {self.target_ms:g} ms"
        fastest = min(usable, key=lambda s: s.metric(self.metric))
        return None, f"no size meets {self.metric} ≤ {self.target_ms:g} ms; the fastest is {fastest.memory_mb} MB"

    def markdown(self) -> str:
        cold_name = "restore p50" if self.snapshot else "cold p50"
        lines = [
            f"| memory (MB) | vCPU | {cold_name} (ms) | warm p50 (ms) | warm p99 (ms) "
            "| $/1M x86_64 | $/1M arm64 | errors |",
            "|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for s in self.sizes:
            x86 = s.cost_per_million("x86_64", self.cold_fraction, self.snapshot)
            arm = s.cost_per_million("arm64", self.cold_fraction, self.snapshot)
            lines.append(
                f"| {s.memory_mb} | {s.vcpus:.2f} | {s.cold_p50:.0f} | {s.warm_p50:.1f} | {s.warm_p99:.1f} "
                f"| {x86:.2f} | {arm:.2f} | {len(s.errors) or ''} |"
            )
        _best, why = self.recommendation()
        lines += [
            "",
            f"Recommendation: {why}.",
            "",
            f"Cost: request price + GB-s of Billed Duration at {self.cold_fraction:.1%} cold starts"
            + (" (SnapStart restore charge per GB included)" if self.snapshot else " (INIT billed)")
            + f"; us-east-1 prices as of {PRICES_AS_OF}. arm64 applies arm64 prices to durations measured"
            f" on this host ({self.host_cpus} cores, {self.cgroups}).",
        ]
        return "\n".join(lines) + "\n"

    def to_json(self) -> str:
        best, why = self.recommendation()
        data: dict[str, Any] = asdict(self)
        data["recommendation"] = {"memory_mb": best.memory_mb if best else None, "why": why}
        return json.dumps(data, indent=2)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


class ProgressBar:
    """One line on stderr, redrawn in place on a terminal (a line per step otherwise)."""

    def __init__(self, total: int, width: int = 30) -> None:
        self.total, self.width, self.done = total, width, 0
        self.tty = sys.stderr.isatty()
        self.started = time.perf_counter()

    def advance(self, label: str) -> None:
        self.done += 1
        filled = self.width * self.done // max(1, self.total)
        bar = "#" * filled + "." * (self.width - filled)
        text = f"[{bar}] {self.done}/{self.total} {label} ({time.perf_counter() - self.started:.0f} s)"
        sys.stderr.write(f"\r\x1b[K{text}" if self.tty else f"{text}\n")
        if self.tty and self.done >= self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def measure(
    base: LocalLambdaConfig, sizes: list[int], payload: bytes, cold: int, warm: int, progress: ProgressBar | None
) -> tuple[list[SizeResult], str]:
    from dataclasses import replace

    from infra.cli.demo import connect, post
    from infra.local.server import LocalLambda

    results = []
    cgroups = "cgroups: none"
    path = f"/2015-03-31/functions/{base.function_name}/invocations"
    for size in sizes:
        result = SizeResult(size, vcpus_for(size))
        local = LocalLambda(replace(base, memory_mb=size, max_concurrency=1, port=0))
        local.start()
        cgroups = local.pool.cgroups.describe(size).split(";")[0]
        conn = None
        try:
            url = urlsplit(local.endpoint)
            conn = connect(url.hostname or "127.0.0.1", url.port or 80, timeout=base.timeout_s + 60)

            def once(conn: Any = conn, local: LocalLambda = local, result: SizeResult = result) -> Any:
                _ms, headers, body = post(conn, path, payload)
                request_id = headers.get("x-amzn-requestid")
                inv = next((i for i in reversed(local.history) if i.request_id == request_id), None)
                if inv is None:  # refused by the Invoke API, or init failed/timed out: no REPORT to read
                    why = headers.get("x-amzn-errortype") or body.decode("utf-8", "replace")[:200]
                    mb = result.memory_mb
                    raise TuneError(f"{mb} MB: the invocation failed before reaching the function ({why})")
                if "x-amz-function-error" in headers:
                    result.errors.append(body.decode("utf-8", "replace")[:200])
                return inv

            if base.snapshot:  # the template's own init is not a cold start anyone waits for again
                once()
            for _ in range(cold):
                local.retire_idle()
                inv = once()
                init = (inv.restore_duration_ms if base.snapshot else inv.init_duration_ms) or 0.0
                result.cold_ms.append(init + inv.duration_ms)
                restore_billed = math.ceil(inv.restore_duration_ms or 0.0) if base.snapshot else 0
                result.cold_billed_ms.append(inv.billed_ms + restore_billed)
                if progress:
                    progress.advance(f"{size} MB cold")
            for i in range(warm):
                inv = once()
                result.warm_ms.append(inv.duration_ms)
                result.warm_billed_ms.append(inv.billed_ms)
                if progress and (i + 1) % max(1, warm // 5) == 0:
                    progress.advance(f"{size} MB warm {i + 1}/{warm}")
        finally:
            if conn is not None:
                conn.close()  # on a TuneError too: no socket left open
            local.stop()
        results.append(result)
    return results, cgroups


def plot(result: TuneResult, path: Path) -> None:
    import matplotlib  # deferred: only `tune` draws, and matplotlib's import is ~0.5 s

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [s.memory_mb for s in result.sizes]
    fig, latency = plt.subplots(figsize=(7, 4.2))
    cold_name = "restore p50" if result.snapshot else "cold p50"
    latency.plot(sizes, [s.cold_p50 for s in result.sizes], "o-", label=cold_name)
    latency.plot(sizes, [s.warm_p50 for s in result.sizes], "s-", label="warm p50")
    latency.plot(sizes, [s.warm_p99 for s in result.sizes], "^--", label="warm p99")
    latency.set_xlabel("memory size (MB)")
    latency.set_ylabel("ms")
    latency.set_yscale("log")
    cost = latency.twinx()
    cost.plot(sizes, [s.cost_per_million("x86_64", result.cold_fraction, result.snapshot) for s in result.sizes],
              "k:", label="$/1M x86_64")  # fmt: skip
    cost.plot(sizes, [s.cost_per_million("arm64", result.cold_fraction, result.snapshot) for s in result.sizes],
              "c:", label="$/1M arm64")  # fmt: skip
    cost.set_ylabel("$ per million invocations")
    handles = latency.get_legend_handles_labels()[0] + cost.get_legend_handles_labels()[0]
    latency.legend(handles, [str(h.get_label()) for h in handles], fontsize=8, loc="upper center")
    latency.set_title(f"warmstart tune ({result.recommendation()[1]})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from infra.cli.local import add_function_options

    p = sub.add_parser("tune", help="pick a memory size: cold/warm latency under each size's CPU quota, and cost")
    add_function_options(p)
    p.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)), help="MB list (default: %(default)s)")
    p.add_argument("--cold", type=int, default=5, help="cold starts per size (default: 5)")
    p.add_argument("--warm", type=int, default=50, help="warm invocations per size (default: 50)")
    p.add_argument("--payload", default='{"inputs": ["warmstart tune"]}', help="JSON event or @file")
    p.add_argument("--target-ms", type=float, help="latency target for the recommendation")
    p.add_argument("--target-metric", choices=METRICS, default="warm-p99", help="(default: warm-p99)")
    p.add_argument("--cold-fraction", type=float, default=0.01, help="share of cold invocations (default: 0.01)")
    p.add_argument("--out", default="tune", help="directory for tune.md, tune.png, tune.json (default: tune)")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG")
    p.set_defaults(func=run)


def host_sizes(requested: list[int], explicit: bool) -> list[int]:
    """The default sizes are capped by the host: a quota above its cores gives no more CPU."""
    cores = len(os.sched_getaffinity(0))
    if explicit:
        return requested
    return [s for s in requested if s / LAMBDA_MB_PER_VCPU <= cores] or requested[:1]


def parse_sizes(raw: str) -> list[int]:
    try:
        sizes = [int(s) for s in raw.split(",") if s.strip()]
    except ValueError:
        sizes = []
    if not sizes:
        raise TuneError(
            f"--sizes {raw!r}: not a comma-separated list of memory sizes; valid: MB in {MIN_MB}..{MAX_MB}, "
            "e.g. 512,1024"
        )
    for size in sizes:
        if not MIN_MB <= size <= MAX_MB:
            raise TuneError(f"--sizes {raw!r}: {size} MB is outside Lambda's {MIN_MB}..{MAX_MB} MB")
    return sizes


def check_counts(args: argparse.Namespace) -> None:
    """The numbers that would otherwise fail mid-run or give meaningless costs (NaN, negative)."""
    if not 0 <= args.cold <= MAX_COLD:
        raise TuneError(f"--cold {args.cold}: valid: 0..{MAX_COLD}")
    if not 1 <= args.warm <= MAX_WARM:
        raise TuneError(f"--warm {args.warm}: valid: 1..{MAX_WARM} (costs are computed from warm invocations)")
    if not 0 <= args.cold_fraction <= 1:  # NaN fails too
        raise TuneError(f"--cold-fraction {args.cold_fraction:g}: valid: 0..1 (the share of cold invocations)")
    if args.target_ms is not None and not 0 < args.target_ms < math.inf:
        raise TuneError(f"--target-ms {args.target_ms:g}: valid: a positive number of milliseconds")


def read_payload(raw: str) -> bytes:
    """The event: JSON, at most Lambda's 6 MB (else the Invoke API refuses every call)."""
    where = f"--payload {raw}" if raw.startswith("@") else "--payload"
    try:
        payload = (Path(raw[1:]).read_bytes() if raw.startswith("@") else raw.encode()).strip()
    except OSError as e:
        raise TuneError(f"{where}: {e.strerror}") from None
    if len(payload) > MAX_PAYLOAD:
        raise TuneError(f"{where}: {len(payload)} bytes; Lambda accepts at most {MAX_PAYLOAD}")
    try:
        json.loads(payload or b"{}")
    except (ValueError, UnicodeDecodeError) as e:
        raise TuneError(f"{where}: not a JSON event ({e})") from None
    except RecursionError:
        raise TuneError(f"{where}: not a JSON event (nested too deeply)") from None
    return payload


def check_out(out: Path) -> None:
    """--out must be (or be creatable as) a directory: checked before minutes of measuring, not after."""
    existing = out
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise TuneError(f"--out {out}: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise TuneError(f"--out {out}: {existing} is not writable")


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except TuneError as e:
        print(f"warmstart tune: {e}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace) -> int:
    from infra.cli.local import config_from_args

    requested = parse_sizes(args.sizes)
    check_counts(args)
    payload = read_payload(args.payload)
    check_out(Path(args.out))
    sizes = host_sizes(requested, args.sizes != ",".join(map(str, DEFAULT_SIZES)))
    try:
        config = config_from_args(args)
    except ValueError as e:  # LocalLambdaConfig's own range checks (max_concurrency, memory, ...)
        raise TuneError(str(e)) from None
    steps = len(sizes) * (args.cold + min(args.warm, 5))
    progress = ProgressBar(steps)
    measured, cgroups = measure(config, sizes, payload, args.cold, args.warm, progress)
    result = TuneResult(
        sizes=measured,
        payload_bytes=len(payload),
        cold_fraction=args.cold_fraction,
        snapshot=config.snapshot,
        target_ms=args.target_ms,
        metric=args.target_metric,
        host_cpus=len(os.sched_getaffinity(0)),
        cgroups=cgroups,
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table = result.markdown()
    (out / "tune.md").write_text(table)
    (out / "tune.json").write_text(result.to_json())
    if not args.no_plot:
        plot(result, out / "tune.png")
    print(table, end="")
    print(f"\nwrote {out / 'tune.md'}, {out / 'tune.json'}" + ("" if args.no_plot else f", {out / 'tune.png'}"))
    return 0 if all(not s.errors for s in measured) else 1
