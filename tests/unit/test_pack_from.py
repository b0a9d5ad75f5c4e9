"""`warmstart pack --from DIR` (issue 13, pack side): tiny random models of every family and task, packed, and
the exported graph run with onnxruntime directly against sentence-transformers / transformers on the same
directory. The run-time side (tasks, torch encoder) is tested with the handler elsewhere."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from infra.pack import hf_source
from infra.pack.hf_checks import SourceError
from infra.pack.hf_pack import pack_from
from infra.pack.hf_source import MissingFileError, UnsupportedModelError, read_source
from infra.pack.publish import default_version
from tests.tiny_models import FAMILIES, make_model_dir

# One pooling mode per family, so every mode is exported and checked at least once.
POOLING = {"bert": "cls", "roberta": "mean", "xlm-roberta": "max", "distilbert": "lasttoken", "mpnet": "mean"}
TEXTS = [
    "hello world",
    "what is the capital of france",
    "the quick brown fox jumps over the lazy dog " * 12,  # past max_seq_length: truncated
    "naïve café ünïcödé",
]
QUERY = "what is the capital of france"
DOCUMENTS = ["paris is the capital of france", "berlin", "a lazy dog " * 30, "machine learning model"]


def cosine(a: npt.NDArray[Any], b: npt.NDArray[Any]) -> npt.NDArray[Any]:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.asarray((a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)))


def read_manifest(packed: Path) -> dict[str, Any]:
    manifest: dict[str, Any] = json.loads((packed / "manifest.json").read_text())
    return manifest


class Packed:
    """A packed model run the way the run-time side runs it: tokenizer.json + model.onnx in onnxruntime."""

    def __init__(self, path: Path) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        self.path = path
        self.manifest = read_manifest(path)
        tok = self.manifest["tokenizer"]
        self.tokenizer = Tokenizer.from_file(str(path / tok["file"]))
        self.tokenizer.enable_truncation(max_length=tok["truncation"], strategy="longest_first")
        self.tokenizer.enable_padding(pad_id=tok["pad_id"], pad_token=self.tokenizer.id_to_token(tok["pad_id"]))
        self.session = ort.InferenceSession(str(path / "model.onnx"), providers=["CPUExecutionProvider"])

    def run(self, inputs: list[Any]) -> npt.NDArray[np.float32]:
        encodings = self.tokenizer.encode_batch(inputs)
        arrays = {
            "input_ids": np.array([e.ids for e in encodings], np.int64),
            "attention_mask": np.array([e.attention_mask for e in encodings], np.int64),
            "token_type_ids": np.array([e.type_ids for e in encodings], np.int64),
        }
        names = [spec["name"] for spec in self.manifest["inputs"]]
        assert [i.name for i in self.session.get_inputs()] == names
        out: npt.NDArray[np.float32] = self.session.run(None, {n: arrays[n] for n in names})[0]
        return out


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., tuple[Path, Path]]:
    """(source directory, packed directory) for a tiny model; each combination built and packed once."""
    cache: dict[tuple[str, ...], tuple[Path, Path]] = {}

    def make(family: str, kind: str, pack_options: dict[str, Any] | None = None, **options: Any) -> tuple[Path, Path]:
        key = (family, kind, json.dumps(pack_options, sort_keys=True), json.dumps(options, sort_keys=True))
        if key not in cache:
            root = tmp_path_factory.mktemp(f"{family}-{kind}")
            src = make_model_dir(root, family, kind, **options)
            cache[key] = (src, pack_from(src, root / "packed", **(pack_options or {})))
        return cache[key]

    return make


# ---------------------------------------------------------------------------------------------- parity


@pytest.mark.parametrize("family", FAMILIES)
def test_embedding_graph_equals_sentence_transformers(packed: Callable[..., tuple[Path, Path]], family: str) -> None:
    from sentence_transformers import SentenceTransformer

    src, out = packed(
        family,
        "sentence-transformers",
        pooling=POOLING[family],
        normalize=family != "xlm-roberta",
        prompts={"query": "query: "},
        max_seq_length=24,
    )
    model = Packed(out)
    got = model.run(["query: " + t for t in TEXTS])
    want = SentenceTransformer(str(src), local_files_only=True).encode(TEXTS, prompt_name="query")
    assert got.shape == want.shape == (len(TEXTS), 32)
    assert cosine(got, want).min() >= 0.9999
    assert np.abs(got - want).max() <= 1e-4
    if family != "xlm-roberta":
        np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_rerank_graph_equals_cross_encoder_predict(packed: Callable[..., tuple[Path, Path]], family: str) -> None:
    from sentence_transformers import CrossEncoder

    src, out = packed(family, "cross-encoder", max_seq_length=20)
    got = Packed(out).run([(QUERY, d) for d in DOCUMENTS])
    want = CrossEncoder(str(src), local_files_only=True).predict([(QUERY, d) for d in DOCUMENTS])
    assert got.shape == (len(DOCUMENTS),)
    assert np.abs(got - want).max() <= 1e-4
    assert ((got > 0) & (got < 1)).all()  # the sigmoid is in the graph


@pytest.mark.parametrize("family", FAMILIES)
def test_classify_graph_equals_transformers_logits(packed: Callable[..., tuple[Path, Path]], family: str) -> None:
    import torch
    import transformers

    src, out = packed(family, "classifier", labels=["negative", "neutral", "positive"], max_seq_length=20)
    got = Packed(out).run(TEXTS)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(src), local_files_only=True)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(str(src), local_files_only=True).eval()
    with torch.no_grad():
        want = model(**tokenizer(TEXTS, padding=True, truncation=True, return_tensors="pt")).logits.numpy()
    assert got.shape == (len(TEXTS), 3)
    assert np.abs(got - want).max() <= 1e-4


def test_sentence_transformers_6_layout_and_identity_activation(tmp_path: Path) -> None:
    """Directories as sentence-transformers 6's own save() writes them: `pooling_mode`, max length in the
    tokenizer config, a CrossEncoder's activation in config_sentence_transformers.json."""
    from sentence_transformers import CrossEncoder, SentenceTransformer

    src = make_model_dir(tmp_path, "bert", layout="st", pooling="max", max_seq_length=12)
    out = pack_from(src, tmp_path / "emb", backends=["onnx"])
    assert read_manifest(out)["max_seq_length"] == 12
    want = SentenceTransformer(str(src), local_files_only=True).encode(TEXTS)
    assert cosine(Packed(out).run(TEXTS), want).min() >= 0.9999

    ce = make_model_dir(tmp_path, "bert", "cross-encoder", layout="st", activation="torch.nn.modules.linear.Identity")
    out = pack_from(ce, tmp_path / "ce", backends=["onnx"])
    assert read_manifest(out)["activation"] == "identity"
    got = Packed(out).run([(QUERY, d) for d in DOCUMENTS])
    want = CrossEncoder(str(ce), local_files_only=True).predict([(QUERY, d) for d in DOCUMENTS])
    assert np.abs(got - want).max() <= 1e-4
    assert (got < 0).any() or (got > 1).any()  # raw logits: no sigmoid


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_pytorch_bin_and_vocab_files_only(tmp_path: Path, family: str) -> None:
    """pytorch_model.bin (read with weights_only=True) and no tokenizer.json: tokenizer.json is built, and the
    graph still equals the model."""
    import torch
    import transformers

    src = make_model_dir(tmp_path, family, "classifier", weights="bin", tokenizer_files="vocab")
    assert not (src / "tokenizer.json").exists() and not (src / "model.safetensors").exists()
    out = pack_from(src, tmp_path / "packed", backends=["onnx"])
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(src), local_files_only=True)
    ours = Packed(out)
    assert [e.ids for e in ours.tokenizer.encode_batch(TEXTS[:2])] == tokenizer(TEXTS[:2], padding=True)["input_ids"]
    model = transformers.AutoModelForSequenceClassification.from_pretrained(str(src), local_files_only=True).eval()
    with torch.no_grad():
        want = model(**tokenizer(TEXTS, padding=True, truncation=True, return_tensors="pt")).logits.numpy()
    assert np.abs(ours.run(TEXTS) - want).max() <= 1e-4


# ---------------------------------------------------------------------------------------------- manifest


def test_embedding_manifest(packed: Callable[..., tuple[Path, Path]]) -> None:
    src, out = packed(
        "bert",
        "sentence-transformers",
        pooling=POOLING["bert"],
        normalize=True,
        prompts={"query": "query: "},
        max_seq_length=24,
    )
    m = read_manifest(out)
    assert (m["task"], m["family"], m["default_backend"]) == ("embedding", "bert", "onnx")
    assert m["id"] == src.name and re.fullmatch(r"[0-9a-f]{12}", m["version"])
    assert m["source"]["dir"] == src.name and m["source"]["architecture"] == "BertModel"
    assert m["version"] == default_version(m["source"]["content_sha256"], "embedding")  # weights, task, precision
    assert [i["name"] for i in m["inputs"]] == ["input_ids", "attention_mask"]
    assert m["outputs"] == [{"name": "sentence_embedding", "dtype": "float32", "shape": ["batch", 32]}]
    assert m["pooling"] == {"mode": "cls", "normalize": True, "in_graph": True}
    assert (m["dimension"], m["max_seq_length"], m["tokenizer"]["truncation"]) == (32, 24, 24)
    assert m["tokenizer"]["file"] == "tokenizer.json" and m["tokenizer"]["pad_id"] == 0
    assert m["prompts"] == {"query": "query: "} and m["default_prompt_name"] is None
    torch_spec = m["backends"]["torch"]
    assert torch_spec["architecture"] == "exported-program" and torch_spec["program"] == "program.json"
    assert torch_spec["files"] == ["program.json", "model.safetensors"] and torch_spec["max_abs_diff"] <= 1e-4
    assert m["backends"]["onnx"]["files"] == ["model.onnx", "model.onnx.data"]
    assert isinstance(m["backends"]["onnx"]["fused"], bool)
    assert "unsupported_backends" not in m
    # golden answers recorded by the packed model itself, in their own file (a start never parses them)
    assert "golden" not in m and m["golden_file"] == "golden.json"
    assert json.loads((out / "golden.json").read_text())["cases"]
    names = {"model.onnx", "model.onnx.data", "model.safetensors", "program.json", "tokenizer.json", "vocab.txt"}
    names.add("golden.json")
    assert set(m["files"]) == names
    # A plain BERT WordPiece tokenizer: the shortcut's proof is a pack-time step (infra.pack.wordpiece).
    shortcut = m["tokenizer"]["shortcut"]
    assert shortcut["vocab"] == "vocab.txt" and shortcut["proof"]["pairs"] > 0
    assert shortcut["proof"]["tokenizer_sha256"] == m["files"]["tokenizer.json"]["sha256"]


def test_rerank_and_classify_manifests(packed: Callable[..., tuple[Path, Path]]) -> None:
    _, bert = packed("bert", "cross-encoder", max_seq_length=20)
    m = read_manifest(bert)
    assert (m["task"], m["activation"]) == ("rerank", "sigmoid")
    assert "labels" not in m and "problem_type" not in m
    assert [i["name"] for i in m["inputs"]] == ["input_ids", "attention_mask", "token_type_ids"]
    assert m["outputs"] == [{"name": "scores", "dtype": "float32", "shape": ["batch"]}]
    assert m["backends"]["torch"]["architecture"] == "exported-program"
    assert m["source"]["architecture"] == "BertForSequenceClassification"
    # golden answers: embedding only (infra.pack.golden)
    assert "pooling" not in m and "golden" not in m and "golden_file" not in m

    _, roberta = packed("roberta", "classifier", labels=["negative", "neutral", "positive"], max_seq_length=20)
    m = read_manifest(roberta)
    assert (m["task"], m["family"], m["problem_type"]) == ("classify", "roberta", "single_label_classification")
    assert m["labels"] == ["negative", "neutral", "positive"]
    assert [i["name"] for i in m["inputs"]] == ["input_ids", "attention_mask"]  # roberta: no token types
    assert m["outputs"] == [{"name": "logits", "dtype": "float32", "shape": ["batch", 3]}]
    assert m["tokenizer"]["pad_id"] == 1
    assert "shortcut" not in m["tokenizer"] and "vocab.txt" not in m["files"]  # BPE: no WordPiece shortcut


def test_multi_label_classifier_and_max_seq_from_positions(tmp_path: Path) -> None:
    src = make_model_dir(tmp_path, "xlm-roberta", "classifier", problem_type="multi_label_classification")
    m = read_manifest(pack_from(src, tmp_path / "packed", backends=["torch"]))
    assert m["problem_type"] == "multi_label_classification"
    assert m["max_seq_length"] == 64  # max_position_embeddings 66 minus xlm-roberta's padding offset
    assert set(m["backends"]) == {"torch"} and m["default_backend"] == "torch"
    assert set(m["files"]) == {"model.safetensors", "program.json", "tokenizer.json"}


def test_a_refused_program_drops_torch_with_no_fallback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The torch backend runs the exported program only: a BERT the program refuses (which the hand-written
    encoder, removed, once served instead) is packed for ONNX with the program's reason, and refused for torch."""
    from infra.pack import torch_program

    def refuse(*_: Any, **__: Any) -> None:
        raise torch_program.ProgramExportError("torch.export cannot capture the model (test)")

    monkeypatch.setattr(torch_program, "export_program", refuse)
    src = make_model_dir(tmp_path, "bert", "cross-encoder", max_seq_length=20)
    m = read_manifest(pack_from(src, tmp_path / "default"))
    assert set(m["backends"]) == {"onnx"} and m["unsupported_backends"]["torch"].endswith("(test)")
    with pytest.raises(UnsupportedModelError, match=r"backend torch is not supported for bert: .*\(test\)"):
        pack_from(src, tmp_path / "torch", backends=["torch"])


def test_backend_names_are_the_registrys(tmp_path: Path) -> None:
    src = make_model_dir(tmp_path, "bert", max_seq_length=18)
    with pytest.raises(SourceError, match="unknown backend 'tensorrt'; valid backends: onnx, torch"):
        pack_from(src, tmp_path / "out", backends=["onnx", "tensorrt"])
    with pytest.raises(SourceError, match=r"backends \(none\); valid: onnx, torch"):
        pack_from(src, tmp_path / "out", backends=[" "])
    assert not (tmp_path / "out").exists()


def test_mpnet_packs_both_backends(packed: Callable[..., tuple[Path, Path]]) -> None:
    _, out = packed("mpnet", "cross-encoder", max_seq_length=20)
    m = read_manifest(out)
    assert set(m["backends"]) == {"onnx", "torch"} and "model.safetensors" in m["files"]
    assert "unsupported_backends" not in m


def test_a_model_the_program_cannot_serve_is_onnx_only_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model with Dense modules whose program is refused: torch is dropped from the default backends with the
    program's reason, and refused when asked for, before anything is written."""
    from infra.pack import torch_program

    def refuse(*_: Any, **__: Any) -> None:
        raise torch_program.ProgramExportError("the exported program differs from the model by 0.5 (test)")

    monkeypatch.setattr(torch_program, "export_program", refuse)
    src = make_model_dir(tmp_path, "bert", max_seq_length=18, dense=[(24, "torch.nn.modules.activation.Tanh")])
    m = read_manifest(pack_from(src, tmp_path / "default"))
    assert set(m["backends"]) == {"onnx"} and "model.safetensors" not in m["files"]
    assert m["unsupported_backends"]["torch"] == "the exported program differs from the model by 0.5 (test)"
    with pytest.raises(UnsupportedModelError, match=r"backend torch is not supported for bert: .*0\.5 \(test\)"):
        pack_from(src, tmp_path / "torch", backends=["onnx", "torch"])
    assert not (tmp_path / "torch").exists()


def test_version_follows_content(tmp_path: Path) -> None:
    src = make_model_dir(tmp_path, "distilbert", "classifier")
    first = read_source(src).content_sha256
    assert read_source(src).content_sha256 == first
    (src / "README.md").write_text("not part of the model")
    assert read_source(src).content_sha256 == first
    config = json.loads((src / "config.json").read_text())
    config["id2label"] = {"0": "a", "1": "b", "2": "c"}
    (src / "config.json").write_text(json.dumps(config))
    assert read_source(src).content_sha256 != first


@pytest.mark.parametrize(("family", "kind"), [("bert", "sentence-transformers"), ("xlm-roberta", "classifier")])
def test_the_same_source_packs_to_byte_identical_files(tmp_path: Path, family: str, kind: str) -> None:
    """One id@version is one set of bytes: packed twice (both backends, fusions on), every file is identical."""
    src = make_model_dir(tmp_path, family, kind)
    first, second = pack_from(src, tmp_path / "a"), pack_from(src, tmp_path / "b")
    names = sorted(p.name for p in first.iterdir())
    assert names == sorted(p.name for p in second.iterdir())
    assert set(read_manifest(first)["files"]) | {"manifest.json"} == set(names)
    for name in names:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


def test_a_checkpoint_missing_a_tensor_is_refused_not_packed_twice_differently(tmp_path: Path) -> None:
    """issue 25: transformers filled the missing tensor with fresh random values on each load, so two packs of
    this directory gave two models under one id@version. Now neither pack happens."""
    src = make_model_dir(tmp_path, "bert", "cross-encoder")
    _tensors(src / "model.safetensors", lambda t: t.pop("bert.encoder.layer.0.attention.self.query.bias"))
    for out in (tmp_path / "a", tmp_path / "b"):
        with pytest.raises(SourceError, match=r"1 tensor BertForSequenceClassification needs is missing"):
            pack_from(src, out, backends=["onnx"])
        assert not out.exists()


def test_external_data_is_page_aligned_and_fusion_is_optional(packed: Callable[..., tuple[Path, Path]]) -> None:
    import onnx
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    _, fused = packed("bert", "classifier", max_seq_length=20)
    _, plain = packed("bert", "classifier", pack_options={"fuse": False}, max_seq_length=20)
    assert read_manifest(plain)["backends"]["onnx"]["fused"] is False
    for out in (fused, plain):
        model = onnx.load(str(out / "model.onnx"), load_external_data=False)
        external = [t for t in model.graph.initializer if uses_external_data(t)]
        assert external
        assert all(ExternalDataInfo(t).offset % 4096 == 0 for t in external)
    nodes = onnx.load(str(fused / "model.onnx"), load_external_data=False).graph.node
    assert ("com.microsoft" in {n.domain for n in nodes}) == read_manifest(fused)["backends"]["onnx"]["fused"]
    # the attention itself fuses (the export writes BERT's classic scores / sqrt(d) + additive mask pattern)
    assert "Attention" in {n.op_type for n in nodes}
    np.testing.assert_allclose(Packed(fused).run(TEXTS), Packed(plain).run(TEXTS), atol=1e-4)


def test_one_load_of_the_model_per_pack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 26 (pack memory): the refusal check's model is the one both exports use, and the eager model's
    reference outputs are computed once; before, the checkpoint was loaded three times and the probes run twice."""
    from infra.pack import hf_export

    calls = {"load": 0, "reference": 0}
    load, reference = hf_export.load_torch_model, hf_export.reference_outputs

    def counted_load(*args: Any, **kwargs: Any) -> Any:
        calls["load"] += 1
        return load(*args, **kwargs)

    def counted_reference(*args: Any, **kwargs: Any) -> Any:
        calls["reference"] += 1
        return reference(*args, **kwargs)

    monkeypatch.setattr(hf_export, "load_torch_model", counted_load)
    monkeypatch.setattr(hf_export, "reference_outputs", counted_reference)
    src = make_model_dir(tmp_path, "bert", max_seq_length=18)
    m = read_manifest(pack_from(src, tmp_path / "packed"))
    assert set(m["backends"]) == {"onnx", "torch"} and m["backends"]["torch"]["architecture"] == "exported-program"
    assert calls == {"load": 1, "reference": 1}


def test_export_on_its_own_loads_checks_and_fuses(tmp_path: Path) -> None:
    """`hf_export.export` without a model or reference outputs (what a caller outside hf_pack uses): the graph in
    the staging directory's onnx/, checked, fused, and readable back as one proto."""
    from infra.pack.hf_export import export
    from infra.pack.hf_pack import stage_safetensors

    source = read_source(make_model_dir(tmp_path, "bert", max_seq_length=18))
    staged = tmp_path / "staged"
    staged.mkdir()
    stage_safetensors(source, staged)
    exported = export(source, staged)
    assert exported.where == staged / "onnx" and exported.fused and exported.max_abs_diff <= 1e-4
    assert sorted(p.name for p in exported.where.iterdir()) == ["model.onnx", "model.onnx.data"]
    assert [i.name for i in exported.model.graph.input] == ["input_ids", "attention_mask"]


def test_graph_written_a_tensor_at_a_time_from_a_file_per_tensor(tmp_path: Path) -> None:
    """What torch.onnx writes past 2 GB (each initializer in a file of its own beside the graph) becomes one
    page-aligned model.onnx.data, small tensors back inline, and the graph answers the same."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    from infra.pack.onnx_io import ONNX_DATA, ONNX_FILE, save_onnx_file

    rng = np.random.default_rng(0)
    big, small = rng.standard_normal((64, 48)).astype(np.float32), rng.standard_normal(48).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 48])],
        [numpy_helper.from_array(big, "w"), numpy_helper.from_array(small, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    exported = tmp_path / "exported"
    exported.mkdir()
    onnx.save_model(model, str(exported / "model.onnx"), save_as_external_data=True, all_tensors_to_one_file=False,
                    size_threshold=0)  # fmt: skip
    assert len(list(exported.iterdir())) == 3  # the graph and a file per tensor, as torch.onnx writes them
    save_onnx_file(exported / "model.onnx", tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted([ONNX_FILE, ONNX_DATA])
    written = onnx.load(str(tmp_path / "out" / ONNX_FILE), load_external_data=False)
    external = {t.name: ExternalDataInfo(t) for t in written.graph.initializer if uses_external_data(t)}
    assert list(external) == ["w"] and external["w"].offset % 4096 == 0 and external["w"].location == ONNX_DATA
    x = rng.standard_normal((3, 64)).astype(np.float32)
    session = ort.InferenceSession(str(tmp_path / "out" / ONNX_FILE), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, {"x": x})[0], x @ big + small, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------- refusals


def _edit_json(path: Path, edit: Callable[[Any], None]) -> None:
    value = json.loads(path.read_text())
    edit(value)
    path.write_text(json.dumps(value))


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _offsets_past_the_end(path: Path) -> None:
    """The first tensor's data_offsets end moved far past the end of the file (the header stays valid JSON)."""
    data = path.read_bytes()
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + length])
    name = next(k for k in header if k != "__metadata__")
    header[name]["data_offsets"][1] = 10**9
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + data[8 + length :])


def _tensors(path: Path, edit: Callable[[dict[str, Any]], Any]) -> None:
    """Rewrite a safetensors file with `edit` applied to its name -> array dict."""
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})


DENSE = "sentence_transformers.models.Dense"
GEGLU = ("gated_layers.weight", "wo.weight", "wo.bias", "layernorm.weight")
JINA_V2_AUTO_MAP = {
    "AutoConfig": "jinaai/jina-bert-implementation--configuration_bert.JinaBertConfig",
    "AutoModel": "jinaai/jina-bert-implementation--modeling_bert.JinaBertModel",
    "AutoModelForMaskedLM": "jinaai/jina-bert-implementation--modeling_bert.JinaBertForMaskedLM",
}
_OUTSIDE = r"model\.safetensors: tensor '[^']+': bytes \d+\.\.\d+ are outside the file's \d+ data bytes"
REFUSALS: dict[str, tuple[str, dict[str, Any], Callable[[Path], None], type[SourceError], str]] = {
    "architecture": (
        "sentence-transformers",
        {},
        lambda d: _edit_json(d / "config.json", lambda c: c.update(model_type="gpt2")),
        UnsupportedModelError,
        # The whole list, read from the packer's registry: a new family changes it without editing this test.
        r"model_type 'gpt2' is not supported; supported families: " + re.escape(", ".join(hf_source.FAMILIES)) + "$",
    ),
    "pooling": (
        "sentence-transformers",
        {"pooling": "weightedmean"},
        lambda d: None,
        UnsupportedModelError,
        r"pooling mode 'weightedmean' is not supported; supported: mean, cls, max, lasttoken",
    ),
    "two-poolings": (
        "sentence-transformers",
        {},
        lambda d: _edit_json(d / "1_Pooling" / "config.json", lambda c: c.update(pooling_mode_max_tokens=True)),
        UnsupportedModelError,
        r"pooling mean \+ max; exactly one mode",
    ),
    "dense-after-normalize": (
        "sentence-transformers",
        {},
        lambda d: _edit_json(
            d / "modules.json",
            lambda m: m.append({"idx": 3, "name": "3", "path": "3_Dense", "type": DENSE}),
        ),
        UnsupportedModelError,
        r"modules Transformer -> Pooling -> Normalize -> Dense; supported: Transformer -> Pooling \(-> Dense \.\.\.\) "
        r"\(-> Normalize\)",
    ),
    "dense-activation": (
        "sentence-transformers",
        {"dense": [(8, "torch.nn.modules.activation.Tanh")]},
        lambda d: _edit_json(d / "2_Dense" / "config.json", lambda c: c.update(activation_function="my_code.Act")),
        UnsupportedModelError,
        r"2_Dense/config.json: activation_function 'my_code.Act' is not supported; supported: torch.nn.GELU",
    ),
    "dense-residual": (
        "sentence-transformers",
        {"dense": [(8, "torch.nn.modules.activation.Tanh")]},
        lambda d: _edit_json(d / "2_Dense" / "config.json", lambda c: c.update(use_residual=True)),
        UnsupportedModelError,
        r"use_residual=true is not supported",
    ),
    "custom-only-model-type": (
        "sentence-transformers",
        {},
        lambda d: _edit_json(d / "config.json", lambda c: c.update(model_type="new")),
        UnsupportedModelError,
        r"model_type 'new': Alibaba-NLP's gte 'new' architecture is custom code \(auto_map\) in transformers 5; "
        r"transformers' own class is model_type 'gte'",
    ),
    "include-prompt": (
        "sentence-transformers",
        {"include_prompt": False},
        lambda d: None,
        UnsupportedModelError,
        r"include_prompt=false",
    ),
    "no-weights": (
        "classifier",
        {},
        lambda d: (d / "model.safetensors").unlink(),
        MissingFileError,
        r"no weights; expected model.safetensors \(or pytorch_model.bin\)",
    ),
    "no-tokenizer": (
        "classifier",
        {},
        lambda d: (d / "tokenizer.json").unlink(),
        MissingFileError,
        r"no tokenizer.json, and not the files a bert fast tokenizer is built from \(vocab.txt\)",
    ),
    "no-config": ("classifier", {}, lambda d: (d / "config.json").unlink(), MissingFileError, r"config.json: missing"),
    "plain-encoder": (
        "sentence-transformers",
        {},
        lambda d: (d / "modules.json").unlink(),
        UnsupportedModelError,
        r"BertModel is neither a sentence-transformers embedder .* nor a \*ForSequenceClassification model",
    ),
    "activation": (
        "cross-encoder",
        {"activation": "torch.nn.modules.activation.Tanh"},
        lambda d: None,
        UnsupportedModelError,
        r"activation 'torch.nn.modules.activation.Tanh' is not supported",
    ),
    # issue 24 item 10: each of these ended in a traceback from torch, safetensors, transformers or a KeyError.
    "negative-vocab-size": (
        "sentence-transformers",
        {},
        lambda d: _edit_json(d / "config.json", lambda c: c.update(vocab_size=-5)),
        SourceError,
        r"config.json: vocab_size -5; expected an integer in 1\.\.10000000",
    ),
    "no-max-position-embeddings": (
        "sentence-transformers",
        {},
        lambda d: _edit_json(d / "config.json", lambda c: c.pop("max_position_embeddings")),
        SourceError,
        r"config.json: max_position_embeddings missing; expected an integer in 1\.\.1048576",
    ),
    "tokenizer-without-added-tokens": (
        "sentence-transformers",
        {},
        lambda d: _edit_json(d / "tokenizer.json", lambda t: t.pop("added_tokens")),
        SourceError,
        r"tokenizer.json: 'added_tokens' missing; expected a list",
    ),
    "truncated-safetensors": (
        "sentence-transformers",
        {},
        lambda d: _truncate(d / "model.safetensors"),
        SourceError,
        _OUTSIDE,
    ),
    "safetensors-offsets-past-the-end": (
        "sentence-transformers",
        {},
        lambda d: _offsets_past_the_end(d / "model.safetensors"),
        SourceError,
        _OUTSIDE,
    ),
    "pooling-config-a-list": (
        "sentence-transformers",
        {},
        lambda d: (d / "1_Pooling" / "config.json").write_text("[1, 2]"),
        SourceError,
        r"1_Pooling/config.json: expected a JSON object, found list",
    ),
    # found by tests/unit/test_pack_fuzz.py: fields transformers itself refuses, at load time, mid-build.
    "config-field-transformers-refuses": (
        "sentence-transformers",
        {},
        lambda d: _edit_json(d / "config.json", lambda c: c.update(add_cross_attention=-1)),
        SourceError,
        r"config.json: transformers refuses it \(StrictDataclassFieldValidationError: .*add_cross_attention",
    ),
    "tokenizer-config-transformers-refuses": (
        "sentence-transformers",
        {},
        lambda d: _edit_json(d / "tokenizer_config.json", lambda c: c.update(sep_token=5)),
        SourceError,
        r"transformers cannot load its tokenizer \(TypeError: ",
    ),
    "masked-lm": (
        "classifier",
        {},
        lambda d: _edit_json(d / "config.json", lambda c: c.update(architectures=["BertForMaskedLM"])),
        UnsupportedModelError,
        r"BertForMaskedLM is neither a sentence-transformers embedder .* supported: a sentence-transformers model",
    ),
    # issue 25: custom code packed as if it were the stock class (and served garbage).
    "auto-map-jina-v2": (  # jina-embeddings-v2: model_type bert, auto_map to JinaBert (ALiBi, GEGLU)
        "sentence-transformers",
        {},
        lambda d: _edit_json(d / "config.json", lambda c: c.update(auto_map=JINA_V2_AUTO_MAP)),
        UnsupportedModelError,
        r"config.json: auto_map names the model's own code \(AutoConfig: .*, AutoModel: jinaai/jina-bert-"
        r"implementation--modeling_bert.JinaBertModel, .*\), which warmstart never runs; a checkpoint with "
        r"native transformers support is needed \(e.g. the model's -hf variant, or one whose model_type is a "
        r"stock bert, roberta, xlm-roberta, distilbert, mpnet, electra, deberta-v2, modernbert, gte, nomic_bert, "
        r"qwen2, qwen3, gemma3_text, gemma, gemma2 without auto_map\)",
    ),
    "custom-st-module-jina-v3": (  # jina-embeddings-v3: xlm-roberta + a custom_st.Transformer module
        "sentence-transformers",
        {},
        lambda d: _edit_json(d / "modules.json", lambda m: m[0].update(type="custom_st.Transformer")),
        UnsupportedModelError,
        r"modules.json: module type 'custom_st.Transformer' is the model's own code, not a sentence-transformers "
        r"class; warmstart never runs it; supported: sentence_transformers.models.Transformer",
    ),
    "st-module-unknown-path": (  # inside the package, but not a class path sentence-transformers writes
        "sentence-transformers",
        {},
        lambda d: _edit_json(d / "modules.json", lambda m: m[1].update(type="sentence_transformers.x.Pooling")),
        UnsupportedModelError,
        r"module sentence_transformers.x.Pooling is not supported; supported sentence-transformers modules: "
        r"Transformer, Pooling, Dense, Normalize",
    ),
    "non-stock-architecture": (  # the same without auto_map: a class transformers does not have
        "sentence-transformers",
        {},
        lambda d: _edit_json(d / "config.json", lambda c: c.update(architectures=["JinaBertForMaskedLM"])),
        UnsupportedModelError,
        r"config.json: architecture 'JinaBertForMaskedLM' is not a stock transformers bert class; supported: "
        r"BertModel, BertFor\*",
    ),
    # issue 25: from_pretrained filled a missing tensor with random values (its warning silenced), the export
    # check compared the graph with that same random model, and two packs of one directory differed.
    "missing-tensor": (
        "sentence-transformers",
        {},
        lambda d: _tensors(d / "model.safetensors", lambda t: t.pop("encoder.layer.1.output.dense.bias")),
        SourceError,
        r"model.safetensors: 1 tensor BertModel needs is missing \(encoder.layer.1.output.dense.bias\); "
        r"transformers would fill it with random values",
    ),
    "missing-classifier": (
        "classifier",
        {},
        lambda d: _tensors(d / "model.safetensors", lambda t: [t.pop("classifier.weight"), t.pop("classifier.bias")]),
        SourceError,
        r"model.safetensors: 2 tensors BertForSequenceClassification needs are missing \(classifier.bias, "
        r"classifier.weight\)",
    ),
    "missing-pooler-a-classifier-uses": (  # BertForSequenceClassification classifies the pooler's output
        "classifier",
        {},
        lambda d: _tensors(
            d / "model.safetensors", lambda t: [t.pop("bert.pooler.dense.weight"), t.pop("bert.pooler.dense.bias")]
        ),
        SourceError,
        r"2 tensors BertForSequenceClassification needs are missing \(bert.pooler.dense.bias, bert.pooler.dense",
    ),
    "unexpected-tensors": (  # jina-embeddings-v2's GEGLU feed-forward names, beside BERT's own
        "sentence-transformers",
        {},
        lambda d: _tensors(
            d / "model.safetensors",
            lambda t: t.update({f"encoder.layer.{i}.mlp.{n}": np.zeros(4, np.float32) for i in (0, 1) for n in GEGLU}),
        ),
        SourceError,
        r"model.safetensors: 8 tensors BertModel does not have \(encoder.layer.0.mlp.gated_layers.weight, "
        r"encoder.layer.0.mlp.layernorm.weight, encoder.layer.0.mlp.wo.bias, encoder.layer.0.mlp.wo.weight, "
        r"encoder.layer.1.mlp.gated_layers.weight, \.\.\.\): weights of another architecture or of custom code",
    ),
    "mismatched-tensor": (
        "sentence-transformers",
        {},
        lambda d: _tensors(
            d / "model.safetensors", lambda t: t.update({"encoder.layer.1.output.dense.bias": np.zeros(5, np.float32)})
        ),
        SourceError,
        r"model.safetensors: 1 tensor of a shape BertModel does not have \(encoder.layer.1.output.dense.bias: "
        r"\[5\], expected \[32\]\)",
    ),
    # issue 25: config values the checkpoint cannot match, refused from the safetensors header before anything
    # is allocated (a config's layer count or sizes built a model of that size first).
    "config-more-layers-than-the-weights": (
        "sentence-transformers",
        {},
        lambda d: _edit_json(d / "config.json", lambda c: c.update(num_hidden_layers=1000)),
        SourceError,
        r"config.json: num_hidden_layers 1000, but model.safetensors holds 2 layers \(layer 0\.\.1\)",
    ),
    "config-intermediate-size": (
        "cross-encoder",
        {},
        lambda d: _edit_json(d / "config.json", lambda c: c.update(intermediate_size=200_000)),
        SourceError,
        r"config.json: intermediate_size 200000 x hidden size 32 does not match the weights' "
        r"bert.encoder.layer.0.intermediate.dense.weight \[64, 32\] in model.safetensors",
    ),
    "config-type-vocab-size": (  # no tensor check of its own: the parameter bound refuses it
        "sentence-transformers",
        {},
        lambda d: _edit_json(d / "config.json", lambda c: c.update(type_vocab_size=100_000)),
        SourceError,
        r"config.json: implies at least 3,\d{3},\d{3} parameters, but model.safetensors holds \d+,\d{3} values "
        r"\(\d+,\d{3} bytes\)",
    ),
    "tokenizer-auto-map": (
        "sentence-transformers",
        {},
        lambda d: _edit_json(
            d / "tokenizer_config.json", lambda c: c.update(auto_map={"AutoTokenizer": ["tok.MyTokenizer", None]})
        ),
        UnsupportedModelError,
        r"tokenizer_config.json: auto_map names the model's own code \(AutoTokenizer: tok.MyTokenizer\)",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_refused_before_anything_is_written(tmp_path: Path, case: str) -> None:
    kind, options, damage, error, message = REFUSALS[case]
    src = make_model_dir(tmp_path / "src", "bert", kind, **options)
    damage(src)
    out_parent = tmp_path / "models"
    out_parent.mkdir()
    with pytest.raises(error, match=message):
        pack_from(src, out_parent / "packed")
    assert list(out_parent.iterdir()) == []  # no output, no temporary sibling


def test_refusals_through_the_cli_are_one_message_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What a user sees: `warmstart pack --from` exits 1 with `warmstart pack: <path>: <why; what is
    supported>` on stderr, no traceback, and no output directory. One case runs as a real process (the exit
    status, nothing on stderr but the message); every case runs through the CLI's own entry point in this
    process, which is where the message is made (a process each was ~0.7 s apiece, 35 cases)."""
    import subprocess
    import sys

    from infra.cli import main
    from tests.conftest import ROOT

    def case_dirs(case: str) -> tuple[Path, Path]:
        kind, options, damage, _, _ = REFUSALS[case]
        src = make_model_dir(tmp_path / case, "bert", kind, **options)
        damage(src)
        return src, tmp_path / "models" / case

    first = sorted(REFUSALS)[0]
    src, out = case_dirs(first)
    cmd = [sys.executable, "-m", "infra.cli", "pack", "--from", str(src), "--out", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 1, (first, done.stderr)
    assert done.stderr.startswith("warmstart pack: ") and re.search(REFUSALS[first][4], done.stderr), done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert not out.exists()

    for case, (_, _, _, _, message) in sorted(REFUSALS.items()):
        src, out = case_dirs(case) if case != first else (src, out)
        assert main(["pack", "--from", str(src), "--out", str(out)]) == 1, case
        err = capsys.readouterr().err
        assert "Traceback" not in err, (case, err)
        assert err.startswith("warmstart pack: ") and re.search(message, err), (case, err)
        assert not out.exists()


@pytest.mark.parametrize(
    ("kind", "task", "message"),
    [
        ("classifier", "rerank", r"--task rerank needs a cross-encoder with one output label .* 3 labels"),
        ("cross-encoder", "embedding", r"--task embedding needs a sentence-transformers directory"),
        ("sentence-transformers", "classify", r"--task classify needs a \*ForSequenceClassification model"),
        ("classifier", "translate", r"task 'translate'; valid: auto, embedding, rerank, classify"),
    ],
)
def test_task_that_does_not_fit_is_refused(tmp_path: Path, kind: str, task: str, message: str) -> None:
    src = make_model_dir(tmp_path, "bert", kind)
    with pytest.raises(SourceError, match=message):
        pack_from(src, tmp_path / "packed", task=task)
    assert not (tmp_path / "packed").exists()


@pytest.mark.parametrize(
    ("family", "weights", "edit", "message"),
    [
        ("bert", "safetensors", {"num_hidden_layers": 1000}, r"num_hidden_layers 1000, but model.safetensors holds 2"),
        ("distilbert", "safetensors", {"n_layers": 1}, r"n_layers 1, but model.safetensors holds 2 layers"),
        ("mpnet", "safetensors", {"relative_attention_num_buckets": 10**6}, r"implies at least 4,\d{3},\d{3} param"),
        ("roberta", "safetensors", {"max_position_embeddings": 1000}, r"max_position_embeddings 1000 x hidden size"),
        ("bert", "bin", {"num_hidden_layers": 1000}, r"num_hidden_layers 1000, but pytorch_model.bin holds 2 layers"),
    ],
)
def test_config_the_checkpoint_cannot_match_is_refused_before_any_model_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, family: str, weights: str, edit: dict[str, Any], message: str
) -> None:
    """Read from the safetensors header (a pytorch_model.bin: from its staged copy), before transformers builds a
    model of the config's size: from_pretrained is never reached."""
    from infra.pack import hf_export

    kind = "cross-encoder" if weights == "bin" else "sentence-transformers"
    src = make_model_dir(tmp_path, family, kind, weights=weights)
    _edit_json(src / "config.json", lambda c: c.update(edit))

    def never(*args: Any) -> None:
        raise AssertionError("a model was built")

    monkeypatch.setattr(hf_export, "load_torch_model", never)
    with pytest.raises(SourceError, match=message):
        pack_from(src, tmp_path / "packed")
    assert not (tmp_path / "packed").exists()


@pytest.mark.parametrize(
    ("kind", "damage"),
    [
        # an embedder saved without BertModel's pooler: the embedding is pooled from the tokens, never the pooler
        ("sentence-transformers", lambda t: [t.pop("pooler.dense.weight"), t.pop("pooler.dense.bias")]),
        # an embedder saved from BertForMaskedLM: its head is not part of the encoder sentence-transformers loads
        ("sentence-transformers", lambda t: t.update({"cls.predictions.bias": np.zeros(4, np.float32)})),
        # a classifier whose encoder checkpoint kept a pooler RobertaForSequenceClassification does not build
        ("classifier", lambda t: t.update({"roberta.pooler.dense.bias": np.zeros(32, np.float32)})),
    ],
    ids=["embedder-without-pooler", "embedder-with-mlm-head", "roberta-classifier-with-pooler"],
)
def test_tensors_the_task_never_uses_may_be_absent_or_extra(
    tmp_path: Path, kind: str, damage: Callable[[dict[str, Any]], Any]
) -> None:
    family = "roberta" if kind == "classifier" else "bert"
    src = make_model_dir(tmp_path, family, kind)
    _tensors(src / "model.safetensors", damage)
    first = pack_from(src, tmp_path / "a", backends=["onnx"], fuse=False)
    second = pack_from(src, tmp_path / "b", backends=["onnx"], fuse=False)
    for name in read_manifest(first)["files"]:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


def test_module_types_are_matched_by_exact_class_path(tmp_path: Path) -> None:
    """Each modules.json spelling warmstart accepts is one sentence-transformers writes, and the installed
    sentence-transformers resolves it to that stock class (without trust_remote_code); each one packs."""
    import warnings

    from sentence_transformers.cross_encoder.modules import LogitScore
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize, Pooling, Transformer
    from sentence_transformers.util import import_module_class

    from infra.pack.hf_source import ST_MODULE_TYPES

    stock = {"Transformer": Transformer, "Pooling": Pooling, "Dense": Dense, "Normalize": Normalize}
    stock["LogitScore"] = LogitScore
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the pre-6.0 paths are deprecated aliases
        for type_name, kind in ST_MODULE_TYPES.items():
            assert import_module_class(type_name, str(tmp_path)) is stock[kind], type_name
    src = make_model_dir(tmp_path, "bert", normalize=True, dense=[(24, "torch.nn.modules.activation.Tanh")])
    for type_name, kind in ST_MODULE_TYPES.items():
        if kind == "LogitScore":  # a decoder reranker's head, not an embedder's: tests/unit/test_pack_lm_rerank.py
            continue
        index = ["Transformer", "Pooling", "Dense", "Normalize"].index(kind)
        modules = json.loads((src / "modules.json").read_text())
        modules[index]["type"] = type_name
        (src / "modules.json").write_text(json.dumps(modules))
        source = read_source(src)
        assert (source.task, source.pooling, source.normalize) == ("embedding", "mean", True), type_name
        assert [(d.out_features, d.activation) for d in source.dense] == [(24, "tanh")], type_name
        assert source.model_root == src


def test_task_auto_detection_and_override(tmp_path: Path) -> None:
    assert read_source(make_model_dir(tmp_path, "roberta", "sentence-transformers")).task == "embedding"
    assert read_source(make_model_dir(tmp_path, "roberta", "cross-encoder")).task == "rerank"
    assert read_source(make_model_dir(tmp_path, "roberta", "cross-encoder", layout="st", name="st")).task == "rerank"
    assert read_source(make_model_dir(tmp_path, "roberta", "classifier")).task == "classify"
    one_label = read_source(make_model_dir(tmp_path, "roberta", "cross-encoder", name="one"), task="classify")
    assert (one_label.task, one_label.problem_type) == ("classify", "multi_label_classification")


# ---------------------------------------------------------------------------------------------- CLI


def test_cli_pack_from(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from infra.cli import main

    src = make_model_dir(tmp_path, "distilbert", "cross-encoder")
    out = tmp_path / "packed"
    rc = main(
        [
            "pack",
            "--from",
            str(src),
            "--out",
            str(out),
            "--id",
            "my-reranker",
            "--no-fuse",
            "--backends",
            "onnx",
            "--json",
        ]
    )
    assert rc == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["task"] == "rerank" and printed["backends"] == ["onnx"]
    assert re.fullmatch(r"my-reranker@[0-9a-f]{12}", printed["model"])  # the version never repeats the id
    assert read_manifest(out)["backends"]["onnx"]["fused"] is False

    assert main(["pack", "--from", str(src), "--out", str(out)]) == 1  # exists, no --force
    assert "exists" in capsys.readouterr().err
    (src / "config.json").unlink()
    assert main(["pack", "--from", str(src), "--out", str(tmp_path / "other")]) == 1
    assert "config.json: missing" in capsys.readouterr().err
    assert not (tmp_path / "other").exists()
