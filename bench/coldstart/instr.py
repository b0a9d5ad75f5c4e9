"""Instruction counts of a start (callgrind): steady under load, where wall times on a shared host are not.

    .venv/bin/python bench/coldstart/instr.py [--variants ours,floor_ort,main] [--ref main] [--vcpus 1.0]
        [--imports-only] [--keep DIR] [--at-answer]

Each variant (bench/coldstart/run.py's VARIANTS, its environment) runs under `valgrind --tool=callgrind
--separate-threads=yes` as `python -c` of what `python -m awslambdaric HANDLER` does up to the first answer:
import awslambdaric's bootstrap and runtime client, import the handler's module (the init phase), call the
handler once with the bench's event (--at-answer: and end the process there with `os._exit`, so the count is
spawn -> first answer, what run.py times, without the interpreter's teardown). Reported: instructions (Ir) of
the main thread, of the other threads (the prefetch, ONNX Runtime's pool), in millions. --imports-only: the
interpreter start and awslambdaric's imports only (the part every variant shares). About 2 minutes a variant
(valgrind runs ~50x slower).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench import runner  # noqa: E402
from bench.coldstart import run  # noqa: E402

DRIVER = """
import importlib, json, os, sys
import awslambdaric.bootstrap, awslambdaric.lambda_runtime_client
if {call}:
    module, _, name = {handler!r}.rpartition(".")
    answer = getattr(importlib.import_module(module), name)({event!r}, None)
    sys.stdout.write(answer.decode()[:80] if isinstance(answer, bytes) else json.dumps(answer)[:80])
if {stop}:
    sys.stdout.flush()
    os._exit(0)
"""


def count(
    name: str,
    vcpus: float,
    ref_root: Path | None = None,
    imports_only: bool = False,
    keep: Path | None = None,
    at_answer: bool = False,
) -> dict[str, float]:
    """Millions of instructions of a variant's start: the main thread's and the other threads' together (`keep`:
    a folder the callgrind files are copied to, for callgrind_annotate; `at_answer`: stop counting at the first
    answer, as `os._exit` ends the process there, without the interpreter's teardown)."""
    _, env, cwd = run.command(name, vcpus, ref_root, runner.OPTIMIZED)
    code = DRIVER.format(call=not imports_only, stop=at_answer, handler=run.VARIANTS[name][1], event=runner.EVENT)
    with tempfile.TemporaryDirectory(prefix="callgrind-") as tmp:
        out = Path(tmp) / "cg.out"
        argv = ["valgrind", "--tool=callgrind", "--separate-threads=yes", f"--callgrind-out-file={out}"]
        subprocess.run([*argv, sys.executable, "-c", code], env=env, cwd=cwd, check=True, capture_output=True)
        totals = {}
        for f in Path(tmp).glob("cg.out*"):
            for line in f.read_text(errors="replace").splitlines():
                if line.startswith("totals:"):
                    totals[f.name] = int(line.split()[1])
            if keep is not None:
                keep.mkdir(parents=True, exist_ok=True)
                shutil.copy(f, keep / f.name.replace("cg.out", f"{name}.callgrind"))
    # The first thread callgrind names (-01) is the main thread.
    main = next((v for k, v in totals.items() if k.endswith("-01")), max(totals.values()))
    return {"main_M": main / 1e6, "others_M": (sum(totals.values()) - main) / 1e6, "threads": len(totals)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", default="ours,floor_ort")
    ap.add_argument("--vcpus", type=float, default=1.0, help="the Lambda memory size's vCPUs (thread counts)")
    ap.add_argument("--ref", default="main", help="git ref of the `main` variants")
    ap.add_argument("--imports-only", action="store_true")
    ap.add_argument("--keep", type=Path, default=None, help="copy the callgrind files here")
    ap.add_argument(
        "--at-answer", action="store_true", help="end at the first answer (os._exit): spawn -> first embedding only"
    )
    args = ap.parse_args()
    names = runner.csv(args.variants, run.VARIANTS)
    runner.prepare_optimized()
    if run.FLOOR_BUILT & set(names):
        runner.prepare_floor()
    ref_root = runner.ref_checkout(args.ref) if any(run.VARIANTS[n][0] == "ref" for n in names) else None
    trees = [ROOT / "handler", ROOT / "bench" / "handlers", *([ref_root / "handler"] if ref_root else [])]
    for tree in trees:  # bytecode compiled up front, as run.py does
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree)], check=True)
    for n in names:
        print(
            json.dumps({"variant": n, **count(n, args.vcpus, ref_root, args.imports_only, args.keep, args.at_answer)}),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
