"""The int4 MatMul without prepack as an ONNX Runtime custom op (handler/backends/native/ws_q4_op.c,
`ai.warmstart::Q4MatMul`) and a generate pack rewritten to use it (an experiment's tool: the packer's own rewrite,
proved, is infra/pack/lm_q4.py).

    .venv/bin/python bench/generate/q4op.py build [--kernels FILE] [--out DIR]
    .venv/bin/python bench/generate/q4op.py rewrite --pack DIR --out DIR [--library FILE] [--no-graph-passes]
    .venv/bin/python bench/generate/q4op.py premise --pack DIR [--noopt]
    .venv/bin/python bench/generate/q4op.py compare --pack DIR --q4 DIR [--steps 32] [--threads 1] [--noopt]
        [--prompt-tokens 16]
    .venv/bin/python bench/generate/q4op.py gate --source DIR --pack DIR [--pack DIR ...]

build: gcc the op and the kernels (handler/backends/native/ws_q4_kernels.c, or --kernels: e.g. ws_q4_ref.c, the
separately written scalar reference) into one shared library, build/native/libws_q4_op.so.
rewrite: a copy of a pack whose MatMulNBits that our ops compute the same way (the packer's rules,
infra.pack.lm_q4.rewrite: int4 blocks of 32 become Q4MatMul, the 8-bit head Q8MatMul) on the same initializers;
model.onnx.data hard-linked (symlinked across file systems), never copied; every other node kept; the library
copied beside the model and named in genai_config.json's decoder `custom_ops_library` (onnxruntime-genai 0.18
loads it, a relative name from the pack's folder).
premise: through ONNX Runtime's Python API, one intra-op thread: does a Q4MatMul graph's session hold the weights
as model.onnx.data's mapped pages (no copy)? Load wall/CPU, minor faults, anonymous and file RSS, and the resident
part of the data file's mapping, after the load and after one 16-token step.
compare: both packs through the engine's genai C API path in one process: greedy tokens for --steps after a
--prompt-tokens prompt (one run: M = the prompt's length), equal or the first step they part, and the logits' max
difference per step.
gate: the packer's quality gate (greedy and top-1 agreement with float32 transformers on the built-in prompts) of
each pack, e.g. a real model's MatMulNBits pack and its rewrite.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for `bench.runner`

from bench.runner import ROOT
from handler.backends import q4lib
from infra.pack import lm_q4

NATIVE = q4lib.NATIVE
LIBRARY = ROOT / "build" / "native" / "libws_q4_op.so"
DOMAIN, OP = q4lib.DOMAIN, q4lib.OP
LIBRARY_NAME = "libws_q4_op.so"  # its name inside a rewritten pack


class RewriteError(ValueError):
    """A pack that cannot be rewritten (not a pack, nothing the op computes the same way, the output in place)."""


def build(out: Path = LIBRARY, kernels: Path | None = None) -> Path:
    """The op and `kernels` (default: the tree's) into `out`: handler.backends.q4lib.build, the engine's own build."""
    return q4lib.build(out, kernels=kernels)


def rewrite(pack: Path, out: Path, library: Path = LIBRARY, graph_passes: bool = True) -> dict[str, Any]:
    """Write `out`, `pack` with its Q4MatMul-able MatMulNBits rewritten; returns what was rewritten and kept.
    `graph_passes` False: the decoder's session_options say ORT_DISABLE_ALL (the builder's graph needs none of ORT's
    passes; skipping them skips the load's folding of the tied embedding table, compare --noopt checks the tokens)."""
    import onnx  # deferred: a bench dependency, not the handler's

    model_path = pack / "model.onnx"
    if not model_path.is_file() or not (pack / "genai_config.json").is_file():
        raise RewriteError(f"{pack}: not a generate pack (model.onnx and genai_config.json expected)")
    if out.resolve() == pack.resolve():
        raise RewriteError(f"--out {out} is the pack itself: the rewrite writes a copy")
    if not library.is_file():
        raise RewriteError(f"{library}: no such library (bench/generate/q4op.py build)")
    model = onnx.load(str(model_path), load_external_data=False)
    rewritten, kept = lm_q4.rewrite(model)  # the packer's own rules: the same nodes, the opset added
    if not rewritten:
        raise RewriteError(f"{pack}: no MatMulNBits of bits 4, block 32, accuracy level 4 without zero points")
    out.mkdir(parents=True, exist_ok=True)
    for f in sorted(pack.iterdir()):
        if f.name.startswith("model.") or f.name in ("genai_config.json", "manifest.json") or not f.is_file():
            continue  # the graphs: only the portable one is rewritten (model.opt.onnx holds MatMulNBits' prepacks)
        shutil.copy2(f, out / f.name)
    data = out / "model.onnx.data"
    data.unlink(missing_ok=True)
    try:
        os.link(pack / "model.onnx.data", data)
    except OSError:  # another file system
        data.symlink_to((pack / "model.onnx.data").resolve())
    onnx.save(model, str(out / "model.onnx"))  # external data references kept as they were: no tensor is loaded
    shutil.copy2(library, out / LIBRARY_NAME)
    config = json.loads((pack / "genai_config.json").read_text())
    # The name alone: onnxruntime-genai 0.18 resolves it against the pack's folder, so the pack can move.
    session = config["model"]["decoder"].setdefault("session_options", {})
    session["custom_ops_library"] = LIBRARY_NAME
    if not graph_passes:
        session["graph_optimization_level"] = "ORT_DISABLE_ALL"
    (out / "genai_config.json").write_text(json.dumps(config, indent=4) + "\n")
    report = {"rewritten": rewritten, "kept": kept, "library": LIBRARY_NAME, "graph_passes": graph_passes}
    (out / "q4op.json").write_text(json.dumps(report, indent=2) + "\n")
    if (pack / "manifest.json").is_file():
        _manifest(out, json.loads((pack / "manifest.json").read_text()))
    return report


def _manifest(out: Path, manifest: dict[str, Any]) -> None:
    """The pack's manifest with the changed files' sizes and hashes, the library listed among the genai backend's
    files (the engine checks every listed size at load), and no pre-optimized decoder (not rewritten: a copy's
    model.opt.onnx would be MLAS's prepacked MatMulNBits), nor the packer's own q4 graph (the rewrite's model.onnx
    is this experiment's)."""
    import hashlib  # deferred: only a rewrite hashes

    genai = manifest["backends"]["genai"]
    genai.pop("optimized", None)
    for name in (genai.pop("q4", None) or {}).get("files", []):
        manifest["files"].pop(name, None)
    if LIBRARY_NAME not in genai["files"]:
        genai["files"].append(LIBRARY_NAME)
    for name in ("genai_config.json", "model.onnx", LIBRARY_NAME):
        data = (out / name).read_bytes()
        manifest["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


PREMISE = """
import json, resource, sys, time
pack, library, isa, noopt = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
import numpy as np, onnxruntime as ort
config = json.load(open(pack + "/genai_config.json"))["model"]["decoder"]
def status():
    s = open("/proc/self/status").read()
    return {k: int(s.split(k + ":")[1].split()[0]) / 1024 for k in ("VmRSS", "RssAnon", "RssFile", "VmHWM")}
def mapped():  # resident MB of model.onnx.data's mappings
    total, cur = 0, False
    for line in open("/proc/self/smaps"):
        if line[0] in "0123456789abcdef" and "-" in line.split()[0]:
            cur = line.rstrip().endswith("model.onnx.data")
        elif cur and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total / 1024
def usage():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, r.ru_minflt
so = ort.SessionOptions()
so.intra_op_num_threads = 1
so.inter_op_num_threads = 1
if library:
    so.register_custom_ops_library(library)
if noopt:
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
s0, (c0, f0), t0 = status(), usage(), time.perf_counter()
sess = ort.InferenceSession(pack + "/model.onnx", so, providers=["CPUExecutionProvider"])
t1, (c1, f1), s1 = time.perf_counter(), usage(), status()
m1 = mapped()
feeds = {}
for i in sess.get_inputs():
    shape = [16 if d in ("sequence_length", "total_sequence_length") else 1 if isinstance(d, str) else d
             for d in i.shape]
    if i.name.startswith("past_key_values"):  # an empty past: [batch, kv heads, 0, head size]
        shape = [1, config["num_key_value_heads"], 0, config["head_size"]]
    dtype = {"tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(float)": np.float32}[i.type]
    feeds[i.name] = (np.arange(1000, 1016).reshape(1, 16) if i.name == "input_ids" else np.ones(shape)).astype(dtype)
t2 = time.perf_counter()
sess.run(["logits"], feeds)
t3, (c3, f3), s3 = time.perf_counter(), usage(), status()
print("premise:" + json.dumps({"isa": isa, "load_ms": (t1 - t0) * 1000, "load_cpu_ms": (c1 - c0) * 1000,
    "load_minflt": f1 - f0, "load_rss_mb": s1["VmRSS"] - s0["VmRSS"], "load_anon_mb": s1["RssAnon"] - s0["RssAnon"],
    "load_file_mb": s1["RssFile"] - s0["RssFile"], "data_mapped_rss_mb": m1, "step_ms": (t3 - t2) * 1000,
    "step_cpu_ms": (c3 - c1) * 1000, "step_minflt": f3 - f1, "step_anon_mb": s3["RssAnon"] - s1["RssAnon"],
    "data_mapped_rss_after_step_mb": mapped(), "hwm_mb": s3["VmHWM"]}), flush=True)
"""


def premise(pack: Path, noopt: bool = False) -> dict[str, Any]:
    """One child per call (a fresh process: its page faults and RSS are the load's alone); `noopt`: without ORT's
    graph passes."""
    rewritten = (pack / "q4op.json").exists()
    library = str(pack / LIBRARY_NAME) if rewritten else ""
    isa = str(_isa(pack / LIBRARY_NAME)) if rewritten else "MLAS"
    out = subprocess.run(
        [sys.executable, "-c", PREMISE, str(pack), library, isa, "1" if noopt else "0"],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    ).stdout
    return json.loads(next(x for x in out.splitlines() if x.startswith("premise:"))[len("premise:") :])


def _isa(library: Path) -> int:
    import ctypes  # deferred: only the reports name the kernel's path

    return int(ctypes.CDLL(str(library)).ws_q4_op_isa())


def compare(
    pack: Path, q4: Path, steps: int, threads: int, noopt: bool = False, prompt_tokens: int = 16
) -> dict[str, Any]:
    """Greedy decoding of both packs side by side through the engine's genai C API path; `noopt`: the rewritten
    pack's session without ONNX Runtime's graph passes (load_options.py's q4op-noopt)."""
    import numpy as np  # deferred: the comparison's logits

    from handler.backends import genai, genai_capi

    vocab = json.loads((pack / "genai_config.json").read_text())["model"]["vocab_size"]
    prompt = [(1000 + 7 * i) % vocab for i in range(prompt_tokens)]  # distinct ids of any vocabulary
    runs = []
    for root in (pack, q4):
        overlay = json.loads(genai.overlay(threads, None))
        if noopt and root == q4:
            overlay["model"]["decoder"]["session_options"]["graph_optimization_level"] = "ORT_DISABLE_ALL"
        model = genai_capi.Model(str(root), json.dumps(overlay))
        gen = genai_capi.Generator(model, {"max_length": prompt_tokens + steps + 1, "do_sample": False})
        gen.append_tokens(prompt)
        tokens, logits = [], []
        for _ in range(steps):
            logits.append(np.array(gen.get_logits(), dtype=np.float32).reshape(-1))
            gen.generate_next_token()
            tokens.append(gen.next_token())
        runs.append((tokens, logits))
        gen.close()
        model.close()
    (ta, la), (tb, lb) = runs
    diffs = [float(np.abs(x - y).max()) for x, y in zip(la, lb, strict=True)]
    parted = next((i for i, (x, y) in enumerate(zip(ta, tb, strict=True)) if x != y), None)
    # Where they part: how far apart the two tokens' logits were in each run (a near tie flips on a rounding).
    margins = None
    if parted is not None:
        x, y = la[parted], lb[parted]
        margins = [float(x[ta[parted]] - x[tb[parted]]), float(y[tb[parted]] - y[ta[parted]])]
    return {
        "steps": steps,
        "equal": ta == tb,
        "first_parted": parted,
        "tokens": ta,
        "q4_tokens": tb,
        "parted_margins": margins,
        "logits_max_diff": max(diffs),
        "logits_max_abs": float(max(np.abs(x).max() for x in la)),
        "logits_max_diff_per_step": [round(d, 5) for d in diffs],
    }


def gate(source: Path, packs: list[Path]) -> dict[str, Any]:
    """The packer's quality gate (infra.pack.lm_quality: greedy and top-1 agreement with float32 transformers on the
    built-in prompts) for each pack: a real model's figures for the rewrite beside its MatMulNBits pack's."""
    from infra.pack import lm_quality
    from infra.pack.lm_calibration import NEW_TOKENS, builtin_prompts
    from infra.pack.lm_source import read_lm_source

    src = read_lm_source(source)
    out = {}
    for pack in packs:
        eos = json.loads((pack / "manifest.json").read_text())["generation"]["eos_token_ids"]
        out[str(pack)] = lm_quality.measure(src, pack, builtin_prompts(), NEW_TOKENS, eos)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--kernels", type=Path, default=None, help="the ws_q4.h implementation to link")
    b.add_argument("--out", type=Path, default=LIBRARY)
    r = sub.add_parser("rewrite")
    r.add_argument("--pack", type=Path, required=True)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--library", type=Path, default=LIBRARY)
    r.add_argument("--no-graph-passes", action="store_true", help="the decoder opened with ORT_DISABLE_ALL")
    p = sub.add_parser("premise")
    p.add_argument("--pack", type=Path, required=True, help="a pack, rewritten or not")
    p.add_argument("--noopt", action="store_true", help="without ONNX Runtime's graph passes")
    c = sub.add_parser("compare")
    c.add_argument("--pack", type=Path, required=True)
    c.add_argument("--q4", type=Path, required=True)
    c.add_argument("--steps", type=int, default=32)
    c.add_argument("--threads", type=int, default=1)
    c.add_argument("--noopt", action="store_true", help="the rewritten pack without ORT's graph passes")
    c.add_argument("--prompt-tokens", type=int, default=16)
    g = sub.add_parser("gate")
    g.add_argument("--source", type=Path, required=True, help="the Hugging Face directory the packs were made from")
    g.add_argument("--pack", type=Path, action="append", required=True, help="a pack (repeatable)")
    args = ap.parse_args(argv)
    if args.cmd == "gate":
        print(json.dumps(gate(args.source, args.pack)))
    elif args.cmd == "build":
        print(build(args.out, args.kernels))
    elif args.cmd == "rewrite":
        try:
            print(json.dumps(rewrite(args.pack, args.out, args.library, not args.no_graph_passes)))
        except RewriteError as e:
            raise SystemExit(f"q4op.py rewrite: {e}") from None
    elif args.cmd == "premise":
        print(json.dumps(premise(args.pack, args.noopt)))
    else:
        print(json.dumps(compare(args.pack, args.q4, args.steps, args.threads, args.noopt, args.prompt_tokens)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
