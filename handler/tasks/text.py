"""What the text tasks share: request checks (texts, limits, options), the tokenizer and feeds, and base64
rows. Float answers stay float32 arrays: `handler.api.encode` writes them, at the edge."""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from itertools import chain
from typing import TYPE_CHECKING, Any

from handler.backends.contract import Backend
from handler.backends.pool import BufferPool, current_arena
from handler.core.config import LAMBDA_PAYLOAD_LIMIT, Config
from handler.core.errors import InputTooLongError, InvalidEncodingError, InvalidInputError, TooManyInputsError
from handler.core.manifest import Manifest
from handler.core.types import JSON
from handler.tasks.tokens import TextEncoder, shared_encoder, usable_shortcut

if TYPE_CHECKING:  # types only: numpy.typing's import dedents docstrings with regexes, at init; numpy itself is
    # imported where arrays are made (a lean start, handler.core.numpy_gate, has none)
    import numpy as np
    import numpy.typing as npt

ENCODING_FORMATS = ("float", "base64")
TEXT_ROUTES = ("/tokenize", "/decode")  # compatible routes every text task serves (TEI's): its tokenizer
Text = str | tuple[str, str]  # one text, or a (query, document) pair


def require_object(payload: JSON, required: str = "inputs") -> dict[str, Any]:
    if not isinstance(payload, dict):
        raise InvalidInputError(f'request must be a JSON object with "{required}", got {type(payload).__name__}')
    if required not in payload:
        raise InvalidInputError(f'request has no "{required}" field')
    return payload


def check_text(text: Any, where: str, max_chars: int) -> str:
    if not isinstance(text, str):
        raise InvalidInputError(f"{where} must be a string, got {type(text).__name__}")
    if len(text) > max_chars:
        raise InputTooLongError(f"{where} has {len(text)} characters; at most {max_chars} (WARMSTART_MAX_CHARS)")
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:  # a lone surrogate from a JSON escape such as "\ud800"
            raise InvalidEncodingError(f"{where} is not valid Unicode: {e.reason} at {e.start}") from None
    return text


def check_texts(value: Any, field: str, max_inputs: int, max_chars: int, single: bool = True) -> list[str]:
    """A list of strings (or one string, where `single`), non-empty, within the count and length limits."""
    if single and isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise InvalidInputError(f'"{field}" must be a list of strings, got {type(value).__name__}')
    if not value:
        raise InvalidInputError(f'"{field}" is empty; send at least one string')
    if len(value) > max_inputs:
        raise TooManyInputsError(f"{len(value)} {field}; at most {max_inputs} per request (WARMSTART_MAX_INPUTS)")
    return [check_text(text, f"{field}[{i}]", max_chars) for i, text in enumerate(value)]


def joined(first: str, texts: list[str], where: str, field: str, max_chars: int) -> None:
    """`first` (a prompt, a query) goes in front of each of `texts` into the model: each whole within
    `max_chars`, so a request's characters stay within max inputs x max chars whatever is prepended."""
    if not first:
        return
    for i, text in enumerate(texts):
        if len(first) + len(text) > max_chars:
            raise InputTooLongError(
                f"{where} ({len(first)} characters) and {field}[{i}] ({len(text)}) have {len(first) + len(text)} "
                f"characters together; at most {max_chars} (WARMSTART_MAX_CHARS)"
            )


def chunks(lengths: Sequence[int], max_tokens: int) -> list[tuple[int, int]]:
    """Rows (each of `lengths` tokens, padded) in model runs, in order: [start, stop) spans, each run's rows x
    its longest within `max_tokens`, so a run's activation memory is bounded whatever a request's size. A row
    longer than the budget runs alone (the model's max sequence length bounds it)."""
    out: list[tuple[int, int]] = []
    start = longest = 0
    for row, length in enumerate(lengths):
        wider = max(longest, length)
        if row > start and (row - start + 1) * wider > max_tokens:
            out.append((start, row))
            start, wider = row, length
        longest = wider
    if len(lengths) > start:
        out.append((start, len(lengths)))
    return out


def positive_int(body: dict[str, Any], key: str, most: int | None = None) -> int | None:
    """An optional integer option in 1..most (no upper bound when `most` is None); None when absent."""
    value = body.get(key)
    if value is None:
        return None
    valid = f"1 to {most}" if most is not None else "1 or more"
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or (most is not None and value > most):
        raise InvalidInputError(f'"{key}" is {value!r}; valid: an integer, {valid}')
    return value


def flag(body: dict[str, Any], key: str, default: bool = False) -> bool:
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidInputError(f'"{key}" must be true or false, got {value!r}')
    return value


def choice(body: dict[str, Any], key: str, valid: tuple[str, ...], default: str) -> str:
    """An optional string option from a closed set (`default` when absent or null). Any other value, of any
    type (`{}`, `[]`, `""`, `0`: never read as the default), is refused with the valid choices."""
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, str) or value not in valid:
        raise InvalidInputError(f'"{key}" is {value!r}; valid: {", ".join(valid)}')
    return value


def encoding_format(body: dict[str, Any]) -> str:
    return choice(body, "encoding_format", ENCODING_FORMATS, "float")


def prompt_for(
    body: dict[str, Any], prompts: dict[str, str], default_name: str | None, max_chars: int = LAMBDA_PAYLOAD_LIMIT
) -> str:
    """sentence-transformers' rule: an explicit `prompt` wins, else `prompt_name`'s text, else the model's
    default prompt (none for most models). Both given is ambiguous, so refused. An explicit prompt is checked
    as a text is (type, at most `max_chars`, valid Unicode): it goes in front of every input."""
    prompt, name = body.get("prompt"), body.get("prompt_name")
    if prompt is not None and name is not None:
        raise InvalidInputError('send "prompt" or "prompt_name", not both')
    if prompt is not None:
        return check_text(prompt, '"prompt"', max_chars)
    if name is None:
        return prompts[default_name] if default_name is not None else ""
    valid = ", ".join(sorted(prompts)) if prompts else "none (this model has no prompts)"
    if not isinstance(name, str):  # a list or an object would reach the dict lookup (unhashable)
        raise InvalidInputError(f'"prompt_name" must be a string, got {type(name).__name__}; valid: {valid}')
    if name not in prompts:
        raise InvalidInputError(f'"prompt_name" {name!r} is not one of this model\'s prompts; valid: {valid}')
    return prompts[name]


def base64_rows(array: npt.NDArray[np.float32]) -> list[str]:
    """Each row as base64 of its little-endian float32 bytes (OpenAI's `encoding_format: "base64"`)."""
    import base64  # deferred: asked for by a request only, never on the init path

    import numpy as np  # deferred: see the TYPE_CHECKING import

    rows = np.ascontiguousarray(array, dtype="<f4")
    return [base64.b64encode(row.tobytes()).decode("ascii") for row in rows]


class TextModel:
    """A text model's tokenizer and backend: texts (or pairs) → feeds in pooled buffers → named outputs.

    `token_type_ids` is fed only when the model's inputs list it (BERT-style pair models); the tokenizer's
    type ids mark the second text of a pair."""

    def __init__(self, manifest: Manifest, backend: Backend, config: Config, pool: BufferPool | None = None) -> None:
        tok = manifest.tokenizer
        max_length = int(tok.get("truncation") or manifest.max_seq_length or 512)
        name = tok.get("file", "tokenizer.json")
        entry = manifest.files.get(name)
        # Shared with a loaded version whose tokenizer file has the same SHA-256 and settings: a reload to
        # such a version neither parses nor drops a tokenizer (each holds the GIL for milliseconds).
        # A WordPiece tokenizer built from the vocabulary, where a pack-time proof says it is the same (faster).
        vocab, why = usable_shortcut(manifest.root, tok, manifest.files)
        shortcut = (vocab, tok["shortcut"]["settings"]) if vocab and config.tokenizer_shortcut else None
        self.encoder: TextEncoder = shared_encoder(
            manifest.path(name), max_length, int(tok.get("pad_id", 0)), entry.sha256 if entry else None, shortcut
        )
        if shortcut is None and not self.encoder.coldstart.get("shortcut"):
            self.encoder.coldstart["reason"] = (
                why if config.tokenizer_shortcut else "off (WARMSTART_TOKENIZER_SHORTCUT=0)"
            )
        self.backend = backend
        self.model = manifest.key
        self.output = manifest.outputs[0].name
        self.type_ids = any(spec.name == "token_type_ids" for spec in manifest.inputs)
        self.max_inputs = config.max_inputs
        self.max_chars = config.max_chars
        self.batch_tokens = config.batch_tokens
        self.pool = pool or BufferPool()

    def _run(self, texts: Sequence[Text]) -> tuple[npt.NDArray[Any], int]:
        """The texts' outputs and real tokens, in model runs of at most `batch_tokens` padded tokens each (rows
        x the longest: activation memory grows with it); the caller holds the arena."""
        encodings = self.tokenize(texts)
        spans = chunks([len(encodings[0].ids)] * len(encodings), self.batch_tokens)
        if len(spans) == 1:
            out, mask = self._run_rows(encodings)
            # One text is never padded: every position counts (no numpy reduction after the model run).
            return out, mask.shape[1] if mask.shape[0] == 1 else int(mask.sum())
        outs, tokens = [], 0
        for start, stop in spans:
            out, mask = self._run_rows(encodings[start:stop])
            outs.append(out)
            tokens += int(mask.sum())
        import numpy as np  # deferred: see the TYPE_CHECKING import

        return np.concatenate(outs), tokens

    def run_lean(self, texts: Sequence[Text]) -> tuple[array[float], int, int] | None:
        """`_run` without numpy (handler.core.numpy_gate): the output's float32 values row-major, its width and the
        real tokens, in the same model runs as `_run`; None where the backend cannot run without numpy
        (`run_buffers`) or the output is not one float32 row per text."""
        run = getattr(self.backend, "run_buffers", None)
        if run is None:
            return None
        encodings = self.tokenize(texts)
        values: array[float] = array("f")
        width = tokens = 0
        for start, stop in chunks([len(encodings[0].ids)] * len(encodings), self.batch_tokens):
            rows = encodings[start:stop]
            shape = (len(rows), len(rows[0].ids))
            mask = array("q", chain.from_iterable(e.attention_mask for e in rows))
            feeds = {
                "input_ids": (array("q", chain.from_iterable(e.ids for e in rows)), shape),
                "attention_mask": (mask, shape),
            }
            if self.type_ids:
                feeds["token_type_ids"] = (array("q", chain.from_iterable(e.type_ids for e in rows)), shape)
            outputs = run(feeds)
            if outputs is None:
                return None
            dtype, dims, raw = outputs[self.output]
            if dtype != "float32" or len(dims) != 2 or dims[0] != shape[0] or width not in (0, dims[1]) or not dims[1]:
                return None
            width = dims[1]
            values.frombytes(raw)
            tokens += sum(mask)
        return values, width, tokens

    def tokenize(self, texts: Sequence[Text]) -> list[Any]:
        """The texts' encodings, padded to the longest (a task that formats its inputs first overrides)."""
        return self.encoder.tokenize(texts)

    def _run_rows(self, encodings: Sequence[Any]) -> tuple[npt.NDArray[Any], npt.NDArray[np.int64]]:
        """One model run: token ids and mask in pooled buffers, outputs bound to pooled buffers."""
        arena = current_arena()
        assert arena is not None
        shape = (len(encodings), len(encodings[0].ids))
        ids, mask = arena.take(shape, "int64"), arena.take(shape, "int64")
        self.encoder.fill(encodings, ids, mask)
        feeds = {"input_ids": ids, "attention_mask": mask}
        if self.type_ids:
            feeds["token_type_ids"] = types = arena.take(shape, "int64")
            self.encoder.fill_type_ids(encodings, types)
        return self.backend.run(feeds)[self.output], mask

    # -- the tokenizer, for routes that show it (TEI's `/tokenize`, `/decode`) -------------------------------

    def prompt(self, body: dict[str, Any]) -> str:
        """The text a request's `prompt_name` puts in front of each input (a task with prompts overrides)."""
        return prompt_for(body, {}, None, self.max_chars)

    def tokens(self, text: str, add_special_tokens: bool = True) -> list[tuple[int, str, tuple[int, int], bool]]:
        """`text`'s tokens as the model sees them: (id, token, (start, stop) character offsets, special?)."""
        return self.encoder.spans(text, add_special_tokens)

    def decode(self, ids: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
        """Token id lists back to text; an id outside the vocabulary is an InvalidInputError naming it."""
        if len(ids) > self.max_inputs:
            raise InvalidInputError(f"{len(ids)} id lists; at most {self.max_inputs} (WARMSTART_MAX_INPUTS)")
        size = self.encoder.vocab_size
        for i, row in enumerate(ids):
            bad = next((x for x in row if x >= size), None)
            if bad is not None:
                raise InvalidInputError(f"ids[{i}]: {bad} is not a token id of this model (0 to {size - 1})")
        return self.encoder.decode(ids, skip_special_tokens)

    def run_copy(self, texts: Sequence[Text]) -> tuple[npt.NDArray[Any], int]:
        with self.pool.request():
            out, tokens = self._run(texts)
            return out.copy(), tokens  # a copy: the pooled buffer goes back when the arena closes
