"""Text → padded token-id and attention-mask arrays, with the model's truncation (Hugging Face `tokenizers`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
from tokenizers import Tokenizer


class TextEncoder:
    def __init__(self, path: Path, max_length: int, pad_id: int = 0) -> None:
        self._tok = Tokenizer.from_file(str(path))
        # The packed tokenizer.json may carry its own truncation/padding (all-MiniLM's says 128, fixed);
        # the manifest's settings are the truth: sentence-transformers truncates at max_seq_length.
        self._tok.enable_truncation(max_length)
        pad_token = self._tok.id_to_token(pad_id) or "[PAD]"
        self._tok.enable_padding(pad_id=pad_id, pad_token=pad_token)  # to the longest in the batch
        self.max_length = max_length

    def encode(self, texts: Sequence[str]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        encodings = self._tok.encode_batch(list(texts))
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        return ids, mask
