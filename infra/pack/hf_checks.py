"""Structural checks of a model directory's files for `infra.pack.hf_source.read_source`: the numbers in
config.json, the safetensors header against the file's size and the config (layer count, tables, implied
parameters: before any model is built), tokenizer.json's shape; and transformers' loading info of the weights
(a missing, extra or misshapen tensor) for `infra.pack.hf_export.load_torch_model`.

Each malformed input is a `SourceError` naming the file and what is wrong, raised before anything is written:
without these, a negative `vocab_size`, a truncated weights file or a tokenizer.json without `added_tokens`
surfaced as a traceback from deep inside torch, safetensors or transformers (issue 24, item 10).
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any, BinaryIO, TypeGuard

from infra.pack.families import NEW_FAMILIES

# config.json keys per family (distilbert names them its own way) -> the largest value taken as plausible:
# every real checkpoint is far below (xlm-roberta's 250,002 tokens; 4,096 hidden; 48 layers).
_LIMITS = {"vocab": 10_000_000, "hidden": 1 << 16, "layers": 1024, "heads": 1024, "intermediate": 1 << 18}
_KEYS = {
    "distilbert": dict(vocab="vocab_size", hidden="dim", layers="n_layers", heads="n_heads", intermediate="hidden_dim"),
    "other": dict(
        vocab="vocab_size",
        hidden="hidden_size",
        layers="num_hidden_layers",
        heads="num_attention_heads",
        intermediate="intermediate_size",
    ),
}
CONFIG_KEYS = _KEYS  # the sizes' names per family, for the manifest's `shape` (hf_source)
MAX_POSITIONS = 1 << 20
_DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip
_MAX_HEADER = 100 << 20  # the safetensors library's own limit on the JSON header


class SourceError(ValueError):
    """A model directory `warmstart pack --from` refuses (raised before anything is written)."""


def _error(message: str) -> Exception:
    return SourceError(message)


def open_source(path: Path) -> BinaryIO:
    """A source file opened for reading, refused (SourceError) unless it is a regular file: a FIFO would block the
    read forever, /dev/zero would never end it. Opened non-blocking and checked on the descriptor
    (handler.core.manifest.open_regular): no window between the check and the read."""
    from handler.core.errors import ModelLoadError
    from handler.core.manifest import open_regular

    try:
        return os.fdopen(open_regular(path), "rb")
    except ModelLoadError as e:
        raise SourceError(str(e)) from None


def read_source_file(path: Path) -> bytes:
    with open_source(path) as f:
        return f.read()


def one_line(error: BaseException) -> str:
    """A library's exception as one short line: its type and its message, whitespace folded."""
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text[:300]}"


def config_refusal(path: Path, config: dict[str, Any], error: BaseException, doing: str) -> SourceError:
    """A config.json whose fields transformers accepts but cannot build a model from (an activation or rope type
    it has no entry for: a KeyError; `query_pre_attn_scalar: 0`: a ZeroDivisionError), as the pack's one-line
    refusal, naming the fields where it can: those the failing line of transformers reads (`config.X`, innermost
    first), else for a KeyError the fields holding the missing key."""
    import re
    import traceback

    fields: list[str] = []
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        fields = [f for f in dict.fromkeys(re.findall(r"config\.(\w+)", frame.line or "")) if f in config]
        if fields:
            break
    if not fields and isinstance(error, KeyError) and error.args:
        wanted = error.args[0]
        for key, value in config.items():
            if value == wanted and not isinstance(value, bool):
                fields.append(key)
            elif isinstance(value, dict):  # one level down: rope_scaling.rope_type
                fields += [f"{key}.{k}" for k, v in value.items() if v == wanted and not isinstance(v, bool)]
    where = f" (check {', '.join(fields)})" if fields else ""
    return SourceError(f"{path}: transformers cannot {doing} from it{where}: {one_line(error)}")


def is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def check_config(config: dict[str, Any], path: Path, family: str, position_offset: int) -> None:
    """The sizes the exporter and the torch encoder build from: integers in range, heads dividing hidden."""
    keys = _KEYS["distilbert" if family == "distilbert" else "other"]
    values: dict[str, int] = {}
    for what, key in keys.items():
        value = config.get(key)
        if not is_int(value) or not 0 < value <= _LIMITS[what]:
            shown = "missing" if key not in config else repr(value)
            raise _error(f"{path}: {key} {shown}; expected an integer in 1..{_LIMITS[what]}")
        values[what] = value
    if values["hidden"] % values["heads"]:
        raise _error(f"{path}: hidden size {values['hidden']} is not a multiple of {values['heads']} heads")
    positions = config.get("max_position_embeddings")
    if not is_int(positions) or not position_offset < positions <= MAX_POSITIONS:
        shown = "missing" if "max_position_embeddings" not in config else repr(positions)
        raise _error(
            f"{path}: max_position_embeddings {shown}; expected an integer in {position_offset + 1}..{MAX_POSITIONS}"
        )
    pad = config.get("pad_token_id")
    if pad is not None and (not is_int(pad) or not 0 <= pad < values["vocab"]):
        raise _error(f"{path}: pad_token_id {pad!r}; expected a token id in 0..{values['vocab'] - 1}")
    architectures = config.get("architectures")
    if architectures is not None and not (
        isinstance(architectures, list) and all(isinstance(a, str) for a in architectures)
    ):
        raise _error(f"{path}: architectures {architectures!r}; expected a list of class names")


def safetensors_shapes(path: Path) -> dict[str, list[int]]:
    """Tensor name -> shape from a safetensors file, after checking its header the way the library reads it:
    a sane header length, known dtypes, every tensor's bytes inside the file, the data covered exactly."""
    with open_source(path) as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(8)
        if len(head) < 8:
            raise _error(f"{path}: not a safetensors file ({size} bytes, shorter than its 8-byte header length)")
        length = int.from_bytes(head, "little")
        if length > min(_MAX_HEADER, size - 8):
            raise _error(f"{path}: header length {length} is past the end of the file ({size} bytes): truncated?")
        raw = f.read(length)
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise _error(f"{path}: the safetensors header is not valid JSON ({type(e).__name__})") from None
    if not isinstance(header, dict):
        raise _error(f"{path}: the safetensors header is not an object")
    data_size = size - 8 - length
    spans, shapes = [], {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end, shape = _tensor_entry(path, name, entry, data_size)
        spans.append((begin, end))
        shapes[name] = shape
    covered = 0
    for begin, end in sorted(spans):
        if begin != covered:
            raise _error(f"{path}: tensor data overlaps or leaves a gap at byte {min(begin, covered)}")
        covered = end
    if covered != data_size:
        raise _error(f"{path}: tensors cover {covered} of the file's {data_size} data bytes: truncated or padded?")
    return shapes


def _tensor_entry(path: Path, name: str, entry: Any, data_size: int) -> tuple[int, int, list[int]]:
    if not isinstance(entry, dict):
        raise _error(f"{path}: tensor {name!r}: expected an object in the header")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in _DTYPE_BYTES:
        raise _error(f"{path}: tensor {name!r}: dtype {dtype!r}; known: {', '.join(_DTYPE_BYTES)}")
    if not isinstance(shape, list) or not all(is_int(d) and d >= 0 for d in shape):
        raise _error(f"{path}: tensor {name!r}: shape {shape!r} is not a list of sizes")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(is_int(o) for o in offsets)):
        raise _error(f"{path}: tensor {name!r}: data_offsets {offsets!r} is not [begin, end]")
    begin, end = offsets
    if not 0 <= begin <= end <= data_size:
        raise _error(f"{path}: tensor {name!r}: bytes {begin}..{end} are outside the file's {data_size} data bytes")
    if end - begin != math.prod(shape) * _DTYPE_BYTES[dtype]:
        raise _error(f"{path}: tensor {name!r}: {end - begin} bytes for shape {shape} of {dtype}")
    return begin, end, shape


def check_embeddings(
    shapes: dict[str, list[int]],
    path: Path,
    config_path: Path,
    hidden: int,
    vocab: int,
    table: str = "embeddings.word_embeddings.weight",
) -> None:
    """The word embedding table must be what config.json says: vocab_size x hidden (a config that does not
    describe its weights would otherwise fail inside transformers, or pack a model with random weights)."""
    tables = [shape for name, shape in shapes.items() if name == table or name.endswith(f".{table}")]
    if len(tables) != 1:
        raise _error(f"{path}: expected one {table} tensor, found {len(tables)}")
    if tables[0] != [vocab, hidden]:
        raise _error(
            f"{config_path}: vocab_size {vocab} x hidden size {hidden} does not match the weights' "
            f"embedding table {tables[0]} in {path.name}"
        )


_LAYER = re.compile(r"(?:^|.*\.)(?:encoder|transformer)\.layer\.(\d+)\..+")  # transformer: distilbert's name
_FFN_IN = re.compile(r"(?:^|.*\.)(?:encoder|transformer)\.layer\.\d+\.(?:intermediate\.dense|ffn\.lin1)\.weight")
_TYPE_VOCAB_FAMILIES = ("bert", "roberta", "xlm-roberta")


def check_checkpoint(
    shapes: dict[str, list[int]], path: Path, config_path: Path, config: dict[str, Any], family: str
) -> None:
    """config.json against the tensors the checkpoint holds (its safetensors header), before transformers builds
    a model of the config's size: the embedding table (vocab x hidden), the layer count (the largest layer index
    in the tensor names, + 1), the feed-forward and position tables, then the parameters the config implies at
    the least against the values present (num_hidden_layers 100000 with a 100 KB checkpoint ran for minutes and
    gigabytes; now a refusal)."""
    keys = _KEYS["distilbert" if family == "distilbert" else "other"]
    hidden, vocab = int(config[keys["hidden"]]), int(config[keys["vocab"]])
    layers, intermediate = int(config[keys["layers"]]), int(config[keys["intermediate"]])
    positions = int(config["max_position_embeddings"])
    new = NEW_FAMILIES.get(family)
    # ELECTRA's embeddings are narrower than its layers (embedding_size, projected up).
    width = int(config.get("embedding_size") or hidden) if family == "electra" else hidden
    if new is not None:
        check_embeddings(shapes, path, config_path, width, vocab, new.embedding_table)
    else:
        check_embeddings(shapes, path, config_path, hidden, vocab)

    layer = new.layer if new is not None else _LAYER
    present = sorted({int(m.group(1)) for name in shapes if (m := layer.fullmatch(name))})
    if present != list(range(len(present))):
        gap = next(i for i in range(len(present) + 1) if i not in present)
        raise _error(f"{path}: no tensors for layer {gap} (layers {', '.join(map(str, present[:10]))} present)")
    if layers != len(present):
        held = f"layer 0..{len(present) - 1}" if present else "no encoder.layer.N tensors"
        raise _error(f"{config_path}: {keys['layers']} {layers}, but {path.name} holds {len(present)} layers ({held})")
    for name, shape in sorted(shapes.items()):
        if _FFN_IN.fullmatch(name) and shape != [intermediate, hidden]:
            raise _error(
                f"{config_path}: {keys['intermediate']} {intermediate} x hidden size {hidden} does not match the "
                f"weights' {name} {shape} in {path.name}"
            )
    for name, shape in sorted(shapes.items()):
        if name.endswith("embeddings.position_embeddings.weight") and shape != [positions, width]:
            raise _error(
                f"{config_path}: max_position_embeddings {positions} x hidden size {width} does not match the "
                f"weights' {name} {shape} in {path.name}"
            )

    if new is not None:  # rotary positions, grouped key/value heads, gated or fused projections: the word table
        # and each layer's feed-forward (two hidden x intermediate matrices at the least) bound them all
        implied = vocab * width + layers * 2 * hidden * intermediate
    else:
        implied = _implied_parameters(config, family, hidden, vocab, layers, intermediate, positions)
    values = sum(math.prod(shape) for shape in shapes.values())
    if implied > values:
        raise _error(
            f"{config_path}: implies at least {implied:,} parameters, but {path.name} holds {values:,} values "
            f"({path.stat().st_size:,} bytes)"
        )


def _implied_parameters(
    config: dict[str, Any], family: str, hidden: int, vocab: int, layers: int, intermediate: int, positions: int
) -> int:
    """A lower bound on the parameters transformers allocates for `config`: the embedding tables, and per layer
    the attention's four hidden x hidden projections and the feed-forward's two hidden x intermediate ones."""
    implied = (vocab + positions) * hidden + layers * (4 * hidden * hidden + 2 * hidden * intermediate)
    if family in _TYPE_VOCAB_FAMILIES:
        types = config.get("type_vocab_size", 2)
        implied += types * hidden if is_int(types) and types > 0 else 0
    if family == "mpnet":  # the relative attention bias table: buckets x heads
        buckets, heads = config.get("relative_attention_num_buckets", 32), config["num_attention_heads"]
        implied += buckets * heads if is_int(buckets) and buckets > 0 else 0
    return implied


def check_tokenizer_json(path: Path, rows: int | None = None) -> None:
    """What transformers' fast tokenizer and `tokenizers` both need: an object with a model and a list of added
    tokens, that `tokenizers` itself loads; and, given the model's embedding rows (config's `vocab_size`), no
    token id past them: such a token (an added `<eos>` at id 130 of a 130-row table) packs, then fails every
    request that holds it."""
    from tokenizers import Tokenizer

    try:
        text = read_source_file(path).decode("utf-8")
        raw = json.loads(text)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise _error(f"{path}: not valid JSON ({type(e).__name__})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("model"), dict):
        raise _error(f"{path}: expected a tokenizer object with a 'model'")
    added = raw.get("added_tokens")
    if not isinstance(added, list) or not all(isinstance(t, dict) for t in added):
        raise _error(f"{path}: 'added_tokens' {'missing' if added is None else 'malformed'}; expected a list")
    try:
        tokenizer = Tokenizer.from_str(text)
    except Exception as e:  # the Rust side's parse error (a plain Exception): its message says what is wrong
        raise _error(f"{path}: not a tokenizer `tokenizers` can load ({str(e)[:200]})") from None
    if rows is not None:
        past = sorted((i, t) for t, i in tokenizer.get_vocab(with_added_tokens=True).items() if i >= rows)
        if past:
            shown = ", ".join(f"{t!r} = {i}" for i, t in past[:3]) + (
                f" and {len(past) - 3} more" if len(past) > 3 else ""
            )
            raise _error(
                f"{path}: {len(past)} token id(s) past the model's {rows} embedding rows (config vocab_size): {shown}; "
                "a text holding one could not be embedded: resize_token_embeddings and save the model again"
            )


# Tensor names (after the base model's prefix: `bert.`, `roberta.`...) transformers' loading info may report
# without the pack being wrong. Anything else missing, extra or of another shape is refused.
_UNEXPECTED_OK = re.compile(
    # buffers older transformers saved (arange / zeros constants, rebuilt by the model): never weights
    r"embeddings\.(position_ids|token_type_ids)"
    # a pooler the loaded class does not build (Roberta/XLMRoberta/MPNetForSequenceClassification classify the
    # first token through their own head): not in the graph
    r"|pooler\..+"
)
_UNEXPECTED_OK_EMBEDDING = re.compile(
    # another class's task head saved with the encoder (BertForMaskedLM/ForPreTraining `cls.`, Roberta/XLMRoberta/
    # MPNetForMaskedLM `lm_head.`, DistilBertForMaskedLM `vocab_*`, a *ForSequenceClassification's classifier):
    # an embedder is the encoder alone, as sentence-transformers itself loads it (AutoModel)
    r"(cls|lm_head|classifier|pre_classifier|vocab_transform|vocab_layer_norm|vocab_projector)\..+"
)
# The only tensors that may be missing: an embedder's pooler (BertModel/RobertaModel/MPNetModel build one, but the
# embedding is pooled from the token states, so it is in neither the graph nor the torch encoder's output). A
# BertForSequenceClassification classifies the pooler's output: there a missing pooler is refused.
_MISSING_OK_EMBEDDING = re.compile(r"pooler\..+")
_SHOWN_KEYS = 5


def check_loading_info(path: Path, class_name: str, info: dict[str, Any], base_prefix: str, embedding: bool) -> None:
    """transformers' `output_loading_info` for the weights `path` loaded as `class_name`: a missing tensor would be
    filled with random values (a pack that differs on each run), an extra one is weights of another architecture
    (or custom code) that the stock class ignores, one of another shape is another model."""

    def local(key: str) -> str:
        return key.removeprefix(f"{base_prefix}.") if base_prefix else key

    def shown(keys: list[str]) -> str:
        more = ", ..." if len(keys) > _SHOWN_KEYS else ""
        return ", ".join(keys[:_SHOWN_KEYS]) + more

    def count(n: int) -> str:
        return f"{n} tensor{'s' if n != 1 else ''}"

    missing = sorted(
        k for k in info.get("missing_keys") or () if not (embedding and _MISSING_OK_EMBEDDING.fullmatch(local(k)))
    )
    if missing:
        verb = "are" if len(missing) != 1 else "is"
        which = "them" if len(missing) != 1 else "it"
        raise _error(
            f"{path}: {count(len(missing))} {class_name} needs {verb} missing ({shown(missing)}); "
            f"transformers would fill {which} with random values"
        )
    mismatched = sorted(info.get("mismatched_keys") or (), key=lambda m: str(m[0]))
    if mismatched:
        first = ", ".join(f"{k}: {list(got)}, expected {list(want)}" for k, got, want in mismatched[:_SHOWN_KEYS])
        raise _error(f"{path}: {count(len(mismatched))} of a shape {class_name} does not have ({first})")
    unexpected = sorted(
        k
        for k in info.get("unexpected_keys") or ()
        if not (_UNEXPECTED_OK.fullmatch(local(k)) or (embedding and _UNEXPECTED_OK_EMBEDDING.fullmatch(local(k))))
    )
    if unexpected:
        raise _error(
            f"{path}: {count(len(unexpected))} {class_name} does not have ({shown(unexpected)}): weights of another "
            "architecture or of custom code, which the stock class would ignore"
        )
    errors = [str(e) for e in info.get("error_msgs") or ()]
    if errors:
        raise _error(f"{path}: transformers could not load the weights ({' '.join(errors[0].split())[:300]})")
