"""Parity of a packed multivector model with PyLate itself: token vectors (`ColBERT.encode`) and MaxSim scores
(`pylate.scores.colbert_scores`), per backend, on tiny random ColBERT directories (tests/colbert_models.py) in
several settings. PyLate does not install beside this project's torch (it pins torch, transformers and
sentence-transformers 5.3): run it from its wheel unpacked in a folder of its own, its unrelated imports stubbed.

    pip download pylate==1.6.0 --no-deps -d /tmp/pylate && unzip -q /tmp/pylate/*.whl -d /tmp/pylate-site
    PYTHONPATH=$PWD python bench/peers/pylate_parity.py /tmp/pylate-site /tmp/colbert-parity
"""

from __future__ import annotations

import importlib.machinery
import json
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np

QUERIES = ["hello world", "what is the capital of france?", "a b c d e f g h i j k l m n o p q r s t u v w x y z"]
DOCUMENTS = [
    "paris is the capital city of france.",
    "the quick brown fox, jumps over the lazy dog!",
    "berlin",
    "machine learning (model) - good; bad: great? € ünïcödé",
    "the quick brown fox jumps over the lazy dog " * 8,
]
VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "attend to expansion": {"attend_to_expansion_tokens": True},
    "no expansion": {"do_query_expansion": False},
    "no document marker, no skip-list": {"document_prefix": "", "skiplist_words": []},
}


class _Stub(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {})


def import_pylate(site: str) -> Any:
    # PyLate's package imports its indexes, trainers and data sets; none of them is used here.
    for name in ("datasets", "ujson", "fast_plaid", "fast_plaid.search", "usearch", "usearch.index", "fastkmeans"):
        stub = _Stub(name)
        stub.__path__ = []  # type: ignore[attr-defined]
        stub.__spec__ = importlib.machinery.ModuleSpec(name, None)
        sys.modules[name] = stub
    sys.path.insert(0, site)
    import pylate

    return pylate


def pylate_model(pylate: Any, src: Path) -> Any:
    """PyLate's ColBERT over the directory's two modules: PyLate 1.6's loader does not run on sentence-transformers
    6 (it converts the directory to a pooled SentenceTransformer), so the modules are built here and PyLate's own
    tokenize / encode run as they are."""
    from pylate.models.Dense import Dense
    from safetensors.torch import load_file
    from sentence_transformers.models import Transformer

    settings = json.loads((src / "config_sentence_transformers.json").read_text())
    config = json.loads((src / "1_Dense/config.json").read_text())
    dense = Dense(config["in_features"], config["out_features"], bias=config["bias"])
    dense.load_state_dict(load_file(str(src / "1_Dense/model.safetensors")))
    keys = ("query_prefix", "document_prefix", "query_length", "document_length", "attend_to_expansion_tokens")
    keys += ("skiplist_words", "do_query_expansion")
    pylate.models.ColBERT._text_length = lambda self, text: len(text)  # renamed in sentence-transformers 6: order
    return pylate.models.ColBERT(
        modules=[Transformer(str(src)), dense], device="cpu", **{k: settings[k] for k in keys if k in settings}
    )


def compare(pylate: Any, src: Path, packed: Path, backends: tuple[str, ...]) -> dict[str, Any]:
    import torch

    from handler.core.config import Config
    from handler.runtime.invocation import Runtime

    model = pylate_model(pylate, src)
    qv = [np.asarray(v) for v in model.encode(QUERIES, is_query=True)]
    dv = [np.asarray(v) for v in model.encode(DOCUMENTS, is_query=False)]
    pad = torch.nn.utils.rnn.pad_sequence
    scores = pylate.scores.colbert_scores(
        pad([torch.as_tensor(q) for q in qv], batch_first=True),
        pad([torch.as_tensor(d) for d in dv], batch_first=True),
        documents_mask=pad([torch.ones(len(d)) for d in dv], batch_first=True),
    ).numpy()
    out: dict[str, Any] = {"query_tokens": [len(q) for q in qv], "document_tokens": [len(d) for d in dv]}
    for backend in backends:
        rt = Runtime.start(Config(model_dir=packed, backend=backend, warmup=False), environ={}, emit=None)
        got = rt.serve({"inputs": QUERIES, "input_type": "query"})["embeddings"]
        got += rt.serve({"inputs": DOCUMENTS})["embeddings"]
        same_shapes = all(g.shape == w.shape for g, w in zip(got, qv + dv, strict=True))
        vector = max(float(np.abs(g - w).max()) for g, w in zip(got, qv + dv, strict=True)) if same_shapes else None
        diffs, orders = [], []
        for i, query in enumerate(QUERIES):
            results = rt.serve({"query": query, "documents": DOCUMENTS})["results"]
            mine = np.zeros(len(DOCUMENTS))
            for r in results:
                mine[r["index"]] = float(r["relevance_score"])
            diffs.append(float(np.abs(mine - scores[i]).max()))
            orders.append([r["index"] for r in results] == np.argsort(-scores[i], kind="stable").tolist())
        out[backend] = {
            "same_tokens_kept": same_shapes,
            "max_abs_vector_diff": vector,
            "max_abs_maxsim_diff": max(diffs),
            "same_ranking": all(orders),
        }
    return out


def main() -> None:
    site, work = sys.argv[1], Path(sys.argv[2])
    pylate = import_pylate(site)
    from infra.pack.hf_pack import pack_from
    from infra.pack.precision import Precision
    from tests.colbert_models import make_colbert_dir

    report = {}
    for name, settings in VARIANTS.items():
        src = make_colbert_dir(work / name.replace(" ", "-").replace(",", "") / "src", **settings)
        backends: tuple[str, ...] = ("onnx", "torch") if name == "default" else ("onnx",)
        packed = pack_from(src, src.parent / "packed", backends=list(backends), force=True)
        report[name] = compare(pylate, src, packed, backends)
        if name == "default":
            int8 = pack_from(src, src.parent / "int8", force=True, precision=Precision(quantize="int8"))
            report["default, int8"] = compare(pylate, src, int8, ("onnx",))
            report["default, int8"]["gate"] = json.loads((int8 / "manifest.json").read_text())["precision"]["quality"]
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
