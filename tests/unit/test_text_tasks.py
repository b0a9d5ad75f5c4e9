"""The text tasks over a fake backend: routing, options, limits and typed errors for embedding (prompts,
dimensions, base64), rerank and classify; float32 text that reads back as the same float32; the manifest's
new fields checked at load. The tokenizer is a real one, built here with `tokenizers` (nothing downloaded)."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from handler.api.encode import dumps
from handler.backends import registry
from handler.backends.contract import create_backend
from handler.core.config import Config
from handler.core.errors import (
    ConfigError,
    InputTooLongError,
    InvalidEncodingError,
    InvalidInputError,
    ModelLoadError,
    ModelOutputError,
    TooManyInputsError,
)
from handler.core.manifest import Manifest
from handler.core.types import Arrays
from handler.tasks import catalog
from handler.tasks.batch import run_prepared
from handler.tasks.catalog import load_manifest
from handler.tasks.embedding import EmbeddingTask
from handler.tasks.scored import ClassifyTask, RerankTask
from handler.tasks.scoring import softmax
from handler.tasks.tokens import TextEncoder

WORDS = "the quick brown fox jumps over lazy dog query passage a b c d e f g h".split()  # noqa: SIM905
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", ":", *WORDS]
DIM = 4


def write_tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordPiece

    tok = Tokenizer(WordPiece({w: i for i, w in enumerate(VOCAB)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    tok.save(str(path))


def packed(tmp_path: Path, task: str, **fields: Any) -> Path:
    """A packed text model directory: a real tokenizer.json and a manifest (no weights: the backend is fake)."""
    write_tokenizer(tmp_path / "tokenizer.json")
    data = (tmp_path / "tokenizer.json").read_bytes()
    outputs = {
        "embedding": {"name": "sentence_embedding", "dtype": "float32", "shape": ["batch", DIM]},
        "rerank": {"name": "scores", "dtype": "float32", "shape": ["batch"]},
        "classify": {"name": "logits", "dtype": "float32", "shape": ["batch", 3]},
    }[task]
    ids = {"dtype": "int64", "shape": ["batch", "sequence"]}
    raw: dict[str, Any] = {
        "format": "warmstart-packed-model",
        "format_version": 1,
        "id": "tiny-text",
        "version": "1",
        "task": task,
        "family": "bert",
        "default_backend": "onnx",
        "files": {"tokenizer.json": {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}},
        "backends": {"onnx": {"model": "model.onnx", "files": []}},
        "inputs": [{"name": "input_ids", **ids}, {"name": "attention_mask", **ids}],
        "outputs": [outputs],
        "tokenizer": {"file": "tokenizer.json", "truncation": 16, "padding": "longest", "pad_id": 0},
        "max_seq_length": 16,
    }
    if task == "embedding":
        raw |= {"pooling": {"mode": "mean", "normalize": True, "in_graph": True}, "dimension": DIM}
    if task == "rerank":
        raw |= {"activation": "sigmoid"}
    if task == "classify":
        raw |= {"labels": ["neg", "neutral", "pos"], "problem_type": "single_label_classification"}
    raw |= fields
    raw = {k: v for k, v in raw.items() if v is not None}
    (tmp_path / "manifest.json").write_text(json.dumps(raw))
    return tmp_path


class FakeBackend:
    """Deterministic outputs from the feeds, and every feed kept for the test to inspect."""

    name = "onnx"

    def __init__(self, manifest: Manifest) -> None:
        self.output = manifest.outputs[0].name
        self.feeds: list[dict[str, npt.NDArray[Any]]] = []

    def run(self, feeds: Arrays) -> Arrays:
        self.feeds.append({k: v.copy() for k, v in feeds.items()})
        ids, mask = feeds["input_ids"], feeds["attention_mask"]
        lengths = mask.sum(1).astype(np.float32)
        if self.output == "sentence_embedding":  # a fixed direction per length, unit norm
            v = np.stack([lengths, lengths % 3 + 1, (ids * mask).sum(1) % 7 + 1, np.full_like(lengths, 0.5)], 1)
            out = (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)
        elif self.output == "scores":  # longer pairs score higher; equal lengths tie
            out = (1 / (1 + np.exp(-lengths / 10))).astype(np.float32)
        else:
            out = np.stack([lengths / 3, -lengths / 5, np.full_like(lengths, 1.5)], 1).astype(np.float32)
        return {self.output: out}


def make(tmp_path: Path, task: str, config: Config | None = None, **fields: Any) -> tuple[Any, FakeBackend]:
    manifest = load_manifest(packed(tmp_path, task, **fields))
    backend = FakeBackend(manifest)
    config = config or Config(model_dir=tmp_path, backend=None)
    return catalog.spec(task).factory(manifest, backend, config), backend  # type: ignore[arg-type]


def roundtrip(body: Any) -> Any:
    """The answer as a client reads it: through the edge's encoder (float32 arrays in it)."""
    return json.loads(dumps(body))


# ---- embedding -----------------------------------------------------------------------------------------


def test_embedding_answer_is_float32_text(tmp_path: Path) -> None:
    task, backend = make(tmp_path, "embedding")
    assert isinstance(task, EmbeddingTask)
    body = roundtrip(task({"inputs": ["the quick fox", "a dog"]}))
    assert body["model"] == "tiny-text@1" and body["usage"]["tokens"] == 5 + 4
    want = backend.run({k: v for k, v in backend.feeds[-1].items()})["sentence_embedding"]
    assert np.array_equal(np.asarray(body["embeddings"], np.float32), want)  # the same float32 bits
    assert len(json.dumps(body["embeddings"])) < len(json.dumps(want.tolist()))  # and shorter than float64 text
    assert "token_type_ids" not in backend.feeds[-1]  # not in the manifest's inputs


@pytest.mark.parametrize("texts", [["the quick fox"], ["a"], ["the quick brown fox jumps over the lazy dog"]])
def test_one_text_counts_every_token(tmp_path: Path, texts: list[str]) -> None:
    # A single text is counted from its shape (never padded), a batch from its mask: both the mask's sum.
    task, backend = make(tmp_path, "embedding")
    body = task({"inputs": texts})
    assert (
        body["usage"]["tokens"]
        == int(backend.feeds[-1]["attention_mask"].sum())
        == backend.feeds[-1]["attention_mask"].shape[1]
    )


def test_prompts(tmp_path: Path) -> None:
    task, backend = make(tmp_path, "embedding", prompts={"query": "query: ", "passage": "passage: "})
    ids = task.encoder.encode(["query: the fox"])[0][0].tolist()
    task({"inputs": ["the fox"], "prompt_name": "query"})
    assert backend.feeds[-1]["input_ids"][0].tolist() == ids
    task({"inputs": ["the fox"], "prompt": "query: "})
    assert backend.feeds[-1]["input_ids"][0].tolist() == ids
    task({"inputs": ["the fox"]})
    assert backend.feeds[-1]["input_ids"][0].tolist() == task.encoder.encode(["the fox"])[0][0].tolist()
    with pytest.raises(InvalidInputError, match="'document' is not one of this model's prompts; valid: passage, query"):
        task({"inputs": ["x"], "prompt_name": "document"})
    with pytest.raises(InvalidInputError, match="not both"):
        task({"inputs": ["x"], "prompt_name": "query", "prompt": "q: "})
    with pytest.raises(InvalidInputError, match='"prompt" must be a string'):
        task({"inputs": ["x"], "prompt": 3})


def test_default_prompt_name_applies_when_none_is_asked(tmp_path: Path) -> None:
    task, backend = make(tmp_path, "embedding", prompts={"query": "query: "}, default_prompt_name="query")
    task({"inputs": ["the fox"]})
    assert backend.feeds[-1]["input_ids"][0].tolist() == task.encoder.encode(["query: the fox"])[0][0].tolist()
    task({"inputs": ["the fox"], "prompt": ""})  # an explicit empty prompt turns it off
    assert backend.feeds[-1]["input_ids"][0].tolist() == task.encoder.encode(["the fox"])[0][0].tolist()


@pytest.mark.parametrize("name", [["query"], {"query": 1}, 3, True, ""])
@pytest.mark.parametrize("prompts", [{"query": "query: ", "passage": "passage: "}, None])
def test_prompt_name_of_another_type_is_a_typed_error(tmp_path: Path, name: Any, prompts: Any) -> None:
    """A list or an object used to reach the prompts dict and fail as `TypeError: unhashable type` (a 500)."""
    task, _ = make(tmp_path, "embedding", prompts=prompts)
    valid = "passage, query" if prompts else "none"
    with pytest.raises(InvalidInputError, match=f'"prompt_name" .*; valid: {valid}'):
        task({"inputs": ["x"], "prompt_name": name})
    assert len(task({"inputs": ["still serving"]})["embeddings"]) == 1


def test_prompt_name_on_a_model_without_prompts(tmp_path: Path) -> None:
    task, _ = make(tmp_path, "embedding")
    with pytest.raises(InvalidInputError, match="valid: none"):
        task({"inputs": ["x"], "prompt_name": "query"})


def test_dimensions_truncate_then_renormalize(tmp_path: Path) -> None:
    task, _ = make(tmp_path, "embedding")
    full = np.asarray(task({"inputs": ["the quick brown fox"]})["embeddings"], np.float32)
    cut = np.asarray(task({"inputs": ["the quick brown fox"], "dimensions": 2})["embeddings"], np.float32)
    assert cut.shape == (1, 2)
    np.testing.assert_allclose(cut, full[:, :2] / np.linalg.norm(full[:, :2]), rtol=1e-6)
    assert abs(float(np.linalg.norm(cut)) - 1) < 1e-6
    same = np.asarray(task({"inputs": ["the quick brown fox"], "dimensions": DIM})["embeddings"], np.float32)
    assert np.array_equal(same, full)
    for bad in (0, DIM + 1, -1, True, 2.0, "2"):
        with pytest.raises(InvalidInputError, match=rf'"dimensions" is .*; valid: an integer, 1 to {DIM}'):
            task({"inputs": ["x"], "dimensions": bad})


def test_dimensions_on_an_unnormalized_model_only_truncate(tmp_path: Path) -> None:
    task, _ = make(tmp_path, "embedding", pooling={"mode": "cls", "normalize": False, "in_graph": True})
    full = np.asarray(task({"inputs": ["the fox"]})["embeddings"], np.float32)
    cut = np.asarray(task({"inputs": ["the fox"], "dimensions": 3})["embeddings"], np.float32)
    assert np.array_equal(cut, full[:, :3])


def test_base64_is_little_endian_float32(tmp_path: Path) -> None:
    task, backend = make(tmp_path, "embedding")
    body = roundtrip(task({"inputs": ["the fox", "lazy dog"], "encoding_format": "base64"}))
    got = np.stack([np.frombuffer(base64.b64decode(s), dtype="<f4") for s in body["embeddings"]])
    assert np.array_equal(got, backend.run(backend.feeds[-1])["sentence_embedding"])
    cut = roundtrip(task({"inputs": ["the fox"], "encoding_format": "base64", "dimensions": 2}))["embeddings"][0]
    assert len(base64.b64decode(cut)) == 2 * 4
    with pytest.raises(InvalidInputError, match="valid: float, base64"):
        task({"inputs": ["x"], "encoding_format": "int8"})


@pytest.mark.parametrize("value", [{}, [], "", 0, False, ["base64"], {"float": 1}, 1.5])
def test_encoding_format_of_another_type_is_refused(tmp_path: Path, value: Any) -> None:
    """`{}`, `[]`, `""`, `0` and `false` used to be read as "float" (falsy); now only a valid string or null is."""
    task, _ = make(tmp_path, "embedding")
    with pytest.raises(InvalidInputError, match=r'"encoding_format" .*; valid: float, base64'):
        task({"inputs": ["x"], "encoding_format": value})
    assert isinstance(roundtrip(task({"inputs": ["x"], "encoding_format": None}))["embeddings"][0], list)  # floats


@pytest.mark.parametrize(
    ("payload", "error", "match"),
    [
        ([], InvalidInputError, "JSON object"),
        ({"input": ["x"]}, InvalidInputError, 'no "inputs"'),
        ({"inputs": []}, InvalidInputError, "empty"),
        ({"inputs": 3}, InvalidInputError, "list of strings"),
        ({"inputs": ["x", 3]}, InvalidInputError, r"inputs\[1\] must be a string"),
        ({"inputs": ["x"] * 5}, TooManyInputsError, "5 inputs; at most 4"),
        ({"inputs": ["x" * 51]}, InputTooLongError, r"inputs\[0\] has 51 characters; at most 50"),
        ({"inputs": ["\ud800"]}, InvalidEncodingError, "not valid Unicode"),
    ],
)
def test_embedding_limits(tmp_path: Path, payload: Any, error: type[Exception], match: str) -> None:
    task, _ = make(tmp_path, "embedding", Config(model_dir=tmp_path, backend=None, max_inputs=4, max_chars=50))
    with pytest.raises(error, match=match):
        task(payload)
    assert len(task({"inputs": ["still serving"]})["embeddings"]) == 1


# ---- rerank --------------------------------------------------------------------------------------------


def test_rerank_sorted_with_ties_by_index(tmp_path: Path) -> None:
    task, backend = make(tmp_path, "rerank")
    assert isinstance(task, RerankTask)
    docs = ["a", "the quick brown fox", "b", "lazy dog"]
    body = roundtrip(task({"query": "fox", "documents": docs}))
    assert [r["index"] for r in body["results"]] == [1, 3, 0, 2]  # by length; "a" and "b" tie: index order
    scores = backend.run(backend.feeds[-1])["scores"]
    assert [np.float32(r["relevance_score"]) for r in body["results"]] == [scores[i] for i in (1, 3, 0, 2)]
    assert body["usage"]["tokens"] == int(backend.feeds[-1]["attention_mask"].sum())
    assert "document" not in body["results"][0]


def test_rerank_top_n_and_return_documents(tmp_path: Path) -> None:
    task, _ = make(tmp_path, "rerank")
    docs = ["a", "the quick brown fox", {"text": "lazy dog"}]  # Cohere's document objects are taken too
    body = task({"query": "fox", "documents": docs, "top_n": 2, "return_documents": True})
    assert [(r["index"], r["document"]["text"]) for r in body["results"]] == [
        (1, "the quick brown fox"),
        (2, "lazy dog"),
    ]
    assert len(task({"query": "fox", "documents": docs, "top_n": 10})["results"]) == 3  # more than there are: all
    for bad in (0, -2, "3", 1.5, False):
        with pytest.raises(InvalidInputError, match=r'"top_n" is .*; valid: an integer, 1 or more'):
            task({"query": "fox", "documents": docs, "top_n": bad})
    with pytest.raises(InvalidInputError, match='"return_documents" must be true or false'):
        task({"query": "fox", "documents": docs, "return_documents": "yes"})


def test_rerank_encodes_pairs(tmp_path: Path) -> None:
    task, backend = make(tmp_path, "rerank")
    task({"query": "the fox", "documents": ["lazy dog"]})
    ids = backend.feeds[-1]["input_ids"][0].tolist()
    assert [VOCAB[i] for i in ids] == ["[CLS]", "the", "fox", "[SEP]", "lazy", "dog", "[SEP]"]
    assert "token_type_ids" not in backend.feeds[-1]


def test_rerank_feeds_type_ids_when_the_model_takes_them(tmp_path: Path) -> None:
    ids = {"dtype": "int64", "shape": ["batch", "sequence"]}
    inputs = [{"name": n, **ids} for n in ("input_ids", "attention_mask", "token_type_ids")]
    task, backend = make(tmp_path, "rerank", inputs=inputs)
    task({"query": "the fox", "documents": ["lazy dog", "a"]})
    types = backend.feeds[-1]["token_type_ids"]
    assert types.tolist() == [[0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 1, 1, 0]]  # the document's tokens, pad 0


def test_rerank_truncates_longest_first(tmp_path: Path) -> None:
    task, backend = make(tmp_path, "rerank")  # truncation 16 tokens
    long_doc = " ".join(WORDS * 3)
    task({"query": "the quick fox", "documents": [long_doc]})
    ids = [VOCAB[i] for i in backend.feeds[-1]["input_ids"][0].tolist()]
    assert len(ids) == 16 and ids[:5] == ["[CLS]", "the", "quick", "fox", "[SEP]"]  # the query is kept whole


@pytest.mark.parametrize(
    ("payload", "error", "match"),
    [
        ({"documents": ["a"]}, InvalidInputError, 'no "query"'),
        ({"query": "q"}, InvalidInputError, 'no "documents"'),
        ({"query": 3, "documents": ["a"]}, InvalidInputError, "query must be a string"),
        ({"query": "q", "documents": []}, InvalidInputError, '"documents" is empty'),
        ({"query": "q", "documents": "a"}, InvalidInputError, '"documents" must be a list'),
        ({"query": "q", "documents": ["a", 1]}, InvalidInputError, r"documents\[1\] must be a string"),
        ({"query": "q", "documents": ["a"] * 5}, TooManyInputsError, "5 documents; at most 4"),
        ({"query": "q", "documents": ["a" * 51]}, InputTooLongError, r"documents\[0\] has 51 characters"),
        ({"query": "q" * 51, "documents": ["a"]}, InputTooLongError, "query has 51 characters"),
    ],
)
def test_rerank_limits(tmp_path: Path, payload: Any, error: type[Exception], match: str) -> None:
    task, _ = make(tmp_path, "rerank", Config(model_dir=tmp_path, backend=None, max_inputs=4, max_chars=50))
    with pytest.raises(error, match=match):
        task(payload)
    assert len(task({"query": "q", "documents": ["still", "serving"]})["results"]) == 2


# ---- classify ------------------------------------------------------------------------------------------


def test_classify_softmax_sorted(tmp_path: Path) -> None:
    task, backend = make(tmp_path, "classify")
    assert isinstance(task, ClassifyTask)
    body = roundtrip(task({"inputs": ["the quick brown fox jumps", "a"]}))
    logits = backend.run(backend.feeds[-1])["logits"]
    probs = softmax(logits)
    for row, prediction in zip(probs, body["predictions"], strict=True):
        assert [p["score"] for p in prediction] == sorted((p["score"] for p in prediction), reverse=True)
        for p in prediction:
            assert abs(p["score"] - row[["neg", "neutral", "pos"].index(p["label"])]) < 1e-7
        assert abs(sum(p["score"] for p in prediction) - 1) < 1e-6
    assert body["predictions"][0][0]["label"] == "neg" and body["predictions"][1][0]["label"] == "pos"


def test_classify_multi_label_is_sigmoid(tmp_path: Path) -> None:
    task, backend = make(tmp_path, "classify", problem_type="multi_label_classification")
    body = task({"inputs": ["the fox"]})
    logits = backend.run(backend.feeds[-1])["logits"][0]
    got = {p["label"]: p["score"] for p in body["predictions"][0]}
    want = 1 / (1 + np.exp(-logits.astype(np.float64)))
    assert max(abs(got[label] - w) for label, w in zip(["neg", "neutral", "pos"], want, strict=True)) < 1e-7


def test_classify_top_k(tmp_path: Path) -> None:
    task, _ = make(tmp_path, "classify")
    assert [len(p) for p in task({"inputs": ["a", "b"], "top_k": 1})["predictions"]] == [1, 1]
    assert len(task({"inputs": "a", "top_k": 9})["predictions"][0]) == 3  # a single string is one input
    with pytest.raises(InvalidInputError, match=r'"top_k" is 0; valid: an integer, 1 or more'):
        task({"inputs": ["a"], "top_k": 0})


@pytest.mark.parametrize("task_name", ["embedding", "rerank", "classify"])
def test_warmup_runs_the_model(tmp_path: Path, task_name: str) -> None:
    task, backend = make(tmp_path, task_name)
    task.warmup()
    assert len(backend.feeds) == 2 and backend.feeds[1]["input_ids"].shape[0] == 2


@pytest.mark.parametrize("task_name", ["embedding", "rerank", "classify"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_nan_or_infinite_output_is_a_model_output_error(tmp_path: Path, task_name: str, bad: float) -> None:
    """JSON has no NaN (orjson would write null: a silent hole in a vector or a score): the request gets a 500
    naming the output, alone or batched, in either encoding; its batch-mates are answered."""
    task, backend = make(tmp_path, task_name)
    run = backend.run

    def broken(feeds: Arrays) -> Arrays:
        out = run(feeds)
        out[backend.output][-1, ...] = bad  # the last row: the request of the longest texts
        return out

    backend.run = broken  # type: ignore[method-assign]
    request = {"query": "the fox", "documents": ["a", "b c"]} if task_name == "rerank" else {"inputs": ["a", "b c"]}
    with pytest.raises(
        ModelOutputError, match=r"the model's (vectors|scores|logits): [1-4] of \d+ values are NaN or inf"
    ):
        task(request)
    if task_name == "embedding":
        with pytest.raises(ModelOutputError):
            task({**request, "encoding_format": "base64"})
    fine = {"query": "a", "documents": ["a"]} if task_name == "rerank" else {"inputs": ["a"]}
    results = run_prepared(task, [task.prepare(fine), task.prepare(request)], 1 << 20)
    assert isinstance(results[1], ModelOutputError) and isinstance(results[0], dict)
    assert "null" not in json.dumps(roundtrip(results[0]))


# ---- manifest fields -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("task", "fields", "match"),
    [
        ("rerank", {"activation": "softmax"}, "activation 'softmax'; valid: sigmoid, identity"),
        ("rerank", {"activation": None}, "needs 'activation'"),
        ("classify", {"labels": None}, "needs 'labels'"),
        ("classify", {"labels": []}, "needs 'labels'"),
        ("classify", {"problem_type": "regression"}, "valid: single_label_classification, multi_label"),
        ("embedding", {"family": "gpt2"}, "family 'gpt2'; valid: bert, roberta, xlm-roberta, distilbert, mpnet"),
        ("embedding", {"pooling": {"mode": "weightedmean"}}, "pooling mode 'weightedmean'; valid: mean, cls"),
        ("embedding", {"prompts": {"query": 3}}, "prompts must be an object"),
        ("embedding", {"prompts": {"q": "q: "}, "default_prompt_name": "x"}, "default_prompt_name 'x' is not among"),
        ("embedding", {"dimension": 0}, "dimension 0 is not a positive integer"),
        ("embedding", {"unsupported_backends": {"onnx": "no"}}, "both packed and unsupported"),
        ("embedding", {"unsupported_backends": ["torch"]}, "unsupported_backends must be an object"),
    ],
)
def test_manifest_fields_checked(tmp_path: Path, task: str, fields: dict[str, Any], match: str) -> None:
    root = packed(tmp_path, task)
    raw = json.loads((root / "manifest.json").read_text())
    raw |= fields
    (root / "manifest.json").write_text(json.dumps({k: v for k, v in raw.items() if v is not None}))
    with pytest.raises(ModelLoadError, match=match):
        load_manifest(root)


def test_unsupported_backend_is_a_config_error(tmp_path: Path) -> None:
    why = "mpnet: relative position bias not implemented in warmstart's torch encoder"
    manifest = load_manifest(packed(tmp_path, "embedding", family="mpnet", unsupported_backends={"torch": why}))
    with pytest.raises(ConfigError, match=rf"cannot run on backend 'torch': {why}; it is packed for: onnx"):
        create_backend(registry.spec("torch"), manifest)


def _tokenizers(tmp_path: Path) -> dict[str, Path]:
    from tests.tiny_models import _bert_tokenizer, _bpe_tokenizer, _unigram_tokenizer

    paths = {}
    for name, tok in (
        ("wordpiece", _bert_tokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], "[CLS]", "[SEP]", False)[0]),
        ("bpe", _bpe_tokenizer()),
        ("unigram", _unigram_tokenizer()),
    ):
        tok.save(str(tmp_path / f"{name}.json"))
        paths[name] = tmp_path / f"{name}.json"
    return paths


TEXTS: list[Any] = [
    ["the quick brown fox"],
    ["a", "the quick brown fox jumps over the lazy dog again and again and again", "Fox JUMPS, café 狐 🦊!"],
    ["  spaced\tout\n words \x00 [MASK] <mask> [CLS]"],
    [("which fox?", "the quick brown fox jumps over the lazy dog")],
    [("a", "b"), ("the quick brown fox jumps over the lazy dog again", "dog")],
]


@pytest.mark.parametrize("kind", ["wordpiece", "bpe", "unigram"])
def test_encoder_gives_what_encode_batch_gives(tmp_path: Path, kind: str) -> None:
    """The encoder skips character offsets (`encode_batch_fast`): ids, masks and type ids as `encode_batch`
    gives them with the same truncation and padding, for single texts, ragged batches, pairs and long text."""
    from tokenizers import Tokenizer

    path = _tokenizers(tmp_path)[kind]
    encoder = TextEncoder(path, max_length=12, pad_id=0)
    plain = Tokenizer.from_file(str(path))
    plain.enable_truncation(12, strategy="longest_first")
    plain.enable_padding(pad_id=0, pad_token=plain.id_to_token(0) or "[PAD]")
    for texts in TEXTS:
        ours, theirs = encoder.tokenize(texts), plain.encode_batch(texts)
        assert [e.ids for e in ours] == [e.ids for e in theirs], texts
        assert [e.attention_mask for e in ours] == [e.attention_mask for e in theirs], texts
        assert [e.type_ids for e in ours] == [e.type_ids for e in theirs], texts
        assert len(ours[-1].ids) <= 12
