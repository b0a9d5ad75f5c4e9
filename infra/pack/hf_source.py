"""Reading and checking a local Hugging Face / sentence-transformers model directory (`warmstart pack --from DIR`).

Everything here is plain JSON and file checks: nothing is imported from torch or transformers, nothing is
fetched from a hub, and nothing is written. A directory warmstart cannot serve faithfully (an architecture,
a pooling mode, an extra module, a missing file) is refused here, before the packer writes anything, with a
`SourceError` that names what was found and lists what is supported. The value checks themselves (sizes,
safetensors headers, tokenizer files) are in `hf_checks`.

About one thing (the directory → one `HFSource`, each refusal beside what it reads), hence its length.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Literal, get_args

from infra.pack.families import CUSTOM_ONLY, NEW_FAMILIES
from infra.pack.hf_checks import (
    CONFIG_KEYS,
    SourceError,
    check_checkpoint,
    check_config,
    check_tokenizer_json,
    is_int,
    open_source,
    read_source_file,
    safetensors_shapes,
)
from infra.pack.hybrid_source import HEADS as HYBRID_HEADS
from infra.pack.hybrid_source import heads as hybrid_heads
from infra.pack.hybrid_source import is_hybrid
from infra.pack.multivector_source import LATE_DENSE, LATE_MODULE_TYPES, is_late_interaction, late_settings
from infra.pack.sparse_source import SUPPORTED as SPARSE_SUPPORTED
from infra.pack.sparse_source import Splade, check_static_query, is_sparse, sparse_modules

Task = Literal["embedding", "rerank", "classify", "multivector", "sparse", "hybrid"]
TaskChoice = Literal["auto", "embedding", "rerank", "classify", "multivector", "sparse", "hybrid"]
TASK_CHOICES: tuple[str, ...] = get_args(TaskChoice)

# config.json `model_type` -> warmstart family, and the architectures each family is packed from.
FAMILIES: dict[str, str] = {
    "bert": "bert",
    "roberta": "roberta",
    "xlm-roberta": "xlm-roberta",
    "distilbert": "distilbert",
    "mpnet": "mpnet",
    **{f.name: f.name for f in NEW_FAMILIES.values()},
}
ARCH_PREFIX = {
    "bert": "Bert",
    "roberta": "Roberta",
    "xlm-roberta": "XLMRoberta",
    "distilbert": "DistilBert",
    "mpnet": "MPNet",
    **{f.name: f.prefix for f in NEW_FAMILIES.values()},
}
# Families whose position ids start after padding_idx (so max_position_embeddings counts two extra slots).
POSITION_OFFSET = {"roberta": 2, "xlm-roberta": 2, "mpnet": 2}
# Families with a token type (segment) embedding that a sentence pair uses.
TOKEN_TYPE_FAMILIES = frozenset({"bert", *(f.name for f in NEW_FAMILIES.values() if f.token_types)})

POOLING_MODES = ("mean", "cls", "max", "lasttoken")
# `--pooling` for a bare encoder directory (no modules.json): TEI's token poolings that need no extra weights
# (splade needs the MLM head). Its embeddings are L2-normalized, as TEI's /embed returns them by default.
BARE_POOLING_MODES = ("mean", "cls", "lasttoken")
_BARE_FIX = "add --task embedding --pooling mean (or cls)"
_LEGACY_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
SUPPORTED_MODULES = ("Transformer", "Pooling", "Dense", "Normalize", LATE_DENSE, "LogitScore")
# modules.json `type` -> module kind, matched by exact class path (never by the last dotted name: jina-embeddings-v3's
# `custom_st.Transformer` is its own code). The spellings are those sentence-transformers' save() writes: up to
# 5.3 the module path `sentence_transformers.models.X`; 5.4 and 5.x Normalize under sentence_transformer.modules;
# 6.x `<module>.<Class>` below. The installed sentence-transformers (6.3) resolves each to its stock class
# (tests/unit/test_pack_from.py checks it); anything else is refused.
ST_MODULE_TYPES = {
    "sentence_transformers.models.Transformer": "Transformer",
    "sentence_transformers.base.modules.transformer.Transformer": "Transformer",
    "sentence_transformers.models.Pooling": "Pooling",
    "sentence_transformers.sentence_transformer.modules.pooling.Pooling": "Pooling",
    "sentence_transformers.models.Normalize": "Normalize",
    "sentence_transformers.sentence_transformer.modules.normalize.Normalize": "Normalize",
    "sentence_transformers.base.modules.normalize.Normalize": "Normalize",
    "sentence_transformers.models.Dense": "Dense",
    "sentence_transformers.base.modules.dense.Dense": "Dense",
    "sentence_transformers.cross_encoder.modules.logit_score.LogitScore": "LogitScore",  # infra.pack.lm_rerank
}
# sentence-transformers Dense activations (the class path its config.json names; a missing key is its default,
# Tanh) -> the torch module put into the graph. Another path is refused (sentence-transformers itself would fall
# back to Tanh for a path outside torch: never what the model was trained with).
DENSE_ACTIVATIONS = {
    "torch.nn.modules.linear.Identity": "identity",
    "torch.nn.Identity": "identity",
    "torch.nn.modules.activation.Tanh": "tanh",
    "torch.nn.Tanh": "tanh",
    "torch.nn.modules.activation.ReLU": "relu",
    "torch.nn.ReLU": "relu",
    "torch.nn.modules.activation.GELU": "gelu",
    "torch.nn.GELU": "gelu",
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
    "torch.nn.Sigmoid": "sigmoid",
}
_ST_PACKAGE = "sentence_transformers."  # a type outside it is code of the model's own (trust_remote_code)
_NATIVE = "a checkpoint with native transformers support is needed (e.g. the model's -hf variant, or one whose "
_NATIVE += f"model_type is a stock {', '.join(FAMILIES)} without auto_map)"
# sentence-transformers' CrossEncoder activations (a dotted torch path in the model's config) -> manifest name.
ACTIVATIONS = {
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
    "torch.nn.Sigmoid": "sigmoid",
    "torch.nn.modules.linear.Identity": "identity",
    "torch.nn.Identity": "identity",
}
PROBLEM_TYPES = ("single_label_classification", "multi_label_classification")
# What a fast tokenizer is built from when a directory has no tokenizer.json.
TOKENIZER_SOURCES = {
    "bert": ("vocab.txt",),
    "distilbert": ("vocab.txt",),
    "mpnet": ("vocab.txt",),
    "roberta": ("vocab.json", "merges.txt"),
    "xlm-roberta": ("sentencepiece.bpe.model",),
    **{f.name: f.tokenizer_sources for f in NEW_FAMILIES.values()},
}
_MAX_LABELS = 100_000
_UNBOUNDED_LENGTH = 1_000_000  # transformers writes model_max_length=1e30 when a tokenizer has no limit


class UnsupportedModelError(SourceError):
    """The directory is well formed, but uses something warmstart does not serve (family, pooling, module...)."""


class MissingFileError(SourceError):
    """A file the directory needs is not there."""


@dataclass(frozen=True)
class DenseLayer:
    """A sentence-transformers Dense module: out = activation(x @ weight.T + bias), after pooling."""

    weights: Path  # its folder's model.safetensors or pytorch_model.bin (keys linear.weight, linear.bias)
    in_features: int
    out_features: int
    bias: bool
    activation: str  # a DENSE_ACTIVATIONS value


@dataclass(frozen=True)
class HFSource:
    """A checked model directory: everything the exporter and the manifest need, read from its JSON files."""

    root: Path  # the directory given
    model_root: Path  # where config.json and the weights are (root, or the Transformer module's folder)
    config: dict[str, Any]
    family: str
    architecture: str
    task: Task
    weights: Path  # model.safetensors, or pytorch_model.bin (read with torch.load(weights_only=True))
    tokenizer_json: Path | None  # None: built from TOKENIZER_SOURCES at pack time
    max_seq_length: int
    content_sha256: str
    pooling: str | None = None  # embedding
    normalize: bool = False  # embedding
    prompts: dict[str, str] = field(default_factory=dict)  # embedding
    default_prompt_name: str | None = None  # embedding
    activation: str | None = None  # rerank: "sigmoid" | "identity"
    labels: tuple[str, ...] = ()  # rerank / classify: id2label in id order
    problem_type: str | None = None  # classify
    dense: tuple[DenseLayer, ...] = ()  # embedding: Dense modules after pooling, in order (multivector: per token)
    late: Any = None  # multivector: PyLate's settings (infra.pack.multivector_source.LateSettings)
    splade: Splade | None = None  # sparse: SpladePooling's settings (infra.pack.sparse_source)
    # rerank by a decoder (infra.pack.lm_rerank): LogitScore's (true, false) token ids; None: a sequence classifier
    logit_score: tuple[int, int | None] | None = None
    hybrid: Any = None  # hybrid (bge-m3): its two heads (infra.pack.hybrid_source.Heads)

    @property
    def dimension(self) -> int:
        """The embedding's width: the last Dense module's output, else the hidden size (sparse: the vocabulary)."""
        if self.task == "sparse":
            return int(self.config["vocab_size"])
        return self.dense[-1].out_features if self.dense else self.hidden_size

    @property
    def hidden_size(self) -> int:
        return int(self.config.get("hidden_size") or self.config["dim"])  # distilbert calls it `dim`

    @property
    def num_heads(self) -> int:
        return int(self.config.get("num_attention_heads") or self.config["n_heads"])

    @property
    def shape(self) -> dict[str, int]:
        """The encoder's sizes the run time budgets activation memory by (handler.core.memory): hidden,
        layers, heads, intermediate; a size the config does not give is left out (the run time estimates it)."""
        keys = CONFIG_KEYS["distilbert" if self.family == "distilbert" else "other"]
        out: dict[str, int] = {"logits": int(self.config["vocab_size"])} if self.task == "sparse" else {}
        for name in ("hidden", "layers", "heads", "intermediate"):
            value = self.config.get(keys[name])
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                out[name] = value
        return out

    @property
    def token_types(self) -> bool:
        """Whether the graph takes token_type_ids: a sentence pair's segments, for families that embed them."""
        return self.family in TOKEN_TYPE_FAMILIES and self.task in ("rerank", "classify")

    @property
    def sequence_classification(self) -> bool:
        return self.task in ("rerank", "classify")


def _read_json(path: Path) -> Any:
    if not os.path.lexists(path):
        raise MissingFileError(f"{path}: missing")
    try:  # a directory, a FIFO (its read would block forever), a device, a symlink loop: refused, never read
        return json.loads(read_source_file(path).decode("utf-8"))
    except SourceError:
        raise  # its own message: what the file is instead
    except OSError as e:
        raise SourceError(f"{path}: unreadable ({e.strerror})") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise SourceError(f"{path}: not valid JSON ({e})") from None
    except RecursionError:  # json's recursive decoder
        raise SourceError(f"{path}: not valid JSON (nested too deeply)") from None


def _optional_json(path: Path) -> Any:
    # lexists: a symlink loop or a dangling link is not "absent" (exists() says False), it is refused
    return _read_json(path) if os.path.lexists(path) else None


def _optional_object(path: Path) -> dict[str, Any]:
    """A JSON object from `path`, {} when there is no such file."""
    value = _optional_json(path)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SourceError(f"{path}: expected a JSON object, found {type(value).__name__}")
    return value


def _module_kind(entry: Any, where: Path) -> tuple[str, str]:
    try:
        type_name, path = str(entry["type"]), str(entry.get("path", ""))
    except (TypeError, KeyError, AttributeError):
        raise SourceError(f"{where}: each module needs a 'type' ({entry!r})"[:300]) from None
    parts = PurePosixPath(path).parts
    if path.startswith("/") or ".." in parts or "\0" in path:  # a module folder outside the model directory
        raise SourceError(f"{where}: module path {path!r} must be a folder inside the model directory")
    if type_name in ST_MODULE_TYPES:
        return ST_MODULE_TYPES[type_name], path
    if type_name in LATE_MODULE_TYPES:  # PyLate's per-token Dense (a ColBERT): infra.pack.multivector_source
        return LATE_MODULE_TYPES[type_name], path
    if not type_name.startswith(_ST_PACKAGE):
        raise UnsupportedModelError(
            f"{where}: module type {type_name!r} is the model's own code, not a sentence-transformers class; "
            f"warmstart never runs it; supported: sentence_transformers.models.Transformer, Pooling, Dense, Normalize "
            f"(as sentence-transformers writes them); {_NATIVE}"[:600]
        )
    return type_name, path  # a stock module warmstart does not serve (Dense...): refused by name below


def _check_no_custom_code(path: Path, config: dict[str, Any]) -> None:
    """`auto_map` sends transformers to code shipped with the model (trust_remote_code): packing the stock
    class of the same model_type instead serves another model (jina-embeddings-v2 as plain BERT: garbage)."""
    auto_map = config.get("auto_map")
    if not auto_map:  # absent, null or empty: nothing to run
        return
    entries = auto_map.items() if isinstance(auto_map, dict) else [("", auto_map)]
    shown = ", ".join(f"{k}: {v[0] if isinstance(v, list) and v else v}".lstrip(": ") for k, v in entries)
    raise UnsupportedModelError(
        f"{path}: auto_map names the model's own code ({shown[:300]}), which warmstart never runs; {_NATIVE}"
    )


# Stock classes outside the family's prefix: gemma3_text's causal LM (a Gemma reranker's) is Gemma3ForCausalLM.
_STOCK_EXTRA = {"gemma3_text": ("Gemma3ForCausalLM",)}


def _check_architectures(path: Path, config: dict[str, Any], family: str) -> None:
    """Each class named in `architectures` must be one of transformers' own for the family (BertModel,
    BertFor...): another name is custom code, even without an auto_map."""
    prefix = ARCH_PREFIX[family]
    stock = re.compile(rf"{prefix}(Model|LMHeadModel|For[A-Z][A-Za-z]*)")
    for name in config.get("architectures") or []:
        if not stock.fullmatch(str(name)) and str(name) not in _STOCK_EXTRA.get(family, ()):
            raise UnsupportedModelError(
                f"{path}: architecture {name!r} is not a stock transformers {family} class; supported: "
                f"{prefix}Model, {prefix}For* (a custom class is the model's own code, never run; {_NATIVE})"[:600]
            )


def read_source(root: Path, task: str = "auto", pooling: str | None = None) -> HFSource:
    """Read and check the model directory `root`; `task` is "auto" or one of embedding, rerank, classify.
    `pooling` (with task embedding): a bare encoder directory's pooling, one of BARE_POOLING_MODES."""
    if task not in TASK_CHOICES:
        raise SourceError(f"task {task!r}; valid: {', '.join(TASK_CHOICES)}")
    if pooling is not None and pooling not in BARE_POOLING_MODES:
        raise SourceError(f"pooling {pooling!r}; valid: {', '.join(BARE_POOLING_MODES)}")
    if pooling is not None and task != "embedding":
        raise SourceError(f"--pooling {pooling} is for --task embedding (a bare encoder directory); {_BARE_FIX}")
    root = Path(root)
    if not root.is_dir():
        raise MissingFileError(f"{root}: not a directory (pass a local model directory; nothing is downloaded)")

    modules = _optional_json(root / "modules.json")
    kinds: list[tuple[str, str]] = []
    splade: Splade | None = None
    if modules is not None and not (isinstance(modules, list) and modules):
        raise SourceError(f"{root / 'modules.json'}: expected a non-empty list of modules")
    if modules is not None and is_sparse(modules, _optional_object(root / "config_sentence_transformers.json")):
        found = [_module_kind(m, root / "modules.json") for m in modules]  # the model's own code: refused
        kinds, splade = sparse_modules(root, found, _read_json, UnsupportedModelError)
    elif modules is not None:
        kinds = [_module_kind(m, root / "modules.json") for m in modules]
        unsupported = [k for k, _ in kinds if k not in SUPPORTED_MODULES]
        if unsupported:
            raise UnsupportedModelError(
                f"{root / 'modules.json'}: module {', '.join(unsupported)} is not supported; "
                f"supported sentence-transformers modules: {', '.join(SUPPORTED_MODULES)}"
            )
        if kinds[0][0] != "Transformer":
            raise UnsupportedModelError(
                f"{root / 'modules.json'}: the first module must be a Transformer, not {kinds[0][0]}"
            )
    model_root = root / kinds[0][1] if kinds else root

    config = _read_json(model_root / "config.json")
    if not isinstance(config, dict):
        raise SourceError(f"{model_root / 'config.json'}: expected an object")
    model_type = str(config.get("model_type", ""))
    family = FAMILIES.get(model_type)
    if family is None and model_type in CUSTOM_ONLY:
        raise UnsupportedModelError(
            f"{model_root / 'config.json'}: model_type {model_type!r}: {CUSTOM_ONLY[model_type]}; warmstart never "
            f"runs a model's own code; supported families: {', '.join(FAMILIES)}"
        )
    if family is None:
        raise UnsupportedModelError(
            f"{model_root / 'config.json'}: model_type {model_type!r} is not supported; "
            f"supported families: {', '.join(FAMILIES)}"
        )
    check_config(config, model_root / "config.json", family, POSITION_OFFSET.get(family, 0))
    _check_no_custom_code(model_root / "config.json", config)
    _check_architectures(model_root / "config.json", config, family)
    _check_labels(config, model_root / "config.json")
    architectures = config.get("architectures") or []
    architecture = str(architectures[0]) if architectures else f"{ARCH_PREFIX[family]}Model"
    st_config = _optional_object(model_root / "sentence_bert_config.json")
    st_meta = _optional_object(root / "config_sentence_transformers.json")
    logit_score = None
    if any(k == "LogitScore" for k, _ in kinds):  # a decoder reranker: its own checks, one line each
        from infra.pack.lm_rerank import check_reranker

        logit_score = check_reranker(root, kinds, family, architecture, config)
        if task not in ("auto", "rerank"):
            raise UnsupportedModelError(f"{root}: a decoder reranker (LogitScore) packs as --task rerank only")
    new = NEW_FAMILIES.get(family)
    if new is not None and new.reranker_only and logit_score is None:
        raise UnsupportedModelError(
            f"{model_root / 'config.json'}: a {family} model packs only as a decoder reranker (a sentence-transformers "
            f"CrossEncoder directory: Transformer -> LogitScore over {new.prefix}ForCausalLM); its other tasks are "
            "not proved against their reference library"
        )
    is_cross_encoder = (
        logit_score is not None
        or st_meta.get("model_type") == "CrossEncoder"
        or st_config.get("transformer_task") == "sequence-classification"
        or architecture.endswith("ForSequenceClassification")
    )
    chosen: Task
    late = False
    if splade is not None or task == "sparse":
        chosen = _check_sparse(root, task, splade, pooling, architecture)
    else:
        has_pooling = any(k == "Pooling" for k, _ in kinds)
        if pooling is not None and (has_pooling or is_cross_encoder):
            what = "sets its pooling in modules.json" if has_pooling else f"is a {architecture}"
            raise UnsupportedModelError(
                f"{root}: --pooling is for a bare encoder directory (no modules.json); this one {what}: "
                "leave --pooling out"
            )
        has_pooling = has_pooling or pooling is not None
        late = is_late_interaction(kinds, st_meta)
        if late and task not in ("auto", "multivector"):
            raise UnsupportedModelError(f"{root}: --task {task}; this is a PyLate (ColBERT) model: --task multivector")
        if task == "multivector" and not late:
            raise UnsupportedModelError(
                f"{root}: --task multivector needs a PyLate (ColBERT) directory (modules.json Transformer -> "
                "pylate.models.Dense.Dense, config_sentence_transformers.json with query_prefix ...)"
            )
        detected = "multivector" if late else _detect_task(root, has_pooling, is_cross_encoder, config, architecture)
        chosen = detected if task == "auto" else task  # type: ignore[assignment]
        if not late:
            _check_task(
                root, "embedding" if chosen == "hybrid" else chosen, has_pooling, is_cross_encoder, config, architecture
            )
        chosen = _check_hybrid(root, task, chosen)
        if (
            is_cross_encoder
            and logit_score is None
            and architecture != f"{ARCH_PREFIX[family]}ForSequenceClassification"
        ):
            raise UnsupportedModelError(
                f"{model_root / 'config.json'}: architecture {architecture!r} is not supported for {chosen}; "
                f"supported: {', '.join(f'{p}ForSequenceClassification' for p in ARCH_PREFIX.values())}"
            )

    weights = _weights(model_root)
    if weights.suffix == ".safetensors":  # a pytorch_model.bin: its staged safetensors copy, in hf_pack
        check_checkpoint(safetensors_shapes(weights), weights, model_root / "config.json", config, family)
    tokenizer_json = _tokenizer(root, model_root, family)
    for where in dict.fromkeys(
        (model_root, root)
    ):  # a tokenizer class of the model's own: not what tokenizer.json does
        _check_no_custom_code(where / "tokenizer_config.json", _optional_object(where / "tokenizer_config.json"))
    if tokenizer_json is not None:
        check_tokenizer_json(tokenizer_json, config["vocab_size"] if is_int(config.get("vocab_size")) else None)
    max_seq = _max_seq_length(model_root, config, family, st_config)
    fields: dict[str, Any] = {}
    if chosen == "multivector":
        positions = int(config["max_position_embeddings"]) - POSITION_OFFSET.get(family, 0)
        fields["late"] = late_settings(root, kinds, st_meta, positions)
        fields["dense"] = _dense_layers(root, kinds, int(config.get("hidden_size") or config.get("dim") or 0))
        max_seq = max(fields["late"].query_length, fields["late"].document_length)
        architecture = f"{ARCH_PREFIX[family]}Model" if not architecture.endswith("Model") else architecture
    elif chosen == "sparse":
        fields.update(splade=splade, **_prompts(root, st_meta))
    elif chosen in ("embedding", "hybrid"):
        if kinds:
            fields.update(_embedding_fields(root, kinds, config, st_meta))
        else:  # a bare encoder with --pooling: that pooling, unit-length vectors (TEI's default)
            fields.update(pooling=pooling, normalize=True)
        if chosen == "hybrid":  # FlagEmbedding's dense vector is the CLS token's
            if fields.get("pooling") != "cls":
                raise UnsupportedModelError(
                    f"{root}: hybrid (bge-m3) pooling {fields.get('pooling')!r}; supported: cls"
                )
            fields["hybrid"] = hybrid_heads(root, int(config["hidden_size"]))
        architecture = f"{ARCH_PREFIX[family]}Model" if not architecture.endswith("Model") else architecture
    else:
        labels = _labels(model_root, config)
        fields["labels"] = labels
        if chosen == "rerank":
            fields["activation"] = _activation(root, model_root, config, st_meta, len(labels))
            fields["logit_score"] = logit_score
        else:
            fields["problem_type"] = _problem_type(model_root, config, len(labels))
    hashed = [model_root / "config.json", weights]
    hashed += [p for p in _tokenizer_files(root, model_root, tokenizer_json, family) if p.is_file()]
    hashed += [p for p in _st_files(root, kinds) if p.is_file()]
    hashed += [layer.weights for layer in fields.get("dense", ())]
    hashed += [root / name for name in HYBRID_HEADS] if chosen == "hybrid" else []
    if splade is not None and splade.static_query is not None:
        hashed += check_static_query(root, splade, tokenizer_json, int(config["vocab_size"]), UnsupportedModelError)
    return HFSource(
        root=root,
        model_root=model_root,
        config=config,
        family=family,
        architecture=architecture,
        task=chosen,
        weights=weights,
        tokenizer_json=tokenizer_json,
        max_seq_length=max_seq,
        # A bare encoder's pooling is chosen on the command line, not read from a file: part of the version too.
        content_sha256=content_hash(root, hashed, b"" if pooling is None else f"pooling={pooling}".encode()),
        **fields,
    )


def _check_hybrid(root: Path, task: str, chosen: Task) -> Task:
    """bge-m3's layout (an embedding directory with FlagEmbedding's two heads beside it) packs as task hybrid:
    `auto` picks it; --task embedding packs its dense output alone."""
    if task == "hybrid" and not is_hybrid(root):
        raise UnsupportedModelError(
            f"{root}: --task hybrid needs bge-m3's layout (a sentence-transformers directory with "
            f"{' and '.join(HYBRID_HEADS)} beside it)"
        )
    return "hybrid" if chosen == "embedding" and task in ("auto", "hybrid") and is_hybrid(root) else chosen


def _check_sparse(root: Path, task: str, splade: Splade | None, pooling: str | None, architecture: str) -> Task:
    """A SparseEncoder directory packs as task sparse only, from a *ForMaskedLM checkpoint."""
    if splade is None:
        raise UnsupportedModelError(
            f"{root}: --task sparse needs a sentence-transformers SparseEncoder directory (modules.json: "
            f"{SPARSE_SUPPORTED}); this one is {architecture}"
        )
    if task not in ("auto", "sparse"):
        raise UnsupportedModelError(f"{root}: a SparseEncoder directory packs as --task sparse, not {task}")
    if pooling is not None:
        raise UnsupportedModelError(f"{root}: --pooling is for a bare encoder directory; leave it out for SPLADE")
    if not architecture.endswith("ForMaskedLM"):
        raise UnsupportedModelError(
            f"{root}: SparseEncoder transformer architecture {architecture!r}; supported: a *ForMaskedLM model"
        )
    return "sparse"


def _detect_task(
    root: Path, has_pooling: bool, is_cross_encoder: bool, config: dict[str, Any], architecture: str
) -> Task:
    if has_pooling:
        return "embedding"
    if is_cross_encoder:
        return "rerank" if int(config.get("num_labels") or len(config.get("id2label") or {}) or 1) == 1 else "classify"
    raise UnsupportedModelError(
        f"{root}: {architecture} is neither a sentence-transformers embedder (modules.json with a Pooling module) "
        f"nor a *ForSequenceClassification model, so the task and pooling are unknown; for embeddings, {_BARE_FIX}; "
        "supported: a "
        "sentence-transformers model directory (embedding), a cross-encoder (rerank), a sequence classifier (classify)"
    )


def _check_task(
    root: Path, task: Task, has_pooling: bool, is_cross_encoder: bool, config: dict[str, Any], architecture: str
) -> None:
    if task == "embedding" and not has_pooling and is_cross_encoder:
        raise UnsupportedModelError(
            f"{root}: --task embedding needs a sentence-transformers directory (modules.json with a Pooling "
            f"module, 1_Pooling/config.json) or a bare encoder; this one is {architecture}"
        )
    if task == "embedding" and not has_pooling:
        raise UnsupportedModelError(
            f"{root}: --task embedding needs a pooling: this directory has no modules.json (architecture "
            f"{architecture}); {_BARE_FIX}, or use a sentence-transformers directory (modules.json with a Pooling "
            "module)"
        )
    if task in ("rerank", "classify") and not is_cross_encoder:
        raise UnsupportedModelError(
            f"{root}: --task {task} needs a *ForSequenceClassification model (a cross-encoder or classifier); "
            f"this one is {architecture}"
        )
    if task == "rerank":
        n = len(config.get("id2label") or {}) or int(config.get("num_labels") or 1)
        if n != 1:
            raise UnsupportedModelError(
                f"{root}: --task rerank needs a cross-encoder with one output label (one score per pair); "
                f"this model has {n} labels (use --task classify)"
            )


def _weights(model_root: Path) -> Path:
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (model_root / name).is_file():
            return model_root / name
    if (model_root / "model.safetensors.index.json").is_file() or (
        model_root / "pytorch_model.bin.index.json"
    ).is_file():
        raise UnsupportedModelError(
            f"{model_root}: sharded checkpoints are not supported; "
            "supported: one model.safetensors or pytorch_model.bin"
        )
    raise MissingFileError(f"{model_root}: no weights; expected model.safetensors (or pytorch_model.bin)")


def _tokenizer(root: Path, model_root: Path, family: str) -> Path | None:
    for where in (root, model_root):
        if (where / "tokenizer.json").is_file():
            return where / "tokenizer.json"
    needed = TOKENIZER_SOURCES[family]
    for where in (model_root, root):
        if all((where / n).is_file() for n in needed):
            return None
    raise MissingFileError(
        f"{root}: no tokenizer.json, and not the files a {family} fast tokenizer is built from ({', '.join(needed)})"
    )


def _tokenizer_files(root: Path, model_root: Path, tokenizer_json: Path | None, family: str) -> list[Path]:
    names = ["tokenizer_config.json", "special_tokens_map.json"]
    names += ["tokenizer.json"] if tokenizer_json is not None else list(TOKENIZER_SOURCES[family])
    found: dict[str, Path] = {}
    for where in (model_root, root):
        for n in names:
            if (where / n).is_file():
                found.setdefault(n, where / n)
    return list(found.values())


def _st_files(root: Path, kinds: list[tuple[str, str]]) -> list[Path]:
    files = [root / "modules.json", root / "config_sentence_transformers.json"]
    for kind, path in kinds:
        folder = root / path
        files.append(folder / ("sentence_bert_config.json" if kind == "Transformer" else "config.json"))
    return files


def _max_seq_length(model_root: Path, config: dict[str, Any], family: str, st_config: dict[str, Any]) -> int:
    """sentence_bert_config's max_seq_length, else the tokenizer's model_max_length (where sentence-transformers
    6 saves it), else the model's positions; never more than the positions allow."""
    positions = int(config["max_position_embeddings"]) - POSITION_OFFSET.get(family, 0)
    candidates = [st_config.get("max_seq_length")]
    tok_config = _optional_object(model_root / "tokenizer_config.json")
    candidates.append(tok_config.get("model_max_length"))
    for value in candidates:
        if isinstance(value, (int, float)) and 0 < value < _UNBOUNDED_LENGTH:
            return min(int(value), positions)
    return positions


def _embedding_fields(
    root: Path, kinds: list[tuple[str, str]], config: dict[str, Any], st_meta: dict[str, Any]
) -> dict[str, Any]:
    pooling_paths = [p for k, p in kinds if k == "Pooling"]
    order = [k for k, _ in kinds]
    rest = order[2:]
    while rest and rest[0] == "Dense":
        rest = rest[1:]
    if len(pooling_paths) != 1 or order[:2] != ["Transformer", "Pooling"] or rest not in ([], ["Normalize"]):
        raise UnsupportedModelError(
            f"{root / 'modules.json'}: modules {' -> '.join(order)}; supported: Transformer -> Pooling "
            "(-> Dense ...) (-> Normalize)"
        )
    pool_path = root / pooling_paths[0] / "config.json"
    pool = _read_json(pool_path)
    if not isinstance(pool, dict):
        raise SourceError(f"{pool_path}: expected a JSON object, found {type(pool).__name__}")
    mode = pool.get("pooling_mode")
    modes: list[str]
    if mode is None:
        modes = [name for key, name in _LEGACY_POOLING_KEYS.items() if pool.get(key)]
    elif isinstance(mode, str) or (isinstance(mode, list) and all(isinstance(m, str) for m in mode)):
        modes = [mode] if isinstance(mode, str) else list(mode)
    else:
        raise SourceError(f"{pool_path}: pooling_mode {mode!r}; expected a mode name")
    if len(modes) != 1:
        raise UnsupportedModelError(
            f"{pool_path}: pooling {' + '.join(modes) or 'none'}; "
            f"exactly one mode is supported: {', '.join(POOLING_MODES)}"
        )
    if modes[0] not in POOLING_MODES:
        raise UnsupportedModelError(
            f"{pool_path}: pooling mode {modes[0]!r} is not supported; supported: {', '.join(POOLING_MODES)}"
        )
    if pool.get("include_prompt", True) is False:
        raise UnsupportedModelError(
            f"{pool_path}: include_prompt=false (prompt tokens left out of pooling) is not supported; "
            "supported: include_prompt=true"
        )
    width = pool.get("embedding_dimension", pool.get("word_embedding_dimension"))
    hidden = int(config.get("hidden_size") or config.get("dim") or 0)
    if width is not None and (not is_int(width) or width != hidden):
        raise SourceError(f"{pool_path}: embedding dimension {width} differs from the model's hidden size {hidden}")
    dense = _dense_layers(root, kinds, hidden)
    return {
        "dense": dense,
        "pooling": modes[0],
        "normalize": any(k == "Normalize" for k, _ in kinds),
        **_prompts(root, st_meta),
    }


def _prompts(root: Path, st_meta: dict[str, Any]) -> dict[str, Any]:
    """config_sentence_transformers.json's prompts (name -> text prepended) and default prompt name, checked."""
    prompts = st_meta.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(v, str) for v in prompts.values()):
        raise SourceError(f"{root / 'config_sentence_transformers.json'}: prompts must map names to strings")
    default_prompt = st_meta.get("default_prompt_name")
    if default_prompt is not None and (not isinstance(default_prompt, str) or default_prompt not in prompts):
        raise SourceError(
            f"{root / 'config_sentence_transformers.json'}: default_prompt_name {default_prompt!r} is not among "
            f"the prompts ({', '.join(prompts) or 'none'})"
        )
    return {
        "prompts": {str(k): v for k, v in prompts.items()},
        "default_prompt_name": default_prompt,
    }


def _dense_layers(root: Path, kinds: list[tuple[str, str]], width: int) -> tuple[DenseLayer, ...]:
    """Each Dense module's config (sizes chained from the pooled width, a known activation, no residual) and
    weights file; the tensors themselves are checked when the export loads them."""
    layers = []
    for kind, path in kinds:
        if kind not in ("Dense", LATE_DENSE):
            continue
        folder = root / path
        where = folder / "config.json"
        config = _read_json(where)
        if not isinstance(config, dict):
            raise SourceError(f"{where}: expected a JSON object, found {type(config).__name__}")
        n_in, n_out, bias = config.get("in_features"), config.get("out_features"), config.get("bias", True)
        if not (is_int(n_in) and is_int(n_out) and 0 < n_in <= 1 << 20 and 0 < n_out <= 1 << 20):
            raise SourceError(f"{where}: in_features {n_in!r}, out_features {n_out!r}; expected sizes")
        if n_in != width:
            raise SourceError(f"{where}: in_features {n_in} differs from the {width} values it is given")
        if not isinstance(bias, bool):
            raise SourceError(f"{where}: bias {bias!r}; expected true or false")
        if config.get("use_residual"):
            raise UnsupportedModelError(f"{where}: use_residual=true is not supported; supported: a plain Dense")
        # PyLate's Dense reads and writes every token's vector (its default activation: none).
        vectors = "token_embeddings" if kind == LATE_DENSE else "sentence_embedding"
        for key in ("module_input_name", "module_output_name"):
            if config.get(key) not in (None, vectors):
                raise UnsupportedModelError(f"{where}: {key} {config[key]!r}; supported: {vectors}")
        default = "torch.nn.modules.linear.Identity" if kind == LATE_DENSE else "torch.nn.modules.activation.Tanh"
        activation = config.get("activation_function", default)
        if activation not in DENSE_ACTIVATIONS:
            raise UnsupportedModelError(
                f"{where}: activation_function {activation!r} is not supported; supported: "
                f"{', '.join(sorted(DENSE_ACTIVATIONS))}"[:600]
            )
        weights = next((folder / n for n in ("model.safetensors", "pytorch_model.bin") if (folder / n).is_file()), None)
        if weights is None:
            raise MissingFileError(f"{folder}: no weights; expected model.safetensors (or pytorch_model.bin)")
        layers.append(DenseLayer(weights, n_in, n_out, bias, DENSE_ACTIVATIONS[str(activation)]))
        width = n_out
    return tuple(layers)


def _check_labels(config: dict[str, Any], path: Path) -> None:
    num_labels, id2label = config.get("num_labels"), config.get("id2label")
    if num_labels is not None and (not is_int(num_labels) or not 0 < num_labels <= _MAX_LABELS):
        raise SourceError(f"{path}: num_labels {num_labels!r}; expected an integer in 1..{_MAX_LABELS}")
    if id2label is not None and (not isinstance(id2label, dict) or len(id2label) > _MAX_LABELS):
        raise SourceError(f"{path}: id2label must be an object of at most {_MAX_LABELS} label ids -> names")


def _labels(model_root: Path, config: dict[str, Any]) -> tuple[str, ...]:
    id2label = config.get("id2label") or {}
    n = int(config.get("num_labels") or len(id2label) or 1)
    try:
        by_id = {int(k): str(v) for k, v in id2label.items()}
    except (TypeError, ValueError):
        raise SourceError(f"{model_root / 'config.json'}: id2label keys must be label ids ({id2label!r})") from None
    if by_id and sorted(by_id) != list(range(len(by_id))):
        raise SourceError(f"{model_root / 'config.json'}: id2label ids are not 0..{len(by_id) - 1}")
    return tuple(by_id[i] for i in range(len(by_id))) if by_id else tuple(f"LABEL_{i}" for i in range(n))


def _activation(root: Path, model_root: Path, config: dict[str, Any], st_meta: dict[str, Any], num_labels: int) -> str:
    """The activation `CrossEncoder.predict` applies: the one the model saved, else sigmoid for one label."""
    st_block = config.get("sentence_transformers") or {}
    saved = (
        st_meta.get("activation_fn")
        or (st_block.get("activation_fn") if isinstance(st_block, dict) else None)
        or config.get("sbert_ce_default_activation_function")
    )
    if saved is None:
        return "sigmoid" if num_labels == 1 else "identity"
    if not isinstance(saved, str) or saved not in ACTIVATIONS:
        raise UnsupportedModelError(
            f"{root}: cross-encoder activation {saved!r} is not supported; supported: {', '.join(sorted(ACTIVATIONS))}"
        )
    return ACTIVATIONS[str(saved)]


def _problem_type(model_root: Path, config: dict[str, Any], num_labels: int) -> str:
    problem = config.get("problem_type")
    if problem is None:
        # transformers' own rule for a missing problem_type at inference: softmax over several labels. One label
        # alone has nothing to softmax against: its probability is a sigmoid.
        return "single_label_classification" if num_labels > 1 else "multi_label_classification"
    if problem not in PROBLEM_TYPES:
        raise UnsupportedModelError(
            f"{model_root / 'config.json'}: problem_type {problem!r} is not supported for classify; "
            f"supported: {', '.join(PROBLEM_TYPES)} (a one-label regression head packs with --task rerank)"
        )
    return str(problem)


def content_hash(root: Path, files: list[Path], extra: bytes = b"") -> str:
    """SHA-256 over the files the pack reads (relative names and bytes) and `extra` (choices made outside the
    files): the same model gives the same version."""
    digest = hashlib.sha256(extra)
    for path in sorted(set(files)):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        with open_source(path) as f:
            while block := f.read(1 << 20):
                digest.update(block)
        digest.update(b"\0")
    return digest.hexdigest()
