"""The vLLM backend's part of a causal-LM pack (`warmstart pack --from DIR --backends genai,vllm`, or `vllm` alone):
`hf/`, a copy of what vLLM loads from the source directory (config, generation config, tokenizer files, the
safetensors weights and their index), and the manifest's `backends.vllm` entry naming it.

vLLM loads a Hugging Face directory with its own model code (handler.backends.vllm_engine), so the copy is the
source's bytes: nothing is converted, and there is nothing for a quality gate to compare. A pack for vllm alone
therefore runs no builder and no gate; it refuses --dtype and --quantize (a reduced precision is the genai
backend's, behind its gate). vLLM picks the dtype it runs at load: the checkpoint's, a float32 one in the GPU's half
type; what that changes can only be measured on a GPU (make gpu-check). The copy is a copy, not a link: a pack is
self-contained (an image layer, an S3 upload), and the SHA-256 of each file is in the manifest like any other.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from handler.backends.vllm_spec import HF_DIR, NAME
from infra.pack.bpe_merges import write_tokenizer
from infra.pack.hf_source import UnsupportedModelError
from infra.pack.lm_source import SIDE_FILES, WEIGHTS_INDEX, LMSource
from infra.pack.precision import Precision, PrecisionError

VLLM = NAME
GENAI = "genai"  # infra.pack.lm_pack.BACKEND (not imported: that module imports this one)
GENERATE_BACKENDS = (GENAI, VLLM)
KV_DTYPE = "float16"  # vLLM's KV cache on a GPU: float16 or bfloat16, two bytes either way


def choose(backends: Iterable[str] | None) -> tuple[str, ...]:
    """The backends a generate pack writes: genai by default, else the named ones (genai, vllm, or both)."""
    if backends is None:
        return (GENAI,)
    chosen = tuple(dict.fromkeys(b.strip() for b in backends if b.strip()))
    if not chosen or any(b not in GENERATE_BACKENDS for b in chosen):
        raise UnsupportedModelError(
            f"backends {', '.join(chosen) or '(none)'}: task generate packs {', '.join(GENERATE_BACKENDS)} "
            "(one or both)"
        )
    return chosen


def check_precision(precision: Precision) -> None:
    """A pack for vllm alone: the checkpoint as it is (vLLM runs its dtype)."""
    if precision.reduced or precision.dtype != "float32":
        what = f"--quantize {precision.quantize}" if precision.quantize else f"--dtype {precision.dtype}"
        raise PrecisionError(
            f"{what}: the vllm backend loads the source's weights as they are (no gate to pass); pack "
            "--backends genai for a reduced precision, or genai,vllm to have both"
        )


def write_hf(source: LMSource, into: Path) -> dict[str, Any]:
    """Copy what vLLM loads into `into`/hf; the manifest's `backends.vllm` entry."""
    hf = into / HF_DIR
    hf.mkdir()
    names = [name for name in SIDE_FILES if (source.root / name).is_file()]
    names += [path.name for path in source.weights]
    if (source.root / WEIGHTS_INDEX).is_file():
        names.append(WEIGHTS_INDEX)
    for name in names:
        shutil.copyfile(source.root / name, hf / name)  # follows a hub cache's links to its blobs
    if "config.json" not in names or not source.weights:
        raise UnsupportedModelError(f"{source.root}: vLLM needs config.json and safetensors weights")
    return {"dir": HF_DIR, "files": sorted(f"{HF_DIR}/{name}" for name in names)}


def more(source: LMSource, into: Path) -> dict[str, Any]:
    """vllm's part of a genai pack (infra.pack.lm_pack.pack_lm's `more`)."""
    return {VLLM: write_hf(source, into)}


def vllm_only(manifest: dict[str, Any]) -> dict[str, Any]:
    """A manifest made for genai (infra.pack.lm_pack.manifest_for) turned into one for vllm alone."""
    manifest["default_backend"] = VLLM
    manifest["backends"] = {}
    manifest["generation"]["kv"]["dtype"] = KV_DTYPE
    return manifest


def pack_vllm(
    source_dir: Path,
    out: Path,
    *,
    model_id: str | None = None,
    version: str | None = None,
    force: bool = False,
    precision: Precision | None = None,
    source_info: dict[str, str] | None = None,
) -> Path:
    """Pack the causal LM in `source_dir` for the vllm backend alone (refusals before anything is written)."""
    import os

    from infra.pack import lm_pack
    from infra.pack.lm_source import check_tensors, read_lm_source
    from infra.pack.publish import check_model_id, check_output, default_id, default_version, publish

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # transformers (the tokenizer's read) never reaches for a hub
    precision = precision or Precision()
    check_precision(precision)
    source = read_lm_source(Path(source_dir))
    model_id = check_model_id(model_id) if model_id is not None else default_id(source.root)
    out = check_output(out, force, [source.root])
    check_tensors(source)
    generation = lm_pack.generation_fields(source, lm_pack.load_tokenizer(source))
    version = version or default_version(source.content_sha256, "generate", VLLM)

    def build(tmp: Path) -> dict[str, Any]:
        manifest = vllm_only(lm_pack.manifest_for(source, model_id, str(version), generation))
        manifest["backends"][VLLM] = write_hf(source, tmp)
        write_tokenizer(source.tokenizer_json, tmp / lm_pack.TOKENIZER_FILE)  # merges as strings: parsed faster at init
        manifest["precision"] = precision.entry(None, backend=VLLM)
        manifest["source"].update(source_info or {})
        return manifest

    return publish(build, out, force, [source.root], read_back=lm_pack.read_back)
