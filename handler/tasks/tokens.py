"""Text → padded token-id and attention-mask arrays, with the model's truncation (Hugging Face `tokenizers`).

`shared_encoder` hands out one `TextEncoder` per (tokenizer SHA-256, truncation, pad id) while any model
holds it: a hot reload to a version whose tokenizer file is unchanged reuses the parsed one instead of
parsing it again (~13 ms holding the GIL: every request thread waits) and dropping the old one (~5 ms more).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenizers import Tokenizer

from handler.core.manifest import read_regular, regular_path

if TYPE_CHECKING:  # types only: numpy.typing's import dedents docstrings with regexes, at init; numpy itself is
    # imported where arrays are made (a lean start, handler.core.numpy_gate, has none)
    import numpy as np
    import numpy.typing as npt


def bert_wordpiece(vocab: Path, settings: Mapping[str, Any]) -> Tokenizer:
    """A BERT WordPiece tokenizer from its vocabulary file and the manifest's recorded settings: ~2x faster to
    build than parsing tokenizer.json (docs/coldstart.md). Used only where a pack-time check proved it gives
    the JSON pipeline's ids (infra/pack/wordpiece.py builds it with this same function)."""
    from tokenizers import AddedToken, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordPiece

    with regular_path(vocab) as name:  # a FIFO or a device at the name is refused, not read (forever)
        tok = Tokenizer(
            WordPiece.from_file(
                name,
                unk_token=settings["unk_token"],
                continuing_subword_prefix=settings["continuing_subword_prefix"],
                max_input_chars_per_word=settings["max_input_chars_per_word"],
            )
        )
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=settings["clean_text"],
        handle_chinese_chars=settings["handle_chinese_chars"],
        strip_accents=settings["strip_accents"],
        lowercase=settings["lowercase"],
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    (cls, cls_id), (sep, sep_id) = settings["cls"], settings["sep"]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B:1 {sep}:1", special_tokens=[(cls, cls_id), (sep, sep_id)]
    )
    # Special tokens are matched in the raw text before normalization, as tokenizer.json's added_tokens are.
    tok.add_special_tokens([AddedToken(t, normalized=False) for t in settings["special_tokens"]])
    return tok


def usable_shortcut(root: Path, tokenizer: Mapping[str, Any], files: Mapping[str, Any]) -> tuple[Path | None, str]:
    """The vocabulary file when the manifest's shortcut proof covers this tokenizer file; else why not."""
    shortcut = tokenizer.get("shortcut")
    if not shortcut:
        return None, "no pack-time proof (not a plain BERT WordPiece tokenizer, or packed without the proof)"
    entry = files.get(tokenizer.get("file", ""))
    if entry is None or getattr(entry, "sha256", None) != shortcut.get("proof", {}).get("tokenizer_sha256"):
        return None, "the proof is for another tokenizer.json"
    if shortcut.get("vocab") not in files:
        return None, "vocabulary file not in this copy of the model"
    return root / shortcut["vocab"], "proved"


class TextEncoder:
    def __init__(
        self, path: Path, max_length: int, pad_id: int = 0, shortcut: tuple[Path, Mapping[str, Any]] | None = None
    ) -> None:
        if shortcut is not None:
            self._tok = bert_wordpiece(shortcut[0], shortcut[1])
            self.coldstart: dict[str, Any] = {"shortcut": "wordpiece", "vocab": shortcut[0].name}
        else:
            # Read here (file I/O releases the GIL), parsed by `from_str`: the parse holds the GIL, and
            # `from_file` took ~22-27 ms of it for all-MiniLM's 466 KB tokenizer.json, `from_str` ~13 ms.
            self._tok = Tokenizer.from_str(read_regular(path).decode("utf-8"))
            self.coldstart = {"shortcut": None}
        # The packed tokenizer.json may carry its own truncation/padding (all-MiniLM's says 128, fixed);
        # the manifest's settings are the truth: sentence-transformers truncates at max_seq_length.
        self._tok.enable_truncation(max_length, strategy="longest_first")
        pad_token = self._tok.id_to_token(pad_id) or "[PAD]"
        self._tok.enable_padding(pad_id=pad_id, pad_token=pad_token)  # to the longest in the batch
        self.max_length = max_length
        self.pad_id = pad_id  # what a batch of several requests pads their rows with (handler.tasks.batch)
        # Without character offsets (tokenizers >= 0.21): the same ids, masks and type ids, ~15% less time for a
        # short query; nothing here reads offsets (the /tokenize route encodes through the tokenizer itself).
        self._encode_batch = getattr(self._tok, "encode_batch_fast", self._tok.encode_batch)

    def encode(self, texts: Sequence[str]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        import numpy as np  # deferred: see the TYPE_CHECKING import

        encodings = self.tokenize(texts)
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        return ids, mask

    def tokenize(self, texts: Sequence[str | tuple[str, str]]) -> list[Any]:
        """Encodings padded to the longest in the batch; `fill` copies them into caller-owned arrays. A
        (query, document) tuple is encoded as one pair, truncated "longest_first" (tokens come off the longer
        text first) at `max_length`, as `CrossEncoder` does; its type ids mark the document.

        A truncated `Encoding` keeps every token it cut off (`overflowing`): 256 inputs of 20,000 CJK
        characters held 730 MB. Past `SLICE_CHARS`, texts are encoded a slice at a time and only the kept
        ids, masks and type ids stay (`Kept`), padded to the longest of all as one call would pad them."""
        texts = texts if isinstance(texts, list) else list(texts)
        if sum(map(_chars, texts)) <= SLICE_CHARS:
            encodings: list[Any] = self._encode_batch(texts)
            return encodings
        kept: list[Kept] = []
        start = size = 0
        for end, text in enumerate(texts, 1):
            size += _chars(text)
            if size > SLICE_CHARS or end == len(texts):
                kept += [Kept(e.ids, e.attention_mask, e.type_ids) for e in self._encode_batch(texts[start:end])]
                start, size = end, 0
        longest = max(len(k.ids) for k in kept)
        for k in kept:
            if len(k.ids) < longest:
                pad = longest - len(k.ids)
                k.ids += [self.pad_id] * pad
                k.attention_mask += [0] * pad
                k.type_ids += [0] * pad
        return kept

    def spans(self, text: str, add_special_tokens: bool = True) -> list[tuple[int, str, tuple[int, int], bool]]:
        """One text's tokens as the model sees them (truncated at `max_length`): (id, token, its (start, stop)
        character offsets, special?). One text per call: the tokenizer pads a batch to its longest."""
        e = self._tok.encode(text, add_special_tokens=add_special_tokens)
        return list(zip(e.ids, e.tokens, e.offsets, map(bool, e.special_tokens_mask), strict=True))

    def decode(self, ids: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
        texts: list[str] = self._tok.decode_batch(ids, skip_special_tokens=skip_special_tokens)
        return texts

    def token(self, token_id: int) -> str:
        """The vocabulary's token for `token_id` (a sparse vector's dimension names its token)."""
        return self._tok.id_to_token(token_id) or ""

    @property
    def vocab_size(self) -> int:
        size: int = self._tok.get_vocab_size(with_added_tokens=True)
        return size

    @staticmethod
    def fill(encodings: Sequence[Any], ids: npt.NDArray[np.int64], mask: npt.NDArray[np.int64]) -> None:
        # One assignment per array from a list of lists: measured as fast as np.array(...), without the new array.
        ids[...] = [e.ids for e in encodings]
        mask[...] = [e.attention_mask for e in encodings]

    @staticmethod
    def fill_type_ids(encodings: Sequence[Any], types: npt.NDArray[np.int64]) -> None:
        types[...] = [e.type_ids for e in encodings]


# Characters encoded in one call before the overflow is dropped: ~37 MB of `Encoding`s at most (one token a
# character, ~140 bytes a token, measured on CJK text), ~1 ms of work, so small requests never take this path.
SLICE_CHARS = 1 << 18


def _chars(text: str | tuple[str, str]) -> int:
    return len(text) if isinstance(text, str) else len(text[0]) + len(text[1])


class Kept:
    """The part of an `Encoding` a model run reads, without the tokens truncation cut off."""

    __slots__ = ("attention_mask", "ids", "type_ids")

    def __init__(self, ids: list[int], attention_mask: list[int], type_ids: list[int]) -> None:
        self.ids, self.attention_mask, self.type_ids = ids, attention_mask, type_ids


# Weak: an entry lives exactly as long as some loaded model's task holds its encoder; the last version using
# a tokenizer takes it along when it is freed (no cache to trim, nothing kept for a version that is gone).
_shared: weakref.WeakValueDictionary[tuple[str, int, int], TextEncoder] = weakref.WeakValueDictionary()
_shared_lock = threading.Lock()


def shared_encoder(
    path: Path,
    max_length: int,
    pad_id: int,
    sha256: str | None,
    shortcut: tuple[Path, Mapping[str, Any]] | None = None,
) -> TextEncoder:
    """The encoder of a model that is already loaded when its tokenizer file has the same SHA-256 (as its
    manifest lists it: a reload has hashed every file by now) and the same truncation and pad id; else a new
    one, parsed here and kept for the next. Sharing is safe: an encoder's settings are fixed when it is
    built, and worker threads already call one tokenizer concurrently (`encode_batch` takes `&self`).
    `sha256=None` (a file the manifest does not list): never shared."""
    if not sha256:
        return TextEncoder(path, max_length, pad_id, shortcut)
    # Not keyed by the shortcut: built from vocab.txt or parsed from the JSON, the ids are the same (the
    # pack-time proof), so either is shared; the encoder's own `coldstart` says which one it is.
    key = (sha256, max_length, pad_id)
    with _shared_lock:
        encoder = _shared.get(key)
    if encoder is not None:
        return encoder
    fresh = TextEncoder(path, max_length, pad_id, shortcut)  # parsed outside the lock: another load may run meanwhile
    with _shared_lock:
        encoder = _shared.setdefault(key, fresh)
    return encoder
