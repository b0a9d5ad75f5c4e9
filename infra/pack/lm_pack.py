"""`warmstart pack --from DIR` for a causal LM (task "generate"): onnxruntime-genai's model builder on a staged
copy of the directory, the quality gate against transformers, then publish.

read_lm_source (check everything, write nothing) -> check the tensors against the architecture -> stage
(config, tokenizer files, links to the weights: the user's directory is never written) -> the builder in a child
process (infra/pack/lm_build_child.py: its config fixes, its memory freed when it exits) -> the gate
(infra.pack.lm_quality: float32 exact, int8/int4 above --min-quality) -> publish: model.onnx, model.onnx.data,
genai_config.json (eos and search defaults set to the manifest's), the user's tokenizer.json (its BPE merges as
strings where provably the same tokenizer: infra.pack.bpe_merges), for int4 model.q4.onnx (the body's MatMulNBits
as our Q4MatMul, proved: infra.pack.lm_q4; `backends.genai.q4`, or `q4_skipped` and why), the manifest
(`generation`: what the task reads). The builder's own tokenizer files are not packed: the handler tokenizes
with `tokenizers` and feeds ids.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from handler.core.manifest import FORMAT, FORMAT_VERSION
from infra.pack import lm_head, lm_int4
from infra.pack.hf_checks import SourceError
from infra.pack.lm_source import SIDE_FILES, LMSource, check_tensors, read_lm_source
from infra.pack.precision import Precision, PrecisionError
from infra.pack.publish import check_model_id, check_output, default_id, default_version, publish

BACKEND = "genai"
GENAI_CONFIG = "genai_config.json"
MODEL_FILE = "model.onnx"
MODEL_DATA = "model.onnx.data"
TOKENIZER_FILE = "tokenizer.json"
# --dtype / --quantize -> the builder's -p on CPU. float16/bfloat16 graphs are the builder's CUDA targets only
# (0.18 writes them for -e cuda/dml/webgpu): refused, with what CPU packs.
BUILDER_PRECISION = {("float32", None): "fp32", ("float32", "int8"): "int8", ("float32", "int4"): "int4"}
CPU_CHOICES = "--dtype float32, --quantize int8, --quantize int4"
DEFAULT_KEYS = ("temperature", "top_p", "top_k", "do_sample", "repetition_penalty")
# The builder's extra options per target (onnxruntime-genai 0.18's names: `builder.py --help`), recorded in the
# manifest (precision.builder_options, precision.scheme) and hashed into the default version, so two schemes of
# one model are two id@versions. Measured on the Qwen3-0.6B-shaped model at 1.7 vCPU (bench/generate/levers.py,
# docs/benchmarks.md "Generation speed levers"):
# - prune_lm_head: prefill runs the LM head on the last position only (logits [1, 1, vocab]), not on every prompt
#   position (a 512-token prompt: 512 x hidden x 151,936 multiply-adds and a 311 MB logits buffer faulted in per
#   request): with keep_freed_memory, against neither, CPU per request 0.77-0.88x, ~300 MB less peak memory, time
#   to first token 0.63-1.06x (a loaded host's rounds). Every reader takes the last position's logits
#   (handler.backends.genai, infra.pack.lm_quality).
# - accuracy_level 4: MatMulNBits quantizes the activations to int8 and runs int8 dot products (AVX2 on this
#   host's AMD EPYC; AVX-VNNI / AVX512-VNNI / AMX where the CPU has them).
# - block_size: int4 keeps the builder's 32 (128 lowered real SmolLM2's greedy agreement 0.210 -> 0.156, an
#   earlier session's figure); int8 takes 128 (8 bits keep a block of 128 close; a quarter of the scales).
# - is_symmetric: no zero points to read or subtract (the builder's default, stated so the record is whole).
# - scales (ours, not the builder's; int4 only): "rtn" keeps the builder's round-to-nearest blocks (Q4_0's scale);
#   "mse" rewrites them with per-block scales of least squared error (infra.pack.lm_int4): same graph and kernels.
#   Not the default: on real SmolLM2 perplexity 67.92 -> 65.24, Q4_0 63.37, greedy agreement 0.21 either way
#   (docs/benchmarks.md): the int4 LM head costs more than the scales recover (Q4_0 keeps its head at Q6_K).
# - head_bits (ours, int4 only; int8's head is 8 bits): the LM head's MatMulNBits (and a tied embedding's
#   GatherBlockQuantized) at 8 bits on the int4 body, through the builder's `matmul_mixed_precision=last_matmul:int8`
#   (infra.pack.lm_head, which mends and proves the builder's tied gather). The default: on real SmolLM2-135M
#   the gate's greedy / top-1 agreement 0.210 / 0.774 -> 0.398 / 0.826 and perplexity 67.92 -> 63.77 (Q4_0, its
#   head at Q6_K: 0.34 and 63.37); on the 0.6B Qwen3-shaped pack decode CPU per step 1.03x (1.00-1.08), peak RSS
#   +90 MB (the head's +78 MB of weights), docs/benchmarks.md "An 8-bit LM head". `head_bits: 4`: the int4 head.
# - head_block (ours, the 8-bit head only): the head's blocks quantized again from the source in blocks of 128 (the
#   largest of 16..256 up to 128 that divides the hidden size; infra.pack.lm_head.reblock) where the builder writes
#   the body's 32: MLAS' prepacked head keeps a float scale and block sum per block resident, a quarter of them at
#   128 (docs/benchmarks.md "The 8-bit head in blocks of 128"). Resolved per model before the version is hashed.
BUILDER_OPTIONS: dict[str, dict[str, str | int | bool]] = {
    "fp32": {"prune_lm_head": True},
    "int8": {"prune_lm_head": True, "block_size": 128, "accuracy_level": 4, "is_symmetric": True},
    "int4": {
        "prune_lm_head": True,
        "block_size": 32,
        "accuracy_level": 4,
        "is_symmetric": True,
        "scales": "rtn",
        "head_bits": 8,
    },
}
OUR_OPTIONS = ("scales", "head_bits", "head_block")  # ours: never passed to the builder as such
_CHILD = Path(__file__).with_name("lm_build_child.py")


def builder_precision(precision: Precision) -> str:
    found = BUILDER_PRECISION.get((precision.dtype, precision.quantize))
    if found is None:
        what = f"--quantize {precision.quantize}" if precision.quantize else f"--dtype {precision.dtype}"
        raise PrecisionError(
            f"{what}: not packed for task generate (onnxruntime-genai's builder writes float16/bfloat16 graphs for "
            f"CUDA only, and int8-dynamic is an encoder quantization); valid on CPU: {CPU_CHOICES}"
        )
    return found


def pack_lm(
    source_dir: Path,
    out: Path,
    *,
    model_id: str | None = None,
    version: str | None = None,
    force: bool = False,
    precision: Precision | None = None,
    source_info: dict[str, str] | None = None,
    builder_options: dict[str, str | int | bool] | None = None,
    more: Callable[[LMSource, Path], dict[str, Any]] | None = None,
) -> Path:
    """Pack the causal LM in `source_dir` into `out` (refusals before anything is written). `builder_options`
    override BUILDER_OPTIONS' for the precision (bench/generate/levers.py builds each lever off this way).
    `more`: other backends' files written beside genai's, and their manifest entries (vllm's:
    infra.pack.lm_vllm.more)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # transformers (ours and the builder's) never reaches for a hub
    precision = precision or Precision()
    label = precision.quantize or precision.dtype
    target = builder_precision(precision)
    source = read_lm_source(Path(source_dir))
    model_id = check_model_id(model_id) if model_id is not None else default_id(source.root)
    out = check_output(out, force, [source.root])
    check_tensors(source)
    tokenizer = load_tokenizer(source)
    generation = generation_fields(source, tokenizer)
    options = {**BUILDER_OPTIONS[target], **(builder_options or {})}
    check_scales(target, options)
    lm_head.check(target, options)
    head_block = lm_head.check_block(target, options, int(source.config["hidden_size"]))
    if target == "int4" and lm_head.check(target, options) == 8:  # resolved for this model: the version names it
        options["head_block"] = head_block
    version = version or default_version(source.content_sha256, "generate", label, json.dumps(options, sort_keys=True))
    with tempfile.TemporaryDirectory(prefix="warmstart-pack-lm-") as staging:
        staged = stage(source, Path(staging) / "source")
        built = Path(staging) / "built"
        run_builder(staged, built, Path(staging) / "cache", target, options)
        read = lm_int4.source_reader(source.weights)
        head = lm_head.mend_tied(built, read)
        reblocked = lm_head.reblock(built, read, int(options["head_block"])) if "head_block" in options else None
        blocks = requantize(source, built, target, options)
        edit_genai_config(built / GENAI_CONFIG, generation)
        generation["kv"]["dtype"] = kv_dtype(built / MODEL_FILE)

        from infra.pack import lm_quality
        from infra.pack.lm_calibration import NEW_TOKENS, builtin_prompts

        prompts = list(precision.calibration) if precision.calibration is not None else builtin_prompts()
        figures = lm_quality.measure(source, built, prompts, NEW_TOKENS, generation["eos_token_ids"])
        quality = lm_quality.check(figures, label, precision.min_quality)

        def build(tmp: Path) -> dict[str, Any]:
            for name in (GENAI_CONFIG, MODEL_FILE, MODEL_DATA):
                shutil.move(built / name, tmp / name)
            from infra.pack.bpe_merges import write_tokenizer

            write_tokenizer(source.tokenizer_json, tmp / TOKENIZER_FILE)  # merges as strings: parsed faster at init
            from infra.pack.lm_layout import align

            layout = align(tmp)  # the weights at page offsets, mapped in place (infra/pack/lm_layout.py)
            manifest = manifest_for(source, model_id, str(version), generation)
            manifest["backends"][BACKEND]["layout"] = layout
            manifest["precision"] = precision.entry(quality, backend=BACKEND, **scheme_entry(target, options))
            if blocks is not None:
                manifest["precision"]["scheme"]["blocks"] = blocks
            if head is not None:
                manifest["precision"]["scheme"]["tied_head"] = head
            if reblocked is not None:
                manifest["precision"]["scheme"]["head_reblocked"] = reblocked
            manifest["source"].update(source_info or {})
            # The decoder with its int4 MatMulNBits as our Q4MatMul (no prepack at load), where the op's library
            # is built or builds here and the proof holds; else the pack goes on without it, saying why.
            from infra.pack import lm_q4

            q4, skipped = lm_q4.attach(tmp, precision.quantize)
            manifest["backends"][BACKEND].update({"q4": q4} if q4 is not None else {"q4_skipped": skipped})
            if more is not None:
                manifest["backends"].update(more(source, tmp))
            return manifest

        return publish(build, out, force, [source.root], read_back=read_back)


def read_back(root: Path) -> Any:
    """The manifest read as a model load reads it (the generate task's fields checked) where the task is
    installed; else its structure and files (handler.core.manifest)."""
    from handler.core.errors import ConfigError
    from handler.core.manifest import load_manifest
    from handler.tasks import catalog

    try:
        catalog.spec("generate")
    except ConfigError:
        return load_manifest(root)
    return catalog.load_manifest(root)


def load_tokenizer(source: LMSource) -> Any:
    import transformers  # pack time only

    from infra.pack.hf_checks import one_line

    try:
        return transformers.AutoTokenizer.from_pretrained(str(source.root), local_files_only=True, use_fast=True)
    except Exception as e:  # a tokenizer_config.json transformers cannot build from
        raise SourceError(f"{source.root}: transformers cannot load its tokenizer ({one_line(e)})") from None


def _ids(value: Any) -> list[int]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def generation_fields(source: LMSource, tokenizer: Any) -> dict[str, Any]:
    """The manifest's `generation` (the contract): what transformers reads of the directory."""
    config, gen = source.config, source.generation_config
    eos = list(dict.fromkeys(_ids(gen.get("eos_token_id")) + _ids(config.get("eos_token_id"))))
    if not eos and tokenizer.eos_token_id is not None:
        eos = [int(tokenizer.eos_token_id)]
    if not eos:
        raise SourceError(f"{source.root}: no eos token id (generation_config.json, config.json, the tokenizer)")
    bos = tokenizer.bos_token_id
    if bos is None:
        bos = next(iter(_ids(gen.get("bos_token_id")) + _ids(config.get("bos_token_id"))), None)
    pad = tokenizer.pad_token_id
    if pad is None:
        pad = next(iter(_ids(gen.get("pad_token_id")) + _ids(config.get("pad_token_id"))), None)
    probe = tokenizer("hello world")["input_ids"]
    heads = int(config["num_attention_heads"])
    return {
        "chat_template": source.chat_template,
        "special_tokens": {
            name: (str(getattr(tokenizer, name)) if getattr(tokenizer, name, None) is not None else None)
            for name in ("bos_token", "eos_token", "pad_token", "unk_token")
        },
        "bos_token_id": None if bos is None else int(bos),
        "eos_token_ids": [int(i) for i in eos],
        "pad_token_id": None if pad is None else int(pad),
        "add_bos_token": bool(bos is not None and probe and probe[0] == bos),
        "context_length": source.context_length,
        "vocab_size": int(config["vocab_size"]),
        "defaults": {k: gen[k] for k in DEFAULT_KEYS if k in gen},
        "kv": {
            "layers": int(config["num_hidden_layers"]),
            "kv_heads": int(config.get("num_key_value_heads") or heads),
            "head_dim": int(config.get("head_dim") or int(config["hidden_size"]) // heads),
            "dtype": "float32",
        },
    }


def stage(source: LMSource, where: Path) -> Path:
    """What the builder reads, in a directory of ours: the JSON and tokenizer files copied, the weights linked
    (never written: the builder loads them read-only through transformers)."""
    where.mkdir(parents=True)
    for name in SIDE_FILES:
        if (source.root / name).is_file():
            shutil.copyfile(source.root / name, where / name)
    for path in source.weights:
        os.symlink(path.resolve(), where / path.name)
    index = source.root / "model.safetensors.index.json"
    if index.is_file():
        shutil.copyfile(index, where / index.name)
    return where


def scheme_entry(target: str, options: dict[str, str | int | bool]) -> dict[str, Any]:
    """The manifest's record of how the graph was built: every builder option, and for int8/int4 the
    quantization scheme (MatMulNBits' block size, accuracy level, symmetric or not) as the builder applies it."""
    out: dict[str, Any] = {"builder_options": {k: v for k, v in sorted(options.items()) if k not in OUR_OPTIONS}}
    if target in ("int8", "int4"):
        out["scheme"] = {
            "block_size": int(options.get("block_size", 32)),
            "accuracy_level": int(options.get("accuracy_level", 4)),
            "symmetric": symmetric(options),
            "scales": str(options.get("scales", "rtn")),
            "head_bits": lm_head.check(target, options),
            "head_block": int(options.get("head_block", options.get("block_size", 32))),
        }
    return out


def symmetric(options: dict[str, str | int | bool]) -> bool:
    """The builder's `is_symmetric` option as it reads it (a bool, or its text from the command line)."""
    return str(options.get("is_symmetric", True)).lower() in ("true", "1")


def check_scales(target: str, options: dict[str, str | int | bool]) -> str:
    """The `scales` option, refused (before anything is built) where it does not apply."""
    from infra.pack.lm_int4 import SCALES

    scales = str(options.get("scales", "rtn"))
    sym = symmetric(options)
    if scales not in SCALES or (scales != "rtn" and (target != "int4" or not sym)):
        raise PrecisionError(
            f"scales={scales!r} for {target}{'' if sym else ' (asymmetric)'}; valid: "
            f"{', '.join(SCALES)} for symmetric int4, rtn otherwise"
        )
    return scales


def requantize(
    source: LMSource, built: Path, target: str, options: dict[str, str | int | bool]
) -> dict[str, Any] | None:
    """`scales` applied to the builder's graph in `built` (infra.pack.lm_int4): "mse" rewrites every int4 block
    from the source's float weights; "rtn" (and every other target) keeps the builder's. The record for the
    manifest's scheme, or None where nothing was rewritten."""
    scales = check_scales(target, options)
    if scales == "rtn":
        return None
    return lm_int4.requantize(built, lm_int4.source_reader(source.weights), scales)


def run_builder(staged: Path, built: Path, cache: Path, target: str, options: dict[str, str | int | bool]) -> None:
    """onnxruntime-genai's builder in a child process (infra/pack/lm_build_child.py)."""
    extra = {k: v for k, v in options.items() if k not in OUR_OPTIONS}
    extra.update(lm_head.builder_extra(target, lm_head.check(target, options)))
    args = {"input": str(staged), "output": str(built), "precision": target, "cache": str(cache), "extra": extra}
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, str(_CHILD), json.dumps(args)], capture_output=True, text=True, env=env, check=False
    )
    if result.returncode != 0 or not (built / MODEL_FILE).is_file():
        lines = [line for line in (result.stderr or result.stdout).splitlines() if line.strip()]
        raise SourceError(f"onnxruntime-genai's model builder failed ({target}): {lines[-1] if lines else 'no output'}")
    if not (built / MODEL_DATA).is_file():  # the tiniest graphs keep their weights inline: an empty data file
        (built / MODEL_DATA).write_bytes(b"")


def edit_genai_config(path: Path, generation: dict[str, Any]) -> None:
    """The builder's genai_config.json with the manifest's eos ids and sampling defaults (the engine's search
    options come from the request; these are what a plain onnxruntime-genai client would use)."""
    config = json.loads(path.read_text())
    model = config["model"]
    model["eos_token_id"] = list(generation["eos_token_ids"])
    if generation["pad_token_id"] is not None:
        model["pad_token_id"] = generation["pad_token_id"]
    model["context_length"] = generation["context_length"]
    search = config.setdefault("search", {})
    defaults = generation["defaults"]
    search["do_sample"] = bool(defaults.get("do_sample", False))
    for key in ("temperature", "top_p", "top_k", "repetition_penalty"):
        if key in defaults:
            search[key] = defaults[key]
    path.write_text(json.dumps(config, indent=4) + "\n")


def kv_dtype(model_path: Path) -> str:
    """The KV cache's element type: the graph's first past-key input (float32 on CPU, float16 for a CUDA graph)."""
    import onnx  # pack time only

    graph = onnx.load(str(model_path), load_external_data=False).graph
    for value in graph.input:
        if value.name.startswith("past_key_values"):
            elem = value.type.tensor_type.elem_type
            return "float16" if elem == onnx.TensorProto.FLOAT16 else "float32"
    return "float32"


def manifest_for(source: LMSource, model_id: str, version: str, generation: dict[str, Any]) -> dict[str, Any]:
    """The manifest of /work/contract-generate.md."""
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "id": model_id,
        "version": version,
        "task": "generate",
        "family": source.family,
        "default_backend": BACKEND,
        "source": {
            "dir": source.root.resolve().name,
            "architecture": source.architecture,
            "content_sha256": source.content_sha256,
        },
        "backends": {
            BACKEND: {"config": GENAI_CONFIG, "model": MODEL_FILE, "files": [GENAI_CONFIG, MODEL_FILE, MODEL_DATA]}
        },
        "inputs": [],
        "outputs": [],
        "tokenizer": {"file": TOKENIZER_FILE},
        "generation": generation,
        "shape": {
            "hidden": int(source.config["hidden_size"]),
            "layers": int(source.config["num_hidden_layers"]),
            "heads": int(source.config["num_attention_heads"]),
            **(
                {"intermediate": source.config["intermediate_size"]}
                if type(source.config.get("intermediate_size")) is int and source.config["intermediate_size"] > 0
                else {}
            ),
        },
    }
