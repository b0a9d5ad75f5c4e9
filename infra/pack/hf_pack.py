"""`warmstart pack --from DIR`: a user's own Hugging Face / sentence-transformers model, packed.

read_source (check everything, write nothing) -> stage the weights as safetensors (a pytorch_model.bin only
through `torch.load(weights_only=True)`) -> export to ONNX with the task's head in the graph -> publish:
tokenizer.json (+ vocab.txt where the tokenizer shortcut is proved: infra.pack.wordpiece), model.onnx +
page-aligned model.onnx.data, program.json + model.safetensors (torch backend), manifest.

Backend names are the run time's (handler.backends.registry); EXPORTERS says which of them this pack writes.

About one thing (the pipeline from a directory to a published pack, each kind's step in its place: the kinds'
own reading and fields live in their modules), hence its length.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from handler.core.manifest import FORMAT, FORMAT_VERSION, TensorSpec
from infra.pack import hybrid_source, multivector_source, sparse_source
from infra.pack.golden import with_golden
from infra.pack.hf_checks import SourceError, check_checkpoint, one_line, safetensors_shapes
from infra.pack.hf_source import HFSource, UnsupportedModelError, read_source
from infra.pack.onnx_io import ONNX_DATA, ONNX_FILE
from infra.pack.precision import Precision, PrecisionError
from infra.pack.progress import phase
from infra.pack.publish import check_model_id, check_output, default_id, default_version, publish

# The backends `pack --from` writes an artifact for (the ONNX graph; torch.export's program), in default order.
# Their names are checked against the backend registry first: one place says what a backend is called.
EXPORTERS = ("onnx", "torch")
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_FILE = "tokenizer.json"


def choose_backends(backends: Iterable[str] | None) -> tuple[str, ...]:
    """The backends to pack: every exporter's by default, else the named ones, each a backend the registry knows
    (its error lists them) that this pack exports for. Whether the exported program serves the model is decided
    by exporting it (export_torch)."""
    if backends is None:
        return EXPORTERS
    from handler.backends import registry
    from handler.core.errors import ConfigError

    chosen = tuple(dict.fromkeys(b.strip() for b in backends if b.strip()))
    if not chosen:
        raise SourceError(f"backends (none); valid: {', '.join(EXPORTERS)} (one or both)")
    for name in chosen:
        try:
            registry.spec(name)
        except ConfigError as e:
            raise SourceError(f"backends {', '.join(chosen)}: {e}") from None
        if name not in EXPORTERS:
            raise SourceError(
                f"backend {name!r} has no exporter in `pack --from`; it exports for: {', '.join(EXPORTERS)}"
            )
    return chosen


def pack_from(
    source_dir: Path,
    out: Path,
    *,
    model_id: str | None = None,
    version: str | None = None,
    task: str = "auto",
    backends: Iterable[str] | None = None,
    fuse: bool = True,
    force: bool = False,
    source_info: dict[str, str] | None = None,
    precision: Precision | None = None,
    pooling: str | None = None,
) -> Path:
    """Pack the model directory `source_dir` into `out`. Refusals (`SourceError`) come before any write.

    `source_info`: more about where the
    directory came from, added to the manifest's `source` (the default model: its PyPI package). `precision`:
    `--dtype` (the torch program) or `--quantize` (the ONNX graph), each behind the quality gate
    (infra.pack.quality: refused below its threshold before anything is written), recorded as `precision`."""
    from infra.pack.lm_source import is_causal_lm

    if task == "generate" or (task == "auto" and is_causal_lm(Path(source_dir))):
        return _pack_generate(source_dir, out, model_id, version, backends, force, source_info, precision)
    from infra.pack.image_source import is_image_text

    if task == "image-text" or (task == "auto" and is_image_text(Path(source_dir))):
        from infra.pack.image_pack import pack_image_text

        return pack_image_text(
            source_dir,
            out,
            model_id=model_id,
            version=version,
            backends=backends,
            force=force,
            source_info=source_info,
            precision=precision,
        )
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # transformers must never reach for a hub from here
    phase("reading the model directory")
    source = read_source(Path(source_dir), task, pooling)
    chosen, unsupported = choose_backends(backends), dict[str, str]()
    precision = precision or Precision()
    if precision.reduced:
        chosen, unsupported = precision.backends(chosen, unsupported, None if backends is None else list(backends))
    model_id = check_model_id(model_id) if model_id is not None else default_id(source.root)
    out = check_output(out, force, [source.root])  # before the export: refusals cost nothing
    check_transformers_config(source)
    tokenizer = load_tokenizer(source)
    source = RESOLVED[source.task].resolved(source, tokenizer, precision) if source.task in RESOLVED else source
    pair = None
    if source.logit_score is not None:  # a decoder reranker: its chat template as three strings (a refusal here)
        from infra.pack.lm_rerank import pair_template

        pair = pair_template(source.root, source.model_root, tokenizer)
    version = version or default_version(source.content_sha256, source.task, precision.label)
    calibration, calibration_texts = None, None
    if precision.reduced:
        from infra.pack.hf_export import input_names
        from infra.pack.quality import calibration_feeds, texts_in_feed_order

        texts = precision.texts(tokenizer, source.max_seq_length)
        calibration, order = calibration_feeds(source, tokenizer, texts, input_names(source), pair)
        calibration_texts = texts_in_feed_order(texts, order) if source.task != "rerank" else None
    quality: dict[str, Any] | None = None

    with tempfile.TemporaryDirectory(prefix="warmstart-pack-") as staging:
        staged = stage_safetensors(source, Path(staging))
        if source.weights.suffix != ".safetensors":  # read_source checked a model.safetensors' header already
            shapes = safetensors_shapes(staged / WEIGHTS_FILE)
            check_checkpoint(shapes, source.weights, source.model_root / "config.json", source.config, source.family)
        # Pack memory: the model is loaded once, for the refusal check, and shared by both exports;
        # its outputs on the probe batches are computed once; the ONNX graph goes to disk a tensor at a time; the
        # model is freed before ORT's fusions load the graph.
        phase("loading the weights")
        model = check_weights(source, staged)
        from infra.pack.hf_export import free_memory, reference_outputs

        reference = reference_outputs(source, model)
        program = None
        if "torch" in chosen:
            phase("exporting the torch program")
            program, chosen, unsupported = export_torch(
                source, staged, chosen, unsupported, backends, model, reference, precision, calibration
            )
            if program is not None and program.quality is not None:
                from infra.pack.quality import check

                quality = check(source.task, program.quality, precision.min_quality, f"--dtype {precision.dtype}")
        exported = None
        if "onnx" in chosen:
            from infra.pack.hf_export import check_graph, export_graph, fuse_graph

            phase("exporting the ONNX graph")
            export_graph(source, model, reference, staged / "onnx")
            del model
            free_memory()
            diff, unfused = check_graph(source, staged / "onnx", reference)
            fuse_attention = True
            if precision.quantize is not None:  # both int8 methods need q, k and v as MatMuls, not fused
                from infra.pack.quantize import Int8Options

                fuse_attention = Int8Options(method=precision.quantize).fuse_attention
            phase("fusing the ONNX graph" if fuse else "checking the ONNX graph")
            exported = fuse_graph(source, staged / "onnx", reference, diff, unfused, fuse, fuse_attention)
        else:
            del model
            free_memory()

        def build(tmp: Path) -> dict[str, Any]:
            quantizing = exported is not None and precision.quantize is not None
            phase(f"quantizing ({precision.quantize}), the quality gate" if quantizing else "writing the packed model")
            pad_id = write_tokenizer(source, tokenizer, tmp / TOKENIZER_FILE)
            sparse_source.write_static_query(source.root, source.splade, tmp)  # a Router's static query encoder
            shortcut = tokenizer_shortcut(tmp / TOKENIZER_FILE, source.max_seq_length, pad_id, tmp)
            spec: dict[str, dict[str, Any]] = {}
            if exported is not None and precision.quantize is not None:
                from infra.pack.quantize import pack_int8

                specials = getattr(tokenizer, "all_special_ids", [])  # their embedding rows stay exact
                spec["onnx"] = pack_int8(
                    source, exported, staged, tmp, precision, calibration or [], calibration_texts, specials
                )
            elif exported is not None:
                for name in (ONNX_FILE, ONNX_DATA):
                    shutil.move(exported.where / name, tmp / name)
                spec["onnx"] = {"model": ONNX_FILE, "files": [ONNX_FILE, ONNX_DATA], "fused": exported.fused}
            if program is not None:
                spec["torch"] = torch_spec(tmp, program)
            manifest = manifest_for(source, model_id, str(version), spec, unsupported, chosen, pad_id)
            if pair is not None:
                manifest["pair_template"] = pair
            if precision.reduced:
                gate = quality if quality is not None else spec["onnx"].pop("quality")
                manifest["precision"] = precision.entry(gate, backend=chosen[0])
            manifest["source"].update(source_info or {})
            if shortcut is not None:
                manifest["tokenizer"]["shortcut"] = shortcut
            return manifest

        return publish(with_golden(build), out, force, [source.root])


def _pack_generate(
    source_dir: Path,
    out: Path,
    model_id: str | None,
    version: str | None,
    backends: Iterable[str] | None,
    force: bool,
    source_info: dict[str, str] | None,
    precision: Precision | None,
) -> Path:
    """A causal LM: task generate, onnxruntime-genai's graph (infra.pack.lm_pack), vLLM's hf/ copy
    (infra.pack.lm_vllm), or both."""
    from infra.pack.lm_pack import pack_lm
    from infra.pack.lm_vllm import VLLM, choose, more, pack_vllm

    chosen = choose(backends)
    common: dict[str, Any] = {"model_id": model_id, "version": version, "force": force, "precision": precision}
    if chosen == (VLLM,):  # no graph to build: the source's files copied for vLLM
        return pack_vllm(Path(source_dir), out, source_info=source_info, **common)
    return pack_lm(Path(source_dir), out, source_info=source_info, more=more if VLLM in chosen else None, **common)


def tokenizer_shortcut(path: Path, max_length: int, pad_id: int, out: Path) -> dict[str, Any] | None:
    """The tokenizer shortcut's manifest entry (vocab.txt written into `out`) when the pack-time proof holds
    (infra.pack.wordpiece: a plain BERT WordPiece tokenizer); None for any other tokenizer, or one whose JSON the
    check cannot read (a missing or mistyped field: KeyError, TypeError): the shortcut is only a saving."""
    from infra.pack.wordpiece import prove_tokenizer

    try:
        return prove_tokenizer(path, max_length, pad_id, out)
    except (KeyError, TypeError, ValueError):  # ValueError: NotPlainBert among them
        return None


def export_torch(
    source: HFSource,
    staged: Path,
    chosen: tuple[str, ...],
    unsupported: dict[str, str],
    backends: Iterable[str] | None,
    model: Any = None,
    reference: Any = None,
    precision: Precision | None = None,
    calibration: list[dict[str, Any]] | None = None,
) -> tuple[StagedProgram | None, tuple[str, ...], dict[str, str]]:
    """The torch backend's exported program, staged in `staged`/program, and the backends left to pack.

    A model torch.export cannot capture faithfully is refused for torch when torch was asked for; otherwise torch
    is dropped from the default backends with the reason in `unsupported_backends` (None). The program's files are
    written to the staging directory at once: its weights (the size of the model) are not held in memory through
    the ONNX export."""
    from infra.pack.hf_export import free_memory
    from infra.pack.torch_program import ProgramExportError, export_program

    dtype = precision.dtype if precision is not None else "float32"
    try:
        program = export_program(source, staged, model, reference, dtype=dtype, calibration=calibration)
    except ProgramExportError as e:
        if dtype != "float32":
            raise PrecisionError(f"--dtype {dtype}: torch.export's program of the model failed ({e})") from None
        if backends is not None:
            raise UnsupportedModelError(f"backend torch is not supported for {source.family}: {e}") from None
        return None, tuple(b for b in chosen if b != "torch"), {**unsupported, "torch": str(e)}
    staged_program = StagedProgram.write(program, staged / "program")
    del program
    free_memory()  # torch.export's graph and the traced module hold the model in reference cycles: freed now
    return staged_program, chosen, unsupported


@dataclass(frozen=True)
class StagedProgram:
    """The exported program's files (program.json, model.safetensors) in a staging directory."""

    where: Path
    max_abs_diff: float
    attention: str
    dtype: str = "float32"
    quality: dict[str, Any] | None = None

    @staticmethod
    def write(program: Any, where: Path) -> StagedProgram:
        from safetensors.torch import save_file

        from infra.pack.torch_program import PROGRAM_FILE

        where.mkdir()
        (where / PROGRAM_FILE).write_bytes(program.program)
        save_file(program.tensors, str(where / WEIGHTS_FILE))
        return StagedProgram(where, program.max_abs_diff, program.attention, program.dtype, program.quality)


def torch_spec(tmp: Path, program: StagedProgram) -> dict[str, Any]:
    """Write the torch backend's files into `tmp`; its manifest entry: torch.export's program of the same module
    the ONNX graph is exported from (infra.pack.torch_program), program.json + model.safetensors under the
    program's parameter names."""
    import torch

    from infra.pack.torch_program import PROGRAM_FILE

    for name in (PROGRAM_FILE, WEIGHTS_FILE):
        shutil.move(program.where / name, tmp / name)
    return {
        "architecture": "exported-program",
        "program": PROGRAM_FILE,
        "weights": WEIGHTS_FILE,
        "files": [PROGRAM_FILE, WEIGHTS_FILE],
        "exported_with": {"torch": torch.__version__},
        "attention": program.attention,
        "max_abs_diff": program.max_abs_diff,
        **({"dtype": program.dtype} if program.dtype != "float32" else {}),
    }


def stage_safetensors(source: HFSource, staging: Path) -> Path:
    """config.json + model.safetensors in `staging`: what transformers loads (safetensors only, so nothing in
    the user's directory is ever unpickled) and what the torch backend maps."""
    shutil.copyfile(source.model_root / "config.json", staging / "config.json")
    if source.weights.name == WEIGHTS_FILE:
        os.symlink(source.weights.resolve(), staging / WEIGHTS_FILE)
        return staging
    import torch  # pack time only
    from safetensors.torch import save_file

    try:
        state = torch.load(str(source.weights), map_location="cpu", weights_only=True)
    except Exception as e:  # weights_only refuses any pickled object that is not plain tensors
        raise SourceError(f"{source.weights}: not loadable as plain tensors (torch.load weights_only=True): {e}") from e
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise SourceError(f"{source.weights}: expected a state dict of tensors")
    # safetensors refuses tensors sharing storage (tied weights): each one gets its own copy.
    save_file({k: v.detach().clone().contiguous() for k, v in state.items()}, str(staging / WEIGHTS_FILE))
    return staging


def check_weights(source: HFSource, staged: Path) -> Any:
    """The staged checkpoint loaded as transformers' stock class, its loading info checked (a missing, extra or
    misshapen tensor is refused: hf_checks.check_loading_info), before anything is written, whatever the backends.
    The model, which both exports then share (one load per pack)."""
    from infra.pack.hf_export import load_torch_model

    return load_torch_model(source, staged)


def check_transformers_config(source: HFSource) -> None:
    """config.json as transformers' config class reads it (strict about every field's type: an
    `add_cross_attention: -1` fails there), refused before anything is written."""
    import transformers  # pack time only

    path = source.model_root / "config.json"
    try:
        transformers.AutoConfig.from_pretrained(str(source.model_root), local_files_only=True)
    except Exception as e:  # transformers raises many types (TypeError, ValueError, its own validation errors)
        raise SourceError(f"{path}: transformers refuses it ({one_line(e)})") from None


def load_tokenizer(source: HFSource) -> Any:
    """transformers' fast tokenizer of the directory, loaded before anything is written."""
    import transformers  # pack time only

    where = source.tokenizer_json.parent if source.tokenizer_json is not None else _tokenizer_dir(source)
    try:
        return transformers.AutoTokenizer.from_pretrained(str(where), local_files_only=True, use_fast=True)
    except Exception as e:  # a tokenizer_config.json or vocabulary transformers cannot build from
        raise SourceError(f"{where}: transformers cannot load its tokenizer ({one_line(e)})") from None


def write_tokenizer(source: HFSource, tokenizer: Any, dest: Path) -> int:
    """tokenizer.json (copied, or built by transformers' fast tokenizer from the vocabulary files); the pad id."""
    where = source.tokenizer_json.parent if source.tokenizer_json is not None else _tokenizer_dir(source)
    if source.tokenizer_json is not None:
        shutil.copyfile(source.tokenizer_json, dest)
    else:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise SourceError(f"{where}: transformers built no fast tokenizer ({type(tokenizer).__name__})")
        backend.save(str(dest))
    pad = tokenizer.pad_token_id
    return int(pad if pad is not None else source.config.get("pad_token_id") or 0)


def _tokenizer_dir(source: HFSource) -> Path:
    from infra.pack.hf_source import TOKENIZER_SOURCES

    for where in (source.model_root, source.root):
        if all((where / n).is_file() for n in TOKENIZER_SOURCES[source.family]):
            return where
    return source.root


RESOLVED: dict[str, Any] = {"multivector": multivector_source, "hybrid": hybrid_source}  # ids by the tokenizer


def manifest_for(
    source: HFSource,
    model_id: str,
    version: str,
    spec: dict[str, dict[str, Any]],
    unsupported: dict[str, str],
    chosen: tuple[str, ...],
    pad_id: int,
) -> dict[str, Any]:
    """The manifest of /work/contract13.md for `source`."""
    from infra.pack.hf_export import OUTPUT_NAMES, input_names

    inputs = [TensorSpec(n, "int64", ("batch", "sequence")).to_json() for n in input_names(source)]
    output = OUTPUT_NAMES[source.task]
    shape: tuple[int | str, ...]
    if source.task in ("embedding", "sparse"):
        shape = ("batch", source.dimension)
    elif source.task in RESOLVED:  # a row per token
        shape = ("batch", "sequence", source.dimension + (1 + source.hybrid.colbert_dim if source.hybrid else 0))
    elif source.task == "rerank":
        shape = ("batch",)
    else:
        shape = ("batch", len(source.labels))
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "id": model_id,
        "version": version,
        "task": source.task,
        "family": source.family,
        "default_backend": chosen[0],
        "source": {
            "dir": source.root.resolve().name,
            "architecture": source.architecture,
            "content_sha256": source.content_sha256,
        },
        "backends": spec,
        "inputs": inputs,
        "outputs": [TensorSpec(output, "float32", shape).to_json()],
        "tokenizer": {
            "file": TOKENIZER_FILE,
            "truncation": source.max_seq_length,
            "padding": "longest",
            "pad_id": pad_id,
        },
        "max_seq_length": source.max_seq_length,
        "shape": source.shape,
    }
    if unsupported:
        manifest["unsupported_backends"] = dict(unsupported)
    if source.task == "embedding":
        manifest["pooling"] = {"mode": source.pooling, "normalize": source.normalize, "in_graph": True}
        manifest["dimension"] = source.dimension
        manifest["prompts"] = dict(source.prompts)
        manifest["default_prompt_name"] = source.default_prompt_name
    elif source.task in ("multivector", "sparse", "hybrid"):
        {**RESOLVED, "sparse": sparse_source}[source.task].add_to_manifest(manifest, source)
    elif source.task == "rerank":
        manifest["activation"] = source.activation
    else:
        manifest["labels"] = list(source.labels)
        manifest["problem_type"] = source.problem_type
    return manifest
