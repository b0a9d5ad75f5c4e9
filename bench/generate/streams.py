"""Issue 35 item 1: many streams on the HTTP host sharing the decode steps (handler.backends.genai_batch).

The real host process (`python -m handler`, HTTP mode) serves a packed Qwen3-shaped chat model under a CPU quota
(a cgroup of its own, --vcpus); 1, 8 and 32 closed-loop clients each stream --requests completions
(`/invocations`, `"stream": true`, greedy, --max-tokens tokens, a short distinct prompt each) and time every
server-sent event. Per level: aggregate generated tokens/s (all tokens over the wall time of the level), p50 and
p99 time between tokens (the gaps between a stream's events after its first, each shared by the tokens its event
carries), time to the first token, the server's CPU time per generated token, the count of answers other
than 200, and the server's peak RSS (VmHWM) after the level (the host's life so far: levels run in order).

Variants, each one long-lived host started once (rounds interleaved, order rotated round by round):
- `batch`: WARMSTART_GENAI_BATCH=--rows (continuous batching; the queue WARMSTART_GENAI_QUEUE=--rows);
- `single`: WARMSTART_GENAI_BATCH=1, onnxruntime-genai's one generator per request (today's engine);
- `baseline`: the `batch` variant run from `handler/` as on git ref --baseline (e.g. `main`; extracted by
  bench.runner.ref_checkout), so a change to the engine is timed against the code before it in the same rounds;
- `llama`: llama-server with --parallel = the most clients, on --gguf (made from the same directory by
  bench/generate/peers.py prepare), when /work/cache/llama-server/READY exists (bench/generate/build_llama_server.sh;
  else the table says it was not run).

Usage: .venv/bin/python bench/generate/streams.py --pack DIR [--rounds 3] [--vcpus 2] [--levels 1,8,32]
       [--max-tokens 32] [--requests 2] [--rows 32] [--kv-tokens 32768] [--single-up-to 8] [--baseline REF] [--own-cpus]
       [--perf CLIENTS]

--perf: after the rounds, one more level of CLIENTS clients on each server of ours under `perf record` (software
sampling, every thread): the share of its CPU samples in ONNX Runtime, the kernel (thread-pool wake-ups, page
faults), libc, the Python interpreter, numpy and tokenizers (the Python around the model runs: sampling,
detokenizing, the SSE writes, the scheduler).
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for `bench.runner`

from bench.runner import (
    ROOT,
    Results,
    Stat,
    base_env,
    fmt_ratio,
    need_root,
    order,
    parser,
    peak_rss_mb,
    quotas,
    ratios,
    ref_checkout,
    table,
)

LLAMA = Path("/work/cache/llama-server")
TEXT = "the sea is blue and deep and wide . write a short poem about a quiet lambda function in the cloud"
WORDS = TEXT.split(" ")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(port: int, proc: subprocess.Popen[bytes], path: str, timeout_s: float = 600) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit(f"the server on :{port} exited with {proc.returncode}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", path)
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"the server on :{port} was not ready in {timeout_s:.0f} s")


class Server:
    def __init__(
        self, name: str, argv: list[str], env: dict[str, str], port: int, health: str, kind: str, cwd: Path = ROOT
    ) -> None:
        self.name, self.port, self.kind = name, port, kind
        log = open(ROOT / "build" / f"streams-{name}.log", "wb")  # noqa: SIM115  # held for the server's life
        self.proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=cwd)
        wait_ready(port, self.proc, health)

    def cpu_s(self) -> float:
        """The server's CPU time so far (user + system, every thread; `sh` execs it, so the pid is its own)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def one_stream(server: Server, prompt: str, max_tokens: int) -> dict[str, Any]:
    """One streamed completion: its status, event times (s) and token count."""
    if server.kind == "llama":
        path = "/completion"
        body = {"prompt": prompt, "n_predict": max_tokens, "temperature": 0, "stream": True, "ignore_eos": True}
        body["return_tokens"] = True  # counted by ids: a random model's tokens are often part of a character
    else:
        path = "/invocations"
        body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=600)
    started = time.perf_counter()
    conn.request("POST", path, json.dumps(body), {"content-type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        resp.read()
        return {"status": resp.status, "times": [], "counts": [], "tokens": 0, "started": started}
    times: list[float] = []
    counts: list[int] = []  # tokens per event: the detokenizer holds a partial character's tokens for one event
    tokens = 0
    while True:
        line = resp.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        piece = json.loads(data)
        n = len(piece.get("token_ids" if server.kind != "llama" else "tokens") or [])
        if n:
            times.append(time.perf_counter())
            counts.append(n)
            tokens += n
        if server.kind == "llama" and piece.get("stop"):
            # A token held as part of a character is sent later without its id: the final count is the server's
            tokens = max(tokens, int(piece.get("tokens_predicted") or 0))
            break
    conn.close()
    return {"status": 200, "times": times, "counts": counts, "tokens": tokens, "started": started}


def level(server: Server, clients: int, requests: int, max_tokens: int) -> dict[str, float]:
    results: list[dict[str, Any]] = []
    lock = threading.Lock()

    def client(i: int) -> None:
        for r in range(requests):
            words = [WORDS[(i * 7 + r * 3 + k) % len(WORDS)] for k in range(12)]
            got = one_stream(server, f"{i} {r} " + " ".join(words), max_tokens)
            with lock:
                results.append(got)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    t0, cpu0 = time.perf_counter(), server.cpu_s()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall, cpu = time.perf_counter() - t0, server.cpu_s() - cpu0
    # Time between tokens: an event's gap shared by the tokens it carries (a held partial character's tokens
    # arrive together), each counted once.
    gaps = [
        (b - a) / n
        for r in results
        for a, b, n in zip(r["times"], r["times"][1:], r["counts"][1:], strict=False)
        for _ in range(n)
    ]
    firsts = [r["times"][0] - r["started"] for r in results if r["times"]]
    q = statistics.quantiles(gaps, n=100) if len(gaps) >= 2 else [float("nan")] * 99
    return {
        "tok_s": sum(r["tokens"] for r in results) / wall,
        "tbt_p50_ms": statistics.median(gaps) * 1000 if gaps else float("nan"),
        "tbt_p99_ms": q[98] * 1000,
        "ttft_p50_ms": statistics.median(firsts) * 1000 if firsts else float("nan"),
        "non_200": float(sum(r["status"] != 200 for r in results)),
        "tokens": float(sum(r["tokens"] for r in results)),
        "cpu_ms_per_token": cpu * 1000 / max(1, sum(r["tokens"] for r in results)),
        "peak_rss_mb": peak_rss_mb(server.proc.pid),
    }


# perf's shared objects, grouped (the first group whose key a name holds: numpy's and tokenizers' extension
# modules before the interpreter's own): where a server's CPU goes (its kernels, the OS, the Python around them)
PERF_GROUPS = (
    ("ONNX Runtime", ("onnxruntime",)),
    ("kernel", ("[kernel",)),
    ("numpy", ("_multiarray", "_generator", "numpy", "_pcg64", "_bounded")),
    ("tokenizers", ("tokenizers",)),
    ("libc", ("libc.so", "libstdc++", "libgcc", "libm.so", "ld-linux")),
    ("Python", ("libpython", "python", ".cpython-")),
)


def perf_shares(server: Server, clients: int, requests: int, max_tokens: int) -> dict[str, float]:
    """One more level with `perf record` (software sampling: no HW counters on a VM) on the server's process,
    every thread (threads started later are followed): the % of its samples in each PERF_GROUPS group."""
    data = ROOT / "build" / f"streams-{server.name}.perf.data"
    argv = ["perf", "record", "-q", "-F", "499", "-p", str(server.proc.pid), "-o", str(data)]
    rec = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # attached before the level's first request
    level(server, clients, requests, max_tokens)
    rec.send_signal(signal.SIGINT)
    rec.wait(60)
    argv = ["perf", "report", "-i", str(data), "--no-children", "--sort", "dso", "-g", "none", "--stdio"]
    return perf_groups(subprocess.run(argv, capture_output=True, text=True, check=False).stdout)


def perf_groups(by_dso: str) -> dict[str, float]:
    """`perf report --sort dso --stdio`'s lines ("88.01%  onnxruntime_pybind11_state...so") summed by PERF_GROUPS."""
    shares = dict.fromkeys([g for g, _ in PERF_GROUPS] + ["other"], 0.0)
    for line in by_dso.splitlines():
        parts = line.split()
        if line.startswith("#") or len(parts) < 2 or not parts[0].endswith("%"):
            continue
        group = next((g for g, keys in PERF_GROUPS if any(k in parts[1] for k in keys)), "other")
        shares[group] += float(parts[0][:-1])
    return shares


def report(
    results: Results,
    variants: list[str],
    levels: list[int],
    sampled: list[dict[str, Any]] | None = None,
    llama_missing: bool = False,
) -> str:
    """The markdown: a row per variant and level, then batch's ratio over each other variant that ran."""
    rows = []
    for name in variants:
        one = results.stat("tok_s", variant=name, clients=levels[0]).median
        for clients in levels:
            pick = {"variant": name, "clients": clients}
            per_round = [r["tok_s"] / one for r in results.pick(**pick)] if one else []
            rows.append(
                [
                    name,
                    clients,
                    results.stat("tok_s", **pick).fmt(1),
                    f"{Stat.of(per_round).median:.2f}x" if per_round else "-",
                    results.stat("tbt_p50_ms", **pick).fmt(0),
                    results.stat("tbt_p99_ms", **pick).fmt(0),
                    results.stat("ttft_p50_ms", **pick).fmt(0),
                    results.stat("cpu_ms_per_token", **pick).fmt(1),
                    results.stat("peak_rss_mb", **pick).fmt(0),
                    int(sum(r["non_200"] for r in results.pick(**pick))),
                ]
            )
    head = ["variant", "clients", "aggregate tok/s", "vs its 1 client", "TBT p50 ms", "TBT p99 ms", "TTFT p50 ms"]
    head += ["CPU ms / token", "peak RSS MB"]
    md = table([*head, "non-200"], rows)
    if "batch" in variants:
        # One labelled line per peer that ran (the llama line had no label, and "over single" printed empty).
        for other in ("single", "llama", "baseline"):
            if other in variants:
                md += f"\n\nbatch over {other}, aggregate tok/s by clients: " + ", ".join(
                    f"{c}: {fmt_ratio(ratios(results.rows, 'tok_s', 'batch', other, clients=c))}" for c in levels
                )
    if llama_missing:  # asked for, and dropped (not a line when llama was not among --variants)
        md += "\n\nllama-server: not run (/work/cache/llama-server/READY absent when this ran)."
    loads = [r["load"] for r in results.rows]
    md += f"\n\nLoad average during the levels: {Stat.of(loads).fmt(1)}."
    if sampled:
        groups = [g for g, _ in PERF_GROUPS] + ["other"]
        rows = [[r["variant"], r["clients"], *(f"{r['perf'][g]:.1f}%" for g in groups)] for r in sampled]
        md += "\n\nWhere each server's CPU went (perf samples by library, one more level):\n\n"
        md += table(["variant", "clients", *groups], rows)
    return md


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, rounds=3, out="generate-streams")
    ap.add_argument("--pack", type=Path, required=True, help="a packed generate model (genai backend)")
    ap.add_argument("--vcpus", type=float, default=2.0)
    ap.add_argument("--levels", default="1,8,32")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--requests", type=int, default=2, help="streams each client makes in turn, per level")
    ap.add_argument("--rows", type=int, default=32, help="WARMSTART_GENAI_BATCH of the batch variant")
    ap.add_argument("--kv-tokens", type=int, default=32768)
    ap.add_argument("--variants", default="batch,single,llama")
    ap.add_argument(
        "--single-up-to",
        type=int,
        default=0,
        help="run `single` only at levels up to this (0: all); its workers "
        "run 2 streams at a time, so more clients only queue",
    )
    ap.add_argument("--llama-threads", type=int, default=0, help="llama-server's -t (0: the vCPUs)")
    ap.add_argument("--gguf", type=Path, default=None, help="the GGUF for llama-server (the llama variant)")
    ap.add_argument("--baseline", default=None, help="a git ref whose batch engine is the `baseline` variant")
    ap.add_argument(
        "--own-cpus", action="store_true", help="each server's quota its own CPUs (the host's other jobs yield)"
    )
    ap.add_argument(
        "--perf",
        type=int,
        default=0,
        help="after the rounds, one more level of this many clients per server of ours under `perf record`: "
        "its CPU by library (ONNX Runtime, kernel, Python, ...)",
    )
    args = ap.parse_args(argv)
    why = need_root()
    if why:
        raise SystemExit(f"bench/generate/streams.py {why}")
    levels = [int(x) for x in args.levels.split(",")]
    variants = [v for v in args.variants.split(",") if v]
    if args.perf and shutil.which("perf") is None:
        raise SystemExit("--perf needs the perf tool (linux-tools) on the PATH")
    baseline = ref_checkout(args.baseline) if args.baseline else None
    if baseline is not None:
        variants.append("baseline")
    llama_bin, gguf = LLAMA / "bin" / "llama-server", args.gguf
    llama_missing = "llama" in variants and not (LLAMA / "READY").is_file()
    if llama_missing:
        variants.remove("llama")
        print(f"llama-server: {LLAMA}/READY is absent (bench/generate/build_llama_server.sh): not run", file=sys.stderr)
    if "llama" in variants and (gguf is None or not gguf.is_file()):
        raise SystemExit(f"the llama variant needs --gguf (the GGUF of the same model), got {gguf}")
    (ROOT / "build").mkdir(exist_ok=True)
    results = Results("generate-streams", {"pack": str(args.pack), "vcpus": args.vcpus, "levels": levels})
    sampled: list[dict[str, Any]] = []  # --perf's levels: in runs.json's meta, not among the timed rows
    results.meta["perf"] = sampled
    with quotas(*variants) as qs:
        for q in qs.values():
            q.set(args.vcpus)
            if args.own_cpus:
                q.own()
        servers: dict[str, Server] = {}
        try:
            for name in variants:
                port = free_port()
                if name == "llama":
                    argv = [str(llama_bin), "-m", str(gguf), "--port", str(port), "--parallel", str(max(levels))]
                    argv += [
                        "-c",
                        str(max(levels) * (args.max_tokens + 64)),
                        "-t",
                        str(args.llama_threads or max(1, int(args.vcpus))),
                    ]
                    servers[name] = Server(name, qs[name].wrap(argv), base_env(), port, "/health", "llama")
                    continue
                env = base_env(WARMSTART_MODEL=str(args.pack.resolve()), PORT=str(port), HOST="127.0.0.1")
                batching = name in ("batch", "baseline")
                env["WARMSTART_GENAI_BATCH"] = str(args.rows if batching else 1)
                env["WARMSTART_GENAI_QUEUE"] = str(args.rows if batching else 0)
                env["WARMSTART_GENAI_KV_TOKENS"] = str(args.kv_tokens)
                cwd = ROOT
                if name == "baseline" and baseline is not None:  # `python -m` puts the cwd first on the path
                    cwd = baseline
                    env["PYTHONPATH"] = str(cwd)
                argv = qs[name].wrap([sys.executable, "-m", "handler"])
                servers[name] = Server(name, argv, env, port, "/ping", "ours", cwd)
            for server in servers.values():  # each warm: the first stream's one-off costs off the figures
                level(server, 2, 1, 4)
            for rnd in range(args.rounds):
                for clients in levels:
                    for name in order(variants, rnd):
                        if name == "single" and args.single_up_to and clients > args.single_up_to:
                            continue
                        got = level(servers[name], clients, args.requests, args.max_tokens)
                        results.add(round=rnd, variant=name, clients=clients, load=os.getloadavg()[0], **got)
            for name, server in servers.items():
                if args.perf and server.kind == "ours":
                    shares = perf_shares(server, args.perf, args.requests, args.max_tokens)
                    sampled.append({"variant": name, "clients": args.perf, "perf": shares})
        finally:
            for server in servers.values():
                server.close()
    results.save(args.out, report(results, variants, levels, sampled, llama_missing))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
