"""Issue 35's batch-1 speed levers, each on and off, on the Qwen3-0.6B-shaped model, and llama.cpp beside them.

    .venv/bin/python bench/generate/levers.py [--variants int4,int4-before,...] [--rounds 3] [--vcpus 1.7]
        [--prompt-tokens 512] [--max-tokens 64] [--cache /work/cache/gen-speed] [--llama-venv DIR]

Root (a cgroup v1 `cpu` quota: 1.7 vCPU, a 3,008 MB Lambda). The source is bench/pack/models.py's Qwen3-0.6B
chat model (Qwen3Config of Qwen3-0.6B, random weights) with its matrices scaled by --scale (as tests/lm_models.py
does, so greedy decoding does not settle on one token), built once under --cache. Each variant is our pack built
one way (infra.pack.lm_pack.pack_lm with `builder_options` overriding BUILDER_OPTIONS) and served one way:

  int4 / int8          as `warmstart pack --quantize int4|int8` packs now, served by handler.app (the runtime's
                       streamed path, bench/generate/driver.py), glibc keeping freed memory (keep_freed_memory)
  *-before             as main packed and served before this change: the LM head over every prompt position,
                       int8 in blocks of 32, freed KV buffers returned to the OS
  *-full-head          prune_lm_head off (one lever off)
  *-no-keep            handler.backends.genai.keep_freed_memory not applied (one lever off; the same pack)
  int8-b32             MatMulNBits blocks of 32 instead of 128 (one lever off)
  llama-q4_0/-q8_0     llama-cpp-python (its Python API, in its own venv: --llama-venv, READY file) on GGUF made
                       from the same directory by llama.cpp's own convert_hf_to_gguf.py (f32) and its quantizer

Per round, the variants in rotated order (bench.runner.order), each a fresh long-lived child under the same quota
and thread count (what warmstart takes from the quota): ready after one generated token, then three requests of
a --prompt-tokens prompt with --max-tokens greedy tokens; the first warms, the other two are the round's
figures (their mean): time to the first token (prefill), decode tokens/s after it, and the child's CPU time and
minor page faults per request (the KV lever shows there). The packs' quality-gate figures (greedy agreement with
transformers float32 on the built-in prompts) are in the table. Writes runs.json and results.md under --out.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for `bench.runner`

from bench.runner import (
    ROOT,
    Child,
    Results,
    base_env,
    csv,
    fmt_ratio,
    need_root,
    order,
    parser,
    peak_rss_mb,
    process_cpu_ms,
    quotas,
    ratios,
    table,
)

MARK = "generate-driver:"  # bench/generate/driver.py's
DRIVER = ROOT / "bench" / "generate" / "driver.py"
# name -> (quantize, builder option overrides, keep freed memory)
OURS: dict[str, tuple[str, dict[str, Any], bool]] = {
    "int4": ("int4", {}, True),
    "int4-before": ("int4", {"prune_lm_head": False}, False),
    "int4-full-head": ("int4", {"prune_lm_head": False}, True),
    "int4-no-keep": ("int4", {}, False),
    "int4-fp32-act": ("int4", {"accuracy_level": 1}, True),
    "int8": ("int8", {}, True),
    "int8-before": ("int8", {"prune_lm_head": False, "block_size": 32}, False),
    "int8-b32": ("int8", {"block_size": 32}, True),
}
# sentencepiece (the converter imports it before looking for a tokenizer.model), installed by the peers' bench
CONVERT_EXTRA = Path("/work/cache/gen-peers-convert-extra")
LLAMA = {"llama-q4_0": "Q4_0", "llama-q8_0": "Q8_0"}
DEFAULT = "int4,int4-before,int4-full-head,int4-no-keep,int8,int8-before,int8-b32,llama-q4_0,llama-q8_0"
# (ours, theirs) ratios shown: each precision against llama.cpp's same bits and against its own before
VERSUS = [(q + s, "llama-q" + q[3:] + "_0") for q in ("int4", "int8") for s in ("", "-before")]
VERSUS += [("int4", "int4-before"), ("int8", "int8-before")]


# -- the source and the packs --


def source(cache: Path, scale: float) -> Path:
    """The Qwen3-0.6B-shaped chat model, its 2-D weights scaled, built once into `cache`."""
    out = cache / f"qwen3-0.6b-x{scale:g}"
    if (out / ".done").is_file():
        return out
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from bench.pack.models import qwen3_chat

    shutil.rmtree(out, ignore_errors=True)
    qwen3_chat(out)
    weights = load_file(str(out / "model.safetensors"))
    weights = {k: (v * scale if v.dim() > 1 else v).contiguous() for k, v in weights.items()}
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    del weights, torch
    (out / ".done").write_text("built\n")
    return out


# The quality gate on one prompt: on a random model its figure is a sanity check, and the 8 built-in prompts cost
# the 0.6B model's pack many minutes of a shared 2-core host (transformers float32 beside the graph).
CALIBRATION = ("write a short poem about the sea",)


def pack_key(quantize: str, options: dict[str, Any]) -> str:
    return quantize + "".join(f"-{k}={v}" for k, v in sorted(options.items()))


def our_pack(src: Path, cache: Path, quantize: str, options: dict[str, Any]) -> Path:
    """Our pack of `src` (min-quality 0: the gate's figures are recorded, a random model is not refused)."""
    from infra.pack.lm_pack import pack_lm
    from infra.pack.precision import Precision

    out = cache / "packs" / f"{src.name}-{pack_key(quantize, options)}"
    if not (out / "manifest.json").is_file():
        started = time.perf_counter()
        precision = Precision(quantize=quantize, min_quality=0.0, calibration=CALIBRATION)
        pack_lm(src, out, precision=precision, builder_options=options, force=True)
        print(f"packed {out.name} in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    return out


def gguf(src: Path, cache: Path, kind: str, llama_python: Path) -> Path:
    """`src` as GGUF `kind` (Q4_0, Q8_0): llama.cpp's convert_hf_to_gguf.py (vendored in llama-cpp-python's
    sources under /work/cache/llama-src, CONVERT_EXTRA on its path) writes f32, llama.cpp's quantizer
    (llama_model_quantize, through llama-cpp-python) makes `kind` from it."""
    out = cache / "gguf" / f"{src.name}-{kind}.gguf"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    f32 = out.with_name(f"{src.name}-f32.gguf")
    if not f32.is_file():
        llama_cpp = next(Path("/work/cache/llama-src").glob("llama_cpp_python-*/vendor/llama.cpp"))
        path = os.pathsep.join([str(llama_cpp / "gguf-py"), str(CONVERT_EXTRA)])
        env = {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1"}
        code = CONVERT.format(script=str(llama_cpp / "convert_hf_to_gguf.py"))
        argv = [sys.executable, "-c", code, str(src), "--outtype", "f32", "--outfile", str(f32)]
        subprocess.run(argv, env=env, check=True, capture_output=True)
    code = QUANTIZE.format(src=str(f32), out=str(out), kind=kind)
    subprocess.run([str(llama_python), "-c", code], check=True, capture_output=True)
    return out


# convert_hf_to_gguf.py names the tokenizer's pre-tokenizer by a hash of how it splits a test text; the random
# model's byte-level BPE (bench/pack/models.py) is built to Qwen's shape but hashes to no listed name: it is
# given Qwen2's (the pre-tokenizer Qwen3's tokenizer.json declares). Nothing else of the converter is changed.
CONVERT = """
import sys
sys.argv = [{script!r}, *sys.argv[1:]]
sys.path.insert(0, __import__("os").path.dirname({script!r}))
import convert_hf_to_gguf
from conversion.base import TextModel
TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
convert_hf_to_gguf.main()
"""
QUANTIZE = """
import llama_cpp
params = llama_cpp.llama_model_quantize_default_params()
params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_{kind}
assert llama_cpp.llama_model_quantize({src!r}.encode(), {out!r}.encode(), params) == 0
"""


# -- the children --


def llama_child(path: str, threads: int, context: int) -> int:
    """One llama-cpp-python model in this process (run by the llama venv's python): {"ids", "max_tokens"} lines
    in, {"ttft_ms", "decode_tps", "tokens"} lines out; ready after one generated token."""
    import llama_cpp

    llm = llama_cpp.Llama(
        model_path=path, n_ctx=context, n_batch=512, n_threads=threads, n_threads_batch=threads, verbose=False
    )

    def generate(ids: list[int], max_tokens: int) -> dict[str, Any]:
        llm.reset()  # no prefix of the last prompt reused: each prompt is prefilled whole, as ours is
        times: list[float] = []
        t0 = time.perf_counter()
        for _ in llm.generate(ids, top_k=1, top_p=1.0, temp=0.0, reset=True):  # greedy, never stops by itself
            times.append(time.perf_counter())
            if len(times) >= max_tokens:
                break
        first, end = times[0], times[-1]
        return {
            "ttft_ms": (first - t0) * 1000,
            "decode_tps": (len(times) - 1) / (end - first) if len(times) > 1 else 0.0,
            "tokens": len(times),
        }

    first = generate([1, 2, 3, 4], 1)
    print(MARK + json.dumps({"load_ms": 0.0, "first": first}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        print(MARK + json.dumps(generate(request["ids"], int(request["max_tokens"]))), flush=True)
    return 0


def ours_child(model: str, keep: bool) -> int:
    """bench/generate/driver.py's `serve ours`, with keep_freed_memory off when `keep` is false (its once-flag
    set first: the function then returns without calling mallopt)."""
    if not keep:
        from handler.backends import genai

        genai._kept = False
    sys.path.insert(0, str(DRIVER.parent))
    import driver  # bench/generate/driver.py

    return driver.main(["serve", "ours", "--model", model])


# -- the parent --


def minor_faults(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[7])


def measure(child: Child, request: dict[str, Any]) -> dict[str, float]:
    """One request: the child's answer, its CPU time and minor page faults over it."""
    cpu, faults = process_cpu_ms(child.pid), minor_faults(child.pid)
    answer = child.ask(request)
    return {**answer, "cpu_ms": process_cpu_ms(child.pid) - cpu, "minflt": minor_faults(child.pid) - faults}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["llama-child"]:
        return llama_child(argv[1], int(argv[2]), int(argv[3]))
    if argv[:1] == ["ours-child"]:
        return ours_child(argv[1], argv[2] == "keep")
    ap = parser(__doc__, rounds=3, out="generate-levers")
    ap.add_argument("--variants", default=DEFAULT, help="comma-separated (default %(default)s)")
    ap.add_argument("--vcpus", type=float, default=1.7)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--scale", type=float, default=4.0, help="the source's 2-D weights multiplied by this")
    ap.add_argument("--cache", type=Path, default=Path("/work/cache/gen-speed"))
    ap.add_argument("--llama-venv", type=Path, default=Path("/work/cache/llama-venv"))
    args = ap.parse_args(argv)
    why = need_root()
    if why:
        raise SystemExit(f"bench/generate/levers.py {why}")
    variants = csv(args.variants, [*OURS, *LLAMA])
    llama_python = args.llama_venv / "bin" / "python"
    if any(v in LLAMA for v in variants) and not (args.llama_venv / "READY").is_file():
        print(f"no {args.llama_venv / 'READY'}: llama.cpp left out", file=sys.stderr)
        variants = [v for v in variants if v not in LLAMA]
    src = source(args.cache, args.scale)
    models: dict[str, Path] = {}
    for name in variants:
        if name in OURS:
            quantize, options, _ = OURS[name]
            models[name] = our_pack(src, args.cache, quantize, options)
        else:
            models[name] = gguf(src, args.cache, LLAMA[name], llama_python)
    quality = {
        n: json.loads((p / "manifest.json").read_text())["precision"]["quality"] for n, p in models.items() if n in OURS
    }
    from tokenizers import Tokenizer

    sys.path.insert(0, str(DRIVER.parent))
    from driver import prompt_text

    tokenizer = Tokenizer.from_file(str(src / "tokenizer.json"))
    ids = tokenizer.encode(prompt_text(tokenizer, args.prompt_tokens), add_special_tokens=False).ids
    context = len(ids) + args.max_tokens + 8
    results = Results("generate-levers", vars(args))
    with quotas("levers") as qs:
        quota = qs["levers"]
        quota.set(args.vcpus)
        from bench.generate.run import threads_at

        threads = threads_at(quota, base_env())
        for rnd in range(args.rounds):
            for name in order(variants, rnd):
                if name in OURS:
                    keep = "keep" if OURS[name][2] else "no-keep"
                    child_argv = [sys.executable, __file__, "ours-child", str(models[name]), keep]
                    env = base_env(WARMSTART_MODEL=str(models[name]), AWS_LAMBDA_FUNCTION_MEMORY_SIZE="3008")
                    request: dict[str, Any] = {"prompt_tokens": args.prompt_tokens, "max_tokens": args.max_tokens}
                else:
                    child_argv = [str(llama_python), __file__, "llama-child", str(models[name]), str(threads)]
                    child_argv.append(str(context))
                    env = base_env()
                    request = {"ids": ids, "max_tokens": args.max_tokens}
                child = Child(quota.wrap(child_argv), env, MARK)
                try:
                    measure(child, request)
                    runs = [measure(child, request) for _ in range(2)]
                    rss = peak_rss_mb(child.pid)
                finally:
                    child.close()
                mean = {k: sum(float(r[k]) for r in runs) / len(runs) for k in runs[0]}
                results.add(variant=name, round=rnd, cold_first_token_ms=child.ready_ms, peak_rss_mb=rss, **mean)
    load = os.getloadavg()
    rows = []
    for name in variants:
        q = quality.get(name)
        rows.append(
            [
                name,
                results.stat("ttft_ms", variant=name).fmt(0, " ms"),
                results.stat("decode_tps", variant=name).fmt(1),
                results.stat("cpu_ms", variant=name).fmt(0, " ms"),
                results.stat("minflt", variant=name).fmt(0),
                results.stat("peak_rss_mb", variant=name).fmt(0, " MB"),
                "-" if q is None else f"{q['greedy_agreement']:.3f} / {q['top1_agreement']:.3f}",
            ]
        )
    lines = [
        f"threads: {threads} (every variant); prompt {len(ids)} tokens, {args.max_tokens} greedy tokens; "
        f"{args.vcpus} vCPU quota; load average at the end {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}",
        "",
        table(
            [
                "variant",
                f"warm TTFT ({len(ids)} tokens)",
                "decode tokens/s",
                "CPU / request",
                "minor faults / request",
                "peak RSS",
                "greedy / top-1 agreement",
            ],
            rows,
        ),
        "",
    ]
    for ours, theirs in VERSUS:
        if ours in variants and theirs in variants:
            for key in ("ttft_ms", "decode_tps"):
                lines.append(f"- {ours} / {theirs}, {key}: {fmt_ratio(ratios(results.rows, key, ours, theirs))}")
    for name in variants:
        base = next((b for b in ("int4", "int8") if name.startswith(b + "-")), None)
        if base and base in variants and not name.endswith("-before"):
            for key in ("ttft_ms", "decode_tps"):
                lines.append(f"- {name} / {base}, {key}: {fmt_ratio(ratios(results.rows, key, name, base))}")
    results.save(Path(args.out), "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
