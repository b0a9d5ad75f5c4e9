"""A copy of a published int4 generate pack with its 8-bit LM head in blocks of another size, without packing the
model again (a 0.6B pack takes ~25 min on this host): what `pack_lm` does after the builder for `head_block`
(infra.pack.lm_head.reblock: the head's blocks proved the source's round-to-nearest, quantized again, a tied
gather's rows proved through ONNX Runtime), then the page-aligned layout and the manifest, optionally `warmstart
optimize`d into OUT-opt as `peers.py prepare --optimized` does. The int4 body's bytes are copied unchanged.

    python bench/generate/reblock.py --pack build/bench/peers-gen/qwen3-0.6b/ours-int4 \
        --source build/bench-models/qwen3-0.6b --head-block 128 --out build/bench/q06-head128 --optimize
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

COPIED = ("genai_config.json", "model.onnx", "model.onnx.data", "tokenizer.json")


def reblocked_copy(pack: Path, source: Path, block: int, out: Path, force: bool = False) -> Path:
    from infra.pack import lm_head, lm_int4
    from infra.pack.lm_layout import align
    from infra.pack.lm_pack import read_back
    from infra.pack.lm_source import read_lm_source
    from infra.pack.precision import PrecisionError
    from infra.pack.publish import publish

    old = json.loads((pack / "manifest.json").read_text())
    scheme = old.get("precision", {}).get("scheme", {})
    if old.get("task") != "generate" or scheme.get("head_bits") != 8:
        raise SystemExit(f"{pack}: not a generate pack with an 8-bit head (precision.scheme.head_bits)")
    src = read_lm_source(source)
    if src.content_sha256 != old["source"]["content_sha256"]:
        raise SystemExit(f"{source}: not the directory {pack} was packed from (content_sha256 differs)")
    options = {"block_size": int(scheme["block_size"]), "head_bits": 8, "head_block": block}
    try:
        lm_head.check_block("int4", options, int(src.config["hidden_size"]))
    except PrecisionError as e:
        raise SystemExit(str(e)) from None

    def build(tmp: Path) -> dict[str, Any]:
        for name in COPIED:
            shutil.copyfile(pack / name, tmp / name)
        record = lm_head.reblock(tmp, lm_int4.source_reader(src.weights), block)
        manifest = {k: v for k, v in old.items() if k not in ("files", "optimized")}
        manifest["version"] = f"{old['version']}-head{block}"
        manifest["backends"]["genai"] = {
            k: v for k, v in old["backends"]["genai"].items() if k not in ("optimized", "opt")
        }
        manifest["backends"]["genai"]["layout"] = align(tmp)
        manifest["precision"]["scheme"]["head_block"] = block
        if record is not None:
            manifest["precision"]["scheme"]["head_reblocked"] = record
        return manifest

    return publish(build, out, force, [pack], read_back=read_back)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pack", type=Path, required=True, help="a published int4 generate pack with an 8-bit head")
    ap.add_argument("--source", type=Path, required=True, help="the model directory it was packed from")
    ap.add_argument("--head-block", type=int, required=True, help="the head's new block size (16..256)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--optimize", action="store_true", help="also `warmstart optimize` a copy into OUT-opt")
    args = ap.parse_args(argv)
    out = reblocked_copy(args.pack, args.source, args.head_block, args.out, args.force)
    print(out)
    if args.optimize:
        opt = out.with_name(out.name + "-opt")
        if opt.exists():
            shutil.rmtree(opt)
        shutil.copytree(out, opt)
        subprocess.run([sys.executable, "-m", "infra.cli", "optimize", str(opt)], check=True, cwd=ROOT)
        print(opt)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
