"""`warmstart optimize DIR`: save a packed model's ONNX graph pre-optimized, with prepacked weights, for this
machine's ONNX Runtime and CPU (infra.pack.optimize; a generate pack's decoder: infra.pack.lm_layout), and prove
the tokenizer shortcut where it holds (infra.pack.wordpiece; a generate pack's BPE merges: infra.pack.bpe_merges);
an int4 generate pack made without it gains its Q4MatMul graph (infra.pack.lm_q4).
`--remove` takes the optimized model out again."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser("optimize", help="pre-optimize a packed ONNX model (prepacked weights) for this machine")
    p.add_argument("model", type=Path, nargs="?", default=Path("models/default"), help="packed model directory")
    p.add_argument("--remove", action="store_true", help="remove the optimized model instead")
    p.add_argument(
        "--json", action="store_true", help="print one JSON object (the manifest's entry) instead of the summary"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Pack-time tools (onnx) load only here, never in the function.
    from handler.core.errors import ModelLoadError
    from infra.cli.progress import Progress, human_size
    from infra.pack.optimize import LayoutError, OptimizeError, optimize, remove
    from infra.pack.wordpiece import NotPlainBert, prove

    if _task(args.model) == "generate":
        return _generate(args)
    try:
        if args.remove:
            removed = remove(args.model)
            what = "removed the optimized model from" if removed else "no optimized model in"
            print(
                json.dumps({"model": str(args.model), "removed": removed})
                if args.json
                else f"warmstart optimize: {what} {args.model}"
            )
            return 0
        with Progress("warmstart optimize", plain=not args.json) as progress:
            entry = optimize(args.model)
    except (OptimizeError, LayoutError, ModelLoadError, FileNotFoundError) as e:
        print(f"warmstart optimize: {e}", file=sys.stderr)
        return 1
    try:
        tokenizer: Any = prove(args.model)
    except NotPlainBert as e:  # not an error: init parses tokenizer.json as before
        tokenizer = {"shortcut": None, "reason": str(e)}
    if args.json:
        print(json.dumps({"model": str(args.model), "optimized": entry, "tokenizer": tokenizer}))
        return 0
    size = sum((args.model / name).stat().st_size for name in entry["files"])
    shortcut = (
        f"not used ({tokenizer['reason']})"
        if "reason" in tokenizer
        else f"{tokenizer.get('kind')}, proved on {tokenizer.get('proof', {}).get('cases')} cases"
    )
    print(
        f"warmstart optimize: wrote {', '.join(entry['files'])} into {args.model} in {progress.elapsed:.0f} s "
        f"({human_size(size)}), bit-identical to the portable model on {entry['bit_identical_probes']} probes\n"
        f"  tokenizer shortcut: {shortcut}\n"
        f"next: warmstart local --model {args.model}   (init takes the optimized model on this machine)"
    )
    return 0


def _task(model: Path) -> str | None:
    try:
        return str(json.loads((model / "manifest.json").read_text()).get("task"))
    except (OSError, ValueError, AttributeError, RecursionError):  # RecursionError: nested past the parser
        return None  # optimize() reports the unreadable manifest


def _generate(args: argparse.Namespace) -> int:
    """A generate pack: its decoder saved with prepacked weights, kept only when it answers exactly as the portable
    one (infra.pack.lm_layout); `--remove` keeps the page-aligned layout and drops the prepacked copy."""
    from handler.core.errors import ModelLoadError
    from infra.cli.progress import Progress
    from infra.pack.bpe_merges import compact_pack
    from infra.pack.lm_layout import relayout
    from infra.pack.lm_q4 import ensure
    from infra.pack.opt_layout import LayoutError

    try:
        with Progress("warmstart optimize", plain=not args.json):
            result = relayout(args.model, optimize=not args.remove)
            # A pack made before the merges were written as strings: its tokenizer parsed faster at init.
            result["tokenizer_merges_rewritten"] = False if args.remove else compact_pack(args.model)
            # A pack made before the Q4MatMul graph (or whose layout was redone): added, proved, where it applies.
            result["q4"], result["q4_reason"] = (None, "not asked (--remove)") if args.remove else ensure(args.model)
    except (LayoutError, ModelLoadError, FileNotFoundError) as e:
        print(f"warmstart optimize: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"model": str(args.model), **result}))
        return 0
    if result["optimized"] is None:
        print(f"warmstart optimize: no prepacked decoder in {args.model} ({result['optimized_reason']})")
    else:
        print(
            f"warmstart optimize: wrote {', '.join(result['optimized']['files'])} into {args.model}: "
            f"{result['optimized_reason']}"
        )
    if not args.remove:
        print(f"  {q4_line(result['q4'], result['q4_reason'])}")
    if result["optimized"] is not None or result["q4"] is not None:
        print(f"next: warmstart local --model {args.model}   (init opens the fastest decoder this machine can run)")
    return 0


def q4_line(entry: dict[str, Any] | None, why: str) -> str:
    """One line on the pack's Q4MatMul graph (infra.pack.lm_q4): what it holds and its proof, or why there is none."""
    if entry is None:
        return f"q4 graph: none ({why})"
    proof = entry["proof"]
    # a pack made before the 8-bit head was rewritten has no `ops`: its one op
    ops = ", ".join(f"{op} ({n})" for op, n in entry.get("ops", {entry["op"]: entry["rewritten"]}).items() if n)
    return (
        f"q4 graph: {entry['model']} {why}, {entry['rewritten']} MatMulNBits as {ops}, proved on "
        f"{proof['probes']} probes x {proof['steps']} steps (logits max diff {proof['max_abs_logit_diff']:.3g}, "
        f"tolerance {proof['tolerance']:.3g})"
    )
