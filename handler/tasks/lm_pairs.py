"""A decoder reranker's pairs (the manifest's `pair_template`, written by infra.pack.lm_rerank): each (query,
document) becomes the one text its chat template renders, `prefix + query + middle + document + suffix`, string
concatenation proved equal to the template at pack time (no Jinja here: cold start). A row that truncation
reached gets the template's last tokens (`suffix_ids`) written back over its end, as sentence-transformers does,
so the position the graph scores is the template's, not the middle of the document. A request's `instruction`
replaces the default prompt: the prefix becomes `instruction.head + instruction + instruction.tail` (the slot
marked and proved literal at pack time too).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from handler.tasks.tokens import Kept

_STRINGS = ("prefix", "middle", "suffix")


def template_fields(raw: Any) -> dict[str, Any]:
    """The manifest's `pair_template`, checked: three strings and a list of token ids."""
    if not isinstance(raw, dict):
        raise ValueError("pair_template must be an object with prefix, middle, suffix and suffix_ids")
    for key in _STRINGS:
        if not isinstance(raw.get(key), str):
            raise ValueError(f"pair_template.{key} must be a string")
    ids = raw.get("suffix_ids")
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise ValueError("pair_template.suffix_ids must be a list of token ids")
    slot = raw.get("instruction")  # absent: the template has no instruction slot
    if slot is not None and not (
        isinstance(slot, dict) and isinstance(slot.get("head"), str) and isinstance(slot.get("tail"), str)
    ):
        raise ValueError("pair_template.instruction must be an object with head and tail strings")
    instruction = None if slot is None else (slot["head"], slot["tail"])
    return {**{key: raw[key] for key in _STRINGS}, "suffix_ids": tuple(ids), "instruction": instruction}


class PairTemplate:
    def __init__(self, fields: dict[str, Any]) -> None:
        self.prefix, self.middle, self.suffix = fields["prefix"], fields["middle"], fields["suffix"]
        self.suffix_ids: tuple[int, ...] = fields["suffix_ids"]
        self.instruction: tuple[str, str] | None = fields.get("instruction")

    def texts(self, pairs: Sequence[tuple[str, str]], instruction: str | None = None) -> list[str]:
        prefix = self.prefix
        if instruction is not None:
            assert self.instruction is not None  # the task refuses an instruction the template has no slot for
            prefix = f"{self.instruction[0]}{instruction}{self.instruction[1]}"
        return [f"{prefix}{query}{self.middle}{document}{self.suffix}" for query, document in pairs]

    def restore(self, encodings: list[Any], max_length: int) -> list[Any]:
        """`encodings` (padded right), each row truncation cut at `max_length` ending in the template's suffix."""
        if not self.suffix_ids or not any(sum(e.attention_mask) >= max_length for e in encodings):
            return encodings  # nothing cut: the common case costs one sum a row
        rows = [Kept(list(e.ids), list(e.attention_mask), list(e.type_ids)) for e in encodings]
        for row in rows:
            real = sum(row.attention_mask)
            if real >= max_length:
                keep = min(len(self.suffix_ids), real)
                row.ids[real - keep : real] = self.suffix_ids[-keep:]
        return rows
