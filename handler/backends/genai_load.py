"""Which of a generate pack's decoders onnxruntime-genai opens, and what the start prefetches of it. Stdlib only:
the prefetch (handler.backends.genai_spec.start_files) reads it before numpy is imported.

A pack laid out by infra.pack.lm_layout has every weight at a 4096-byte offset of model.onnx.data and the byte
ranges a session reads recorded (`backends.genai.layout`). `warmstart optimize` may add model.opt.onnx: the graph
optimized and its MatMul weights prepacked in MLAS's layout, mapped as they are at load instead of packed into a
second copy (`backends.genai.optimized`; docs/benchmarks.md, "Loading big generative packs"). That
layout belongs to one ONNX Runtime version and one CPU's kernels: anything else would read the weights wrongly,
so it is opened only where both match (never a wrong answer), else the portable model.onnx, with the reason in
the init report. WARMSTART_GENAI_OPTIMIZED = auto (default: when it fits) | off.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from handler.backends.fingerprint import cpu_fingerprint
from handler.core.errors import ConfigError

MODES = ("auto", "off")
ENV = "WARMSTART_GENAI_OPTIMIZED"
_LIB = re.compile(r"libonnxruntime\.so\.(\d+\.\d+\.\d+)$")


def optimized_mode(env: Mapping[str, str]) -> str:
    """WARMSTART_GENAI_OPTIMIZED, checked: auto (default) or off (handler.backends.genai_spec.GenaiSettings)."""
    raw = (env.get(ENV) or "auto").strip().lower()
    if raw not in MODES:
        raise ConfigError(f"{ENV}={raw!r}; valid values: {', '.join(MODES)}")
    return raw


def ort_version() -> str | None:
    """The version of the ONNX Runtime onnxruntime-genai runs its sessions on: it opens the onnxruntime package's
    capi/libonnxruntime.so.X.Y.Z (onnxruntime_genai/_dll_directory.py), so its name says, without loading it."""
    spec = find_spec("onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        return None
    capi = Path(next(iter(spec.submodule_search_locations))) / "capi"
    found = sorted(m.group(1) for p in capi.glob("libonnxruntime.so.*") if (m := _LIB.search(p.name)))
    return found[-1] if len(found) == 1 else None  # none, or two: which one loads is not ours to guess


def choose(entry: Mapping[str, Any], mode: str, cuda: bool = False) -> tuple[str | None, Any]:
    """The optimized model's file when it may be opened here (else None), and the init report's line; `mode`:
    WARMSTART_GENAI_OPTIMIZED (optimized_mode)."""
    optimized = entry.get("optimized")
    if not optimized:
        return None, {"used": False, "reason": "not packed (warmstart optimize)"}
    if mode == "off":
        return None, {"used": False, "reason": f"off ({ENV}=off)"}
    if cuda:
        return None, {"used": False, "reason": "CUDA: prepacked weights are for the CPU provider"}
    made_for = {k: optimized.get(k) for k in ("onnxruntime", "arch", "cpu_features")}
    here = {"onnxruntime": ort_version(), **cpu_fingerprint()}
    differs = [f"{k} {here[k]} != {made_for[k]}" for k in here if here[k] != made_for[k]]
    if differs:
        return None, {"used": False, "reason": "made for another target: " + "; ".join(differs), "made_for": made_for}
    return str(optimized["model"]), {"used": True, "model": optimized["model"], "made_for": made_for}


def start_files(entry: Mapping[str, Any], env: Mapping[str, str]) -> tuple[list[str], dict[str, list[list[int]]]]:
    """The files the start reads, in order (the config, the graph, its data), and the ranges read of the data:
    the optimized model's when init will open it, else the portable one's."""
    names = list(entry.get("files", []))
    layout = entry.get("layout") or {}
    chosen, _ = choose(entry, optimized_mode(env))
    if chosen is None:
        return names, dict(layout.get("ranges") or {})
    optimized = entry["optimized"]
    config = [n for n in names if n.endswith(".json")]
    return config + list(optimized.get("files", [])), dict(optimized.get("ranges") or {})
