"""Text → padded token-id and attention-mask arrays, with the model's truncation (Hugging Face `tokenizers`).

`shared_encoder` hands out one `TextEncoder` per (tokenizer SHA-256, truncation, pad id) while any model
holds it: a hot reload to a version whose tokenizer file is unchanged reuses the parsed one instead of
parsing it again (~13 ms holding the GIL: every request thread waits) and dropping the old one (~5 ms more).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from tokenizers import Tokenizer


class TextEncoder:
    def __init__(self, path: Path, max_length: int, pad_id: int = 0) -> None:
        # Read here (file I/O releases the GIL), parsed by `from_str`: the parse holds the GIL, and
        # `from_file` took ~22-27 ms of it for all-MiniLM's 466 KB tokenizer.json, `from_str` ~13 ms (measured).
        self._tok = Tokenizer.from_str(path.read_text(encoding="utf-8"))
        # The packed tokenizer.json may carry its own truncation/padding (all-MiniLM's says 128, fixed);
        # the manifest's settings are the truth: sentence-transformers truncates at max_seq_length.
        self._tok.enable_truncation(max_length)
        pad_token = self._tok.id_to_token(pad_id) or "[PAD]"
        self._tok.enable_padding(pad_id=pad_id, pad_token=pad_token)  # to the longest in the batch
        self.max_length = max_length

    def encode(self, texts: Sequence[str]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        encodings = self.tokenize(texts)
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        return ids, mask

    def tokenize(self, texts: Sequence[str]) -> list[Any]:
        """Encodings padded to the longest in the batch; `fill` copies them into caller-owned arrays."""
        encodings: list[Any] = self._tok.encode_batch(list(texts))
        return encodings

    @staticmethod
    def fill(encodings: Sequence[Any], ids: npt.NDArray[np.int64], mask: npt.NDArray[np.int64]) -> None:
        # One assignment per array from a list of lists: measured as fast as np.array(...), without the new array.
        ids[...] = [e.ids for e in encodings]
        mask[...] = [e.attention_mask for e in encodings]


# Weak: an entry lives exactly as long as some loaded model's task holds its encoder; the last version using
# a tokenizer takes it along when it is freed (no cache to trim, nothing kept for a version that is gone).
_shared: weakref.WeakValueDictionary[tuple[str, int, int], TextEncoder] = weakref.WeakValueDictionary()
_shared_lock = threading.Lock()


def shared_encoder(path: Path, max_length: int, pad_id: int, sha256: str | None) -> TextEncoder:
    """The encoder of a model that is already loaded when its tokenizer file has the same SHA-256 (as its
    manifest lists it: a reload has hashed every file by now) and the same truncation and pad id; else a new
    one, parsed here and kept for the next. Sharing is safe: an encoder's settings are fixed when it is
    built, and worker threads already call one tokenizer concurrently (`encode_batch` takes `&self`).
    `sha256=None` (a file the manifest does not list): never shared."""
    if not sha256:
        return TextEncoder(path, max_length, pad_id)
    key = (sha256, max_length, pad_id)
    with _shared_lock:
        encoder = _shared.get(key)
    if encoder is not None:
        return encoder
    fresh = TextEncoder(path, max_length, pad_id)  # parsed outside the lock: another load may run meanwhile
    with _shared_lock:
        encoder = _shared.setdefault(key, fresh)
    return encoder
