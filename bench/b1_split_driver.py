"""The child side of bench/bench_b1_split.py: ours or fastembed, loaded once, timing its warm call part by part.

Stdlib only at module level (numpy, onnxruntime and tokenizers are in both venvs; fastembed only in its own),
so fastembed's venv (build/peers/fastembed) can run it without this project installed.

    python bench/b1_split_driver.py ours|fastembed --ours-model DIR --export DIR

Reads one JSON command a line on stdin ({"texts": [...], "calls": n}) and answers one JSON line: for each part,
`calls` timings in wall and in the calling thread's CPU time (at 1 intra-op thread ONNX Runtime runs the model
on the calling thread). First a loop over the call's own parts, in this order, as a serving process runs them:

    ours:      tokenize (the task's encoder: ids + mask), run (the runtime's own session: our packed graph,
               pooling + normalize inside), format (handler.api.encode.dumps: the floats' JSON text), whole
               (lambda_handler, as bench/peers_driver.py calls it)
    fastembed: tokenize (its tokenizer + the arrays onnx_embed builds), run (its session on the export), pool
               (its mean pooling + normalize), tolist (numpy rows -> lists, as peers_driver does), whole
               (embed + tolist)

then a loop of its own comparing graphs, each run after the other's (order reversed every call): graph-own
(the same session as `run`) and graph-peer (the other side's graph with the other side's SessionOptions in
this side's onnxruntime: optimum's export at ORT_ENABLE_ALL in ours, our portable graph at EXTENDED in
fastembed's). `graphs` mode: only that loop, over several graphs and session settings (see `graphs`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

Part = Callable[[list[str]], Any]
PROBE = ["The quick brown fox jumps over the lazy dog.", "How do I reset my password?"]
MARK = "b1-split:"  # our answers' log and metric lines go to stdout too: the parent reads only marked lines


def emit(payload: dict[str, Any]) -> None:
    sys.stdout.write(MARK + json.dumps(payload) + "\n")
    sys.stdout.flush()


def _session(path: Path, level: str, spin: bool | None = None) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    if spin is not None:
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _feeds(session: Any, ids: Any, mask: Any) -> dict[str, Any]:
    import numpy as np

    have = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    return {i.name: have[i.name] for i in session.get_inputs()}


def ours(args: argparse.Namespace) -> dict[str, Part]:
    # WARMSTART_MODEL / WARMSTART_THREADS come from the parent: importing is the init, as in peers_driver.
    import handler.app as app
    from handler.api.encode import dumps

    rt = app.runtime
    task, session = rt.task, rt.backend.session
    peer = _session(args.export / "model.onnx", "ORT_ENABLE_ALL")  # fastembed's options (common/onnx_model.py)

    def run(texts: list[str]) -> Any:
        ids, mask = task.encoder.encode(texts)
        return lambda: session.run(None, {"input_ids": ids, "attention_mask": mask})

    def run_peer(texts: list[str]) -> Any:
        ids, mask = task.encoder.encode(texts)
        feeds = _feeds(peer, ids, mask)
        return lambda: peer.run(None, feeds)

    def fmt(texts: list[str]) -> Any:
        ids, mask = task.encoder.encode(texts)
        out = session.run(None, {"input_ids": ids, "attention_mask": mask})[0]
        return lambda: dumps(out)

    def whole(texts: list[str]) -> Any:
        event = {"inputs": texts}
        return lambda: app.lambda_handler(event, None)  # the JSON bytes awslambdaric posts

    return {
        "tokenize": lambda texts: lambda: task.encoder.encode(texts),
        "run": run,
        "format": fmt,
        "whole": whole,
        "graph-own": run,
        "graph-peer": run_peer,
    }


def fastembed(args: argparse.Namespace) -> dict[str, Part]:
    import numpy as np
    from fastembed import TextEmbedding
    from fastembed.common.onnx_model import OnnxOutputContext

    te = TextEmbedding("sentence-transformers/all-MiniLM-L6-v2", specific_model_path=str(args.export), threads=1)
    model = te.model
    # Our portable graph as our backend builds it for an unoptimized pack (EXTENDED, no spinning at 1 thread).
    peer = _session(args.ours_model / "model.onnx", "ORT_ENABLE_EXTENDED", spin=False)

    def tokenize(texts: list[str]) -> Any:
        def call() -> Any:
            enc = model.tokenize(texts)
            ids = np.array([e.ids for e in enc])
            mask = np.array([e.attention_mask for e in enc])
            return {
                "input_ids": np.array(ids, dtype=np.int64),
                "attention_mask": np.array(mask, dtype=np.int64),
                "token_type_ids": np.array([np.zeros(len(e), dtype=np.int64) for e in ids], dtype=np.int64),
            }

        return call

    def run(texts: list[str]) -> Any:
        feeds = tokenize(texts)()
        return lambda: model.model.run(None, feeds)[0]

    def run_peer(texts: list[str]) -> Any:
        feeds = tokenize(texts)()
        mine = {k: feeds[k] for k in ("input_ids", "attention_mask")}
        return lambda: peer.run(None, mine)

    def pool(texts: list[str]) -> Any:
        feeds = tokenize(texts)()
        out = model.model.run(None, feeds)[0]
        ctx = OnnxOutputContext(model_output=out, attention_mask=feeds["attention_mask"], input_ids=feeds["input_ids"])
        return lambda: list(model._post_process_onnx_output(ctx))

    def tolist(texts: list[str]) -> Any:
        rows = list(te.embed(texts, batch_size=len(texts)))
        return lambda: [v.tolist() for v in rows]

    def whole(texts: list[str]) -> Any:
        return lambda: [v.tolist() for v in te.embed(texts, batch_size=len(texts))]

    return {
        "tokenize": tokenize,
        "run": run,
        "pool": pool,
        "tolist": tolist,
        "whole": whole,
        "graph-own": run,
        "graph-peer": run_peer,
    }


def skip_layer_norm(model: Path, out_dir: Path) -> Path:
    """`model` with ORT's SkipLayerNormalization fusion applied (Add + Add + LayerNormalization -> one node), which
    the pack's fusion pass never gets to: its symbolic shape inference has no rule for ReduceL2 (the pooling
    head's normalize) and gives up, and that fusion is skipped without it. Given one (ReduceSum's) here."""
    import shutil

    import onnx
    import onnxruntime.transformers as transformers

    sys.path.insert(0, transformers.__path__[0])  # the optimizer imports its helpers as top-level modules
    import shape_infer_helper  # type: ignore[import-not-found]
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    helper = shape_infer_helper.SymbolicShapeInferenceHelper
    init = helper.__init__

    def patched(self: Any, *a: Any, **k: Any) -> None:
        init(self, *a, **k)
        self.dispatcher_["ReduceL2"] = self._infer_ReduceSum  # same shape rule (opset 18: axes as an input)

    helper.__init__ = patched
    for name in ("model.onnx", "model.onnx.data"):  # a copy: onnx refuses external data with several hard links
        shutil.copyfile(model.parent / name, out_dir / name)
    options = FusionOptions("bert")
    options.enable_embed_layer_norm = False  # as the pack (infra/pack/hf_export.py)
    fused = optimize_model(
        onnx.load(str(out_dir / "model.onnx")), "bert", 12, 384, opt_level=0, optimization_options=options
    )
    ops = {n.op_type for n in fused.model.graph.node}
    if "SkipLayerNormalization" not in ops:
        raise RuntimeError(f"no SkipLayerNormalization fused: {sorted(ops)}")
    fused.save_model_to_file(str(out_dir / "skip.onnx"), use_external_data_format=True)
    return out_dir / "skip.onnx"


def graphs(args: argparse.Namespace) -> dict[str, Part]:
    """Raw `session.run` of each graph and session setting on the same ids, in this interpreter's onnxruntime."""
    import tempfile

    import onnxruntime as ort

    ours = args.ours_model / "model.onnx"
    sessions = {
        "ours EXTENDED": _session(ours, "ORT_ENABLE_EXTENDED", spin=False),
        "ours ALL": _session(ours, "ORT_ENABLE_ALL", spin=False),
        "peer ALL": _session(args.export / "model.onnx", "ORT_ENABLE_ALL"),
        "peer EXTENDED": _session(args.export / "model.onnx", "ORT_ENABLE_EXTENDED"),
    }
    daz = ort.SessionOptions()
    daz.intra_op_num_threads = daz.inter_op_num_threads = 1
    daz.log_severity_level = 3
    daz.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    daz.add_session_config_entry("session.set_denormal_as_zero", "1")
    sessions["ours EXTENDED daz"] = ort.InferenceSession(str(ours), daz, providers=["CPUExecutionProvider"])
    if args.optimized is not None:
        sessions["ours optimized"] = _session(args.optimized, "ORT_DISABLE_ALL", spin=False)
    if args.skip_layer_norm:
        tmp = Path(tempfile.mkdtemp(prefix="b1-split-"))
        sessions["ours +SkipLayerNorm"] = _session(skip_layer_norm(ours, tmp), "ORT_ENABLE_EXTENDED", spin=False)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(args.export / "tokenizer.json"))
    tok.enable_truncation(256)
    tok.enable_padding()

    def part(session: Any) -> Part:
        def make(texts: list[str]) -> Any:
            import numpy as np

            enc = tok.encode_batch(texts)
            ids = np.array([e.ids for e in enc], dtype=np.int64)
            mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
            feeds = _feeds(session, ids, mask)
            return lambda: session.run(None, feeds)

        return make

    return {f"graph-{name}": part(s) for name, s in sessions.items()}


def call_orders(names: list[str]) -> tuple[list[str], list[str]]:
    """The order of the graph-to-graph parts (`graph-*`) on even and on odd calls: a graph run right after
    another graph's finds its weights evicted from the caches (two graphs' weights do not fit in L3 together),
    so the order reverses every call and each graph follows the other alike."""
    return names, names[::-1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("kind", choices=["ours", "fastembed", "graphs"])
    ap.add_argument("--ours-model", type=Path, required=True)
    ap.add_argument("--export", type=Path, required=True)
    ap.add_argument("--optimized", type=Path, help="graphs: the optimized pack's model.opt.onnx (its ORT only)")
    ap.add_argument("--skip-layer-norm", action="store_true", help="graphs: also ours with SkipLayerNorm fused")
    args = ap.parse_args(argv)
    parts = {"ours": ours, "fastembed": fastembed, "graphs": graphs}[args.kind](args)
    import onnxruntime

    hello: dict[str, Any] = {"parts": list(parts), "onnxruntime": onnxruntime.__version__, "pid": os.getpid()}
    if "whole" in parts:  # the answers, to check that every side computes the same vectors
        hello["vecs"] = [list(map(float, v)) for v in parts["whole"](PROBE)()]
    emit(hello)
    prepared: dict[tuple[str, ...], dict[str, Callable[[], Any]]] = {}
    for line in sys.stdin:
        cmd = json.loads(line)
        texts: list[str] = cmd["texts"]
        fns = prepared.setdefault(tuple(texts), {name: make(texts) for name, make in parts.items()})
        wall: dict[str, list[float]] = {name: [] for name in fns}
        cpu: dict[str, list[float]] = {name: [] for name in fns}
        # First the call's own parts, as a serving process runs them (no other graph in between), then the
        # graph-to-graph comparison in a loop of its own.
        own = [name for name in fns if not name.startswith("graph-")]
        orders = call_orders([name for name in fns if name.startswith("graph-")])
        for group in ("own", "graphs"):
            for n in range(cmd["calls"]):
                for name in own if group == "own" else orders[n % 2]:
                    fn = fns[name]
                    c0, t0 = time.thread_time(), time.perf_counter()
                    fn()
                    t1, c1 = time.perf_counter(), time.thread_time()
                    wall[name].append(t1 - t0)
                    cpu[name].append(c1 - c0)
        emit({"wall": wall, "cpu": cpu})
    return 0


if __name__ == "__main__":
    sys.exit(main())
