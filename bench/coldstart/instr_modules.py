"""Where a start's instructions go, module by module and phase by phase (callgrind), for one variant.

    .venv/bin/python bench/coldstart/instr_modules.py [--variant ours] [--top 40] [--keep DIR]

The variant (bench/coldstart/run.py's VARIANTS) runs as instr.py runs it, under callgrind, with a driver that
asks callgrind to dump its counters (a client request, through a 3-line C helper built here with gcc and
valgrind's callgrind.h) each time an import starts or ends, and around init's phases (handler.observability's
PhaseTimer: manifest, imports, session, task, ...) and a few named steps (the init report, the registry).
Each interval's instructions go to what ran then: a module's own top level ("self", its imports apart), a
phase, the first call. Main thread only; the hooks add ~2 % (their own Python calls), so the total is
instr.py's, plus that. Several minutes (valgrind ~50x, and one dump file per interval).
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench import runner  # noqa: E402
from bench.coldstart import run  # noqa: E402

HELPER = ROOT / "build" / "bench" / "libcgdump.so"
HELPER_C = "#include <valgrind/callgrind.h>\nvoid dump(const char *s) { CALLGRIND_DUMP_STATS_AT(s); }\n"

DRIVER = r"""
import contextlib, ctypes, functools, importlib, sys
import importlib._bootstrap as bs
_dump = ctypes.CDLL({helper!r}).dump
_dump.argtypes = [ctypes.c_char_p]
stack = ["start"]

def mark():
    _dump(stack[-1].encode())

def pushed(label, fn):
    @functools.wraps(fn)
    def wrapper(*a, **k):
        mark(); stack.append(label)
        try:
            return fn(*a, **k)
        finally:
            mark(); stack.pop()
    return wrapper

STEPS = {{
    "handler.observability.report": ["emit"],
    "handler.runtime.init": ["_report", "limits", "_registry"],
    "handler.tasks.catalog": ["load_manifest"],
}}

def patch(name):
    mod = sys.modules[name]
    for attr in STEPS.get(name, []):
        setattr(mod, attr, pushed("step:" + name.rsplit(".", 1)[1] + "." + attr, getattr(mod, attr)))
    if name == "handler.observability.report":
        phase = mod.PhaseTimer.phase
        @contextlib.contextmanager
        def timed(self, pname):
            mark(); stack.append("phase:" + pname)
            try:
                with phase(self, pname):
                    yield
            finally:
                mark(); stack.pop()
        mod.PhaseTimer.phase = timed
    if name == "handler.runtime.instance":
        mod.Instance.observe = pushed("step:Instance.observe", mod.Instance.observe)

_load = bs._find_and_load
def find_and_load(name, import_):
    mark(); stack.append(name)
    try:
        module = _load(name, import_)
    finally:
        mark(); stack.pop()
    if name in STEPS or name == "handler.runtime.instance":
        patch(name)
    return module
bs._find_and_load = find_and_load

stack[0] = "top:awslambdaric"
import awslambdaric.bootstrap, awslambdaric.lambda_runtime_client
mark(); stack[0] = "top:handler-module"
module, _, name = {handler!r}.rpartition(".")
handler = getattr(importlib.import_module(module), name)
mark(); stack[0] = "top:first-call"
answer = handler({event!r}, None)
mark(); stack[0] = "top:after"
sys.stdout.write(answer.decode()[:80] if isinstance(answer, bytes) else __import__("json").dumps(answer)[:80])
sys.stdout.flush()
import os; os._exit(0)
"""


def helper() -> Path:
    if not HELPER.exists():
        HELPER.parent.mkdir(parents=True, exist_ok=True)
        src = HELPER.with_suffix(".c")
        src.write_text(HELPER_C)
        subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(HELPER), str(src)], check=True)
    return HELPER


def intervals(folder: Path) -> list[tuple[int, str, int]]:
    """(part, label, instructions) of every dump of the main thread, in order."""
    rows = []
    for f in folder.glob("cg.out*-01"):
        head = f.read_text(errors="replace")[:4000]
        label = re.search(r"Trigger: Client Request: (\S+)", head)
        part = re.search(r"^part: (\d+)", head, re.M)
        total = re.search(r"^summary: (\d+)", head, re.M)
        if part and total:
            rows.append((int(part[1]), label[1] if label else "exit", int(total[1])))
    return sorted(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", default="ours", choices=sorted(run.VARIANTS))
    ap.add_argument("--vcpus", type=float, default=1.0)
    ap.add_argument("--top", type=int, default=40, help="how many labels to list")
    ap.add_argument("--keep", type=Path, default=None, help="copy the callgrind files here")
    args = ap.parse_args()
    runner.prepare_optimized()
    if args.variant in run.FLOOR_BUILT:
        runner.prepare_floor()
    _, env, cwd = run.command(args.variant, args.vcpus, None, runner.OPTIMIZED)
    code = DRIVER.format(helper=str(helper()), handler=run.VARIANTS[args.variant][1], event=runner.EVENT)
    with tempfile.TemporaryDirectory(prefix="callgrind-") as tmp:
        argv = ["valgrind", "--tool=callgrind", "--separate-threads=yes", f"--callgrind-out-file={tmp}/cg.out"]
        subprocess.run([*argv, sys.executable, "-c", code], env=env, cwd=cwd, check=True, capture_output=True)
        rows = intervals(Path(tmp))
        if args.keep is not None:
            shutil.copytree(tmp, args.keep, dirs_exist_ok=True)
    by_label: collections.Counter[str] = collections.Counter()
    for _, label, n in rows:
        by_label[label] += n
    own = sum(n for label, n in by_label.items() if label.startswith("handler."))
    total = sum(by_label.values())
    print(f"{args.variant}: {total / 1e6:.1f} M instructions (main thread, hooks included), {len(rows)} intervals")
    print(f"handler.* modules' own top level: {own / 1e6:.1f} M over {sum(k.startswith('handler.') for k in by_label)}")
    for label, n in by_label.most_common(args.top):
        print(f"{n / 1e6:9.2f} M  {label}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
