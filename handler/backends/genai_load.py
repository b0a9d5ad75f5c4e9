"""Which of a generate pack's decoders onnxruntime-genai opens, and what the start prefetches of it. Stdlib only:
the prefetch (handler.backends.genai_spec.start_files) reads it before numpy is imported.

A pack laid out by infra.pack.lm_layout has every weight at a 4096-byte offset of model.onnx.data and the byte
ranges a session reads recorded (`backends.genai.layout`). `warmstart optimize` may add model.opt.onnx: the graph
optimized and its MatMul weights prepacked in MLAS's layout, mapped as they are at load instead of packed into a
second copy (`backends.genai.optimized`; docs/benchmarks.md, "Loading big generative packs"). That
layout belongs to one ONNX Runtime version and one CPU's kernels: anything else would read the weights wrongly,
so it is opened only where both match (never a wrong answer), else the portable model.onnx, with the reason in
the init report. WARMSTART_GENAI_OPTIMIZED = auto (default: when it fits) | off.

A pack may also carry model.q4.onnx (`backends.genai.q4`, infra/pack/lm_q4.py): the portable graph with its int4
MatMulNBits rewritten to our `ai.warmstart::Q4MatMul` over the same bytes of model.onnx.data, proved against it at
pack time. It needs no prepack at load (handler/backends/q4lib.py), so it comes first where its library is built
and the CPU runs it; else the optimized model, else the portable one. WARMSTART_GENAI_Q4 = auto | off.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from importlib.util import find_spec
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from handler.backends import q4lib
from handler.backends.fingerprint import cpu_fingerprint
from handler.core.errors import ConfigError, ModelLoadError

T = TypeVar("T")

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


class Q4(NamedTuple):
    """The Q4MatMul decoder to open: its graph, the op's library, ORT's graph passes to open it with."""

    model: str
    library: str
    graph_optimization_level: str


def choose_q4(
    entry: Mapping[str, Any], mode: str, library: str = "", cuda: bool = False, root: Path | None = None
) -> tuple[Q4 | None, Any]:
    """The pack's Q4MatMul decoder when it may be opened here (else None), and the init report's line; `mode`:
    WARMSTART_GENAI_Q4, `library`: WARMSTART_Q4_LIBRARY (q4lib.library). `root`: the pack's folder, when
    onnxruntime-genai opens it: 0.18 loads a custom op library only from under the working directory or the
    model's folder ("custom_ops_library path is not within an allowed directory"), so elsewhere it is not tried."""
    q4 = entry.get("q4")
    if not q4:
        return None, {"used": False, "reason": "not packed (infra/pack/lm_q4.py)"}
    if mode == "off":
        return None, {"used": False, "reason": f"off ({q4lib.ENV}=off)"}
    if cuda:
        return None, {"used": False, "reason": "CUDA: Q4MatMul is a CPU kernel"}
    path, why = q4lib.library({q4lib.ENV_LIBRARY: library} if library else {})
    if path is None:
        return None, {"used": False, "reason": why}
    if root is not None and not any(path.resolve().is_relative_to(d.resolve()) for d in (Path.cwd(), root)):
        where = f"{path} is under neither the working directory {Path.cwd()} nor the pack's folder"
        return None, {"used": False, "reason": f"onnxruntime-genai would refuse the library: {where}"}
    level = str(q4.get("graph_optimization_level") or "all")
    chosen = Q4(str(q4["model"]), str(path), level)
    return chosen, {"used": True, "model": chosen.model, "library": chosen.library, "graph_passes": level}


def open_first(
    entry: Mapping[str, Any], own: Any, cuda: bool, load: Callable[[str | None, Q4 | None], T], root: Path
) -> tuple[T, dict[str, Any], dict[str, Any]]:
    """`load(decoder, q4)` of the first decoder that opens: the Q4MatMul graph where its library loads, then the
    pre-optimized one where made for this ORT and CPU, then the portable one (decoder None). Never a failed start
    over a speed-up: a faster decoder that fails to load is reported and the next one opened. Returns the loaded
    model and the init report's lines for the Q4 decoder and the optimized one. `own`: GenaiSettings; `root`: the
    pack's folder (choose_q4)."""
    q4, q4_report = choose_q4(entry, getattr(own, "q4", "auto"), getattr(own, "q4_library", ""), cuda, root)
    if q4 is not None:
        try:
            return load(q4.model, q4), q4_report, {"used": False, "reason": "the Q4MatMul decoder was opened"}
        except ModelLoadError as e:
            q4_report = {"used": False, "reason": f"load failed: {e}"}
    optimized, optimized_report = choose(entry, getattr(own, "optimized", "auto"), cuda)
    if optimized is not None:
        try:
            return load(optimized, None), q4_report, optimized_report
        except ModelLoadError as e:
            optimized_report = {"used": False, "reason": f"load failed: {e}"}
    return load(None, None), q4_report, optimized_report


def start_files(entry: Mapping[str, Any], env: Mapping[str, str]) -> tuple[list[str], dict[str, list[list[int]]]]:
    """The files the start reads, in order (the config, the graph, its data), and the ranges read of the data:
    the Q4MatMul graph's (the portable model's data) or the optimized model's when init will open it, else the
    portable one's."""
    names = list(entry.get("files", []))
    layout = entry.get("layout") or {}
    q4, _ = choose_q4(entry, q4lib.mode(env), env.get(q4lib.ENV_LIBRARY, ""))
    if q4 is not None:  # the same data as the portable graph: only the graph's file differs
        return [q4.model if n == "model.onnx" else n for n in names], dict(layout.get("ranges") or {})
    chosen, _ = choose(entry, optimized_mode(env))
    if chosen is None:
        return names, dict(layout.get("ranges") or {})
    optimized = entry["optimized"]
    config = [n for n in names if n.endswith(".json")]
    return config + list(optimized.get("files", [])), dict(optimized.get("ranges") or {})


def overlay(threads: int, decoder: str | None, q4: Q4 | None = None) -> str:
    """The JSON the engine overlays on the pack's genai_config.json; `decoder`: the pre-optimized graph instead of
    the config's, opened with ORT's graph passes off (they ran when it was saved: running them again finds
    nothing, costs time); or, with `q4`, the Q4MatMul graph, its op's library loaded by the session and the graph
    passes its proof ran with."""
    # No memory pattern: ORT's plan per input shape takes a seen shape's whole block from its arena at once, which a
    # warm request's freed chunks did not hold (+10 MB peak RSS on the 0.6B int4 pack's second request).
    session: dict[str, Any] = {"intra_op_num_threads": threads, "inter_op_num_threads": 1, "enable_mem_pattern": False}
    decoder_overlay: dict[str, Any] = {"session_options": session}
    if decoder is not None:
        decoder_overlay["filename"] = decoder
        session["graph_optimization_level"] = "ORT_DISABLE_ALL"
    if q4 is not None:
        session["custom_ops_library"] = q4.library  # an absolute path: the pack's folder may be read-only
        if q4.graph_optimization_level == "ORT_DISABLE_ALL":
            session["graph_optimization_level"] = "ORT_DISABLE_ALL"
        else:
            session.pop("graph_optimization_level", None)
    return json.dumps({"model": {"decoder": decoder_overlay}})
