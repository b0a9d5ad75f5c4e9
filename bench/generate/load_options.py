"""The genai engine's model load alone, per way of loading it: onnxruntime-genai's model made through the engine's
C API path (handler.backends.genai_capi, the engine's overlay) in a fresh child under one CPU quota, then one
16-token prompt step and one generated token. Per start: the load's wall and CPU milliseconds (user, sys), its
minor page faults, the first step's wall and CPU, and the child's VmHWM. Rounds interleaved.

    .venv/bin/python bench/generate/load_options.py [--pack DIR] [--vcpus 1.7] [--rounds 3] [--own-cpus]
        [--variants opt,opt-2threads,portable] [--no-prepack DIR] [--q4 DIR] [--decode N] [--release]
        [--q4pack DIR] [--q4pack-library FILE] [--q4pack-base DIR] [--q4pack-base-library FILE]

variants: opt (the pack's prepacked decoder, model.opt.onnx, 1 intra-op thread: what a 1.7 vCPU start loads),
opt-2threads (the same on 2 intra-op threads: does the load's prepack run on the session's pool?), opt-parallel and
opt-parallel-2threads (opt and opt-2threads with ONNX Runtime's `session.prepack.enable_parallel` = 1, passed as a
string key through onnxruntime-genai's session_options: the nodes' prepacks dispatched in parallel), portable
(model.onnx, ORT's graph passes and the prepack at load), no-prepack (with --no-prepack DIR: a copy of the pack
whose model.opt.onnx was saved optimized without prepacked weights, session option
`session.save_external_prepacked_constant_initializers` 0: `infra.pack.lm_layout.prepack` with that option off),
q4op and q4op-noopt (with --q4 DIR: a pack rewritten by bench/generate/q4op.py, its body's MatMulNBits computed by
the custom op `ai.warmstart::Q4MatMul` from model.onnx.data's bytes, no prepack; q4op runs ORT's graph passes at
load as portable does, q4op-noopt skips them; q4op-noopt-2threads: on 2 intra-op threads, the op's columns split
over ORT's pool). q4pack and q4pack-base (with --q4pack DIR / --q4pack-base DIR): a pack's model.q4.onnx
(infra/pack/lm_q4.py) opened as the engine opens it (handler.backends.genai_load.overlay with its Q4 entry: the
library named by --q4pack-library / --q4pack-base-library, default the tree's build; the manifest's graph level),
e.g. a pack whose 8-bit head is Q8MatMul against one whose head is MatMulNBits; onnxruntime-genai loads a library
only from under the working directory or the pack's folder, so a baseline's library is copied under build/ first.
--decode N: after the first token, N more, each timed (wall and this process's CPU per token; 1 intra-op thread),
and the VmRSS after them. --release: right after the load, the file pages it read given back
(handler.core.pages.release_after_load, as the engine does), so VmRSS and VmHWM are the engine's.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for `bench.runner`

from bench.runner import ROOT, Child, Results, Stat, base_env, csv, need_root, order, parser, quotas, table
from handler.backends.q4lib import LIBRARY

MARK = "load-options:"
PACK = ROOT / "build" / "bench" / "peers-gen" / "qwen3-0.6b" / "ours-int4-opt"
VARIANTS = (
    "opt",
    "opt-2threads",
    "opt-parallel",
    "opt-parallel-2threads",
    "portable",
    "no-prepack",
    "q4op",
    "q4op-noopt",
    "q4op-noopt-2threads",
    "q4pack",
    "q4pack-base",
)
# The child: the load timed with its rusage, then a 16-token step and one token, VmHWM; one JSON line.
CHILD = """
import json, resource, sys, time
root, decoder, threads, parallel = sys.argv[1], sys.argv[2] or None, int(sys.argv[3]), sys.argv[4] == "1"
noopt, decode, release, library = sys.argv[5], int(sys.argv[6]), sys.argv[7] == "1", sys.argv[8]
from pathlib import Path
from handler.backends import genai, genai_capi, genai_load
from handler.core import pages
q4 = genai_load.Q4(decoder, library, noopt) if library else None
overlay = json.loads(genai.overlay(threads, decoder, q4))
if parallel:
    overlay["model"]["decoder"]["session_options"]["session.prepack.enable_parallel"] = "1"
if noopt != "" and q4 is None:  # the q4op variants name the level (a rewritten pack may carry its own)
    overlay["model"]["decoder"]["session_options"]["graph_optimization_level"] = noopt
r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
model = genai_capi.Model(root, json.dumps(overlay))
r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
if release:  # as the engine does after its load (handler.backends.genai)
    pages.release_after_load(Path(root))
generator = genai_capi.Generator(model, {"max_length": 17 + max(decode, 47), "do_sample": False})
generator.append_tokens(list(range(1000, 1016)))
generator.generate_next_token()
r2, t2 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
for _ in range(decode):
    generator.generate_next_token()
r3, t3 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
cpu = lambda a, b: (b.ru_utime + b.ru_stime - a.ru_utime - a.ru_stime) * 1000
status = open("/proc/self/status").read()
hwm = int(status.split("VmHWM:")[1].split()[0]) / 1024
rss = int(status.split("VmRSS:")[1].split()[0]) / 1024
print(MARK + json.dumps({"load_ms": (t1 - t0) * 1000, "load_cpu_ms": cpu(r0, r1),
    "load_user_ms": (r1.ru_utime - r0.ru_utime) * 1000, "load_sys_ms": (r1.ru_stime - r0.ru_stime) * 1000,
    "load_minflt": r1.ru_minflt - r0.ru_minflt, "first_ms": (t2 - t1) * 1000, "first_cpu_ms": cpu(r1, r2),
    "decode_ms": (t3 - t2) * 1000 / max(decode, 1), "decode_cpu_ms": cpu(r2, r3) / max(decode, 1),
    "hwm_mb": hwm, "rss_mb": rss}), flush=True)
"""
KEYS = ("load_ms", "load_cpu_ms", "load_user_ms", "load_sys_ms", "load_minflt", "first_ms", "first_cpu_ms", "hwm_mb")
DECODE_KEYS = ("decode_ms", "decode_cpu_ms", "rss_mb")


def child(
    variant: str,
    pack: Path,
    no_prepack: Path | None,
    q4: Path | None = None,
    decode: int = 0,
    release: bool = False,
    q4pack: tuple[Path | None, Path] | None = None,
) -> list[str]:
    root, decoder, library = pack, "model.opt.onnx", ""
    threads = 2 if variant.endswith("-2threads") else 1
    if variant == "portable":
        decoder = ""
    elif variant == "no-prepack":
        if no_prepack is None:
            raise SystemExit("variant no-prepack needs --no-prepack DIR")
        root = no_prepack
    elif variant.startswith("q4op"):
        if q4 is None:
            raise SystemExit(f"variant {variant} needs --q4 DIR (bench/generate/q4op.py rewrite)")
        root, decoder = q4, ""
    parallel = "1" if variant.startswith("opt-parallel") else "0"
    noopt = ""  # ORT's graph optimization level, where the variant sets one
    if variant.startswith("q4op"):
        noopt = "ORT_DISABLE_ALL" if variant.startswith("q4op-noopt") else "ORT_ENABLE_ALL"
    if variant.startswith("q4pack"):
        if q4pack is None or q4pack[0] is None:
            raise SystemExit(f"variant {variant} needs --{variant} DIR (a pack with model.q4.onnx)")
        root, library = q4pack[0], str(q4pack[1].resolve())
        q4entry = json.loads((root / "manifest.json").read_text())["backends"]["genai"]["q4"]
        decoder, noopt = q4entry["model"], q4entry["graph_optimization_level"]
    args = [str(root), decoder, str(threads), parallel, noopt, str(decode), "1" if release else "0", library]
    return [sys.executable, "-c", f"MARK = {MARK!r}\n" + CHILD, *args]


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, rounds=3, out="generate-load-options")
    ap.add_argument("--pack", type=Path, default=PACK, help="a `warmstart optimize`d generate pack")
    ap.add_argument("--vcpus", type=float, default=1.7)
    ap.add_argument("--variants", default="opt,opt-2threads,portable", help=f"of {', '.join(VARIANTS)}")
    ap.add_argument("--no-prepack", type=Path, default=None, help="the pack saved without prepacked weights")
    ap.add_argument("--own-cpus", action="store_true", help="each quota's CPUs its own (bench.runner.Quota.own)")
    ap.add_argument("--q4", type=Path, default=None, help="the pack rewritten by bench/generate/q4op.py")
    ap.add_argument("--q4pack", type=Path, default=None, help="a pack with model.q4.onnx (variant q4pack)")
    ap.add_argument("--q4pack-library", type=Path, default=LIBRARY, help="its op library (default: the tree's)")
    ap.add_argument("--q4pack-base", type=Path, default=None, help="another such pack (variant q4pack-base)")
    ap.add_argument("--q4pack-base-library", type=Path, default=LIBRARY, help="its op library")
    ap.add_argument("--decode", type=int, default=0, help="tokens after the first, timed per token")
    ap.add_argument("--release", action="store_true", help="the load's file pages given back, as the engine does")
    args = ap.parse_args(argv)
    why = need_root()
    if why:
        raise SystemExit(f"bench/generate/load_options.py {why}")
    names = csv(args.variants, VARIANTS)
    results = Results("generate-load-options", {k: str(v) for k, v in vars(args).items()})
    with quotas(*names) as qs:
        for q in qs.values():
            q.set(args.vcpus)
            if args.own_cpus:
                q.own()
        for rnd in range(args.rounds):
            for name in order(names, rnd):
                load = os.getloadavg()[0]
                pair = (
                    (args.q4pack_base, args.q4pack_base_library)
                    if name == "q4pack-base"
                    else (args.q4pack, args.q4pack_library)
                )
                argv_ = child(name, args.pack, args.no_prepack, args.q4, args.decode, args.release, pair)
                c = Child(qs[name].wrap(argv_), base_env(), MARK)
                c.close()
                keys = KEYS + (DECODE_KEYS if args.decode else ())
                results.add(variant=name, round=rnd, load=load, **{k: c.hello[k] for k in keys})
    results.meta["load_end"] = [round(x, 1) for x in os.getloadavg()]
    results.save(args.out, markdown(results.rows, args, names))
    return 0


def markdown(rows: list[dict[str, Any]], args: Any, names: list[str]) -> str:
    loads = Stat.of(r["load"] for r in rows)
    head = f"**{args.vcpus:g} vCPU**{' (own CPUs)' if args.own_cpus else ''}, 1-min load average {loads.fmt(1)}:"
    keys = KEYS + (DECODE_KEYS if getattr(args, "decode", 0) else ())
    body = [
        [n, *(Stat.of(r[k] for r in rows if r["variant"] == n).fmt(1 if k in DECODE_KEYS else 0) for k in keys)]
        for n in names
    ]
    return head + "\n\n" + table(["variant", *keys], body) + "\n\n" + json.dumps({"rounds": args.rounds}) + "\n"


if __name__ == "__main__":
    sys.exit(main())
