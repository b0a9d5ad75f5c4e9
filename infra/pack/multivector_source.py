"""A ColBERT-style (late interaction) model directory as PyLate saves it, read and checked for `pack --from`.

PyLate (`pylate.models.ColBERT.save`, read from PyLate 1.6's source) writes a sentence-transformers directory:
modules.json `Transformer` (path "") -> `pylate.models.Dense.Dense` ("1_Dense": a Linear on every token, no
pooling), and its own keys in config_sentence_transformers.json: `query_prefix` / `document_prefix` (a marker
token put after [CLS]), `query_length` / `document_length` (tokens, the marker included), `do_query_expansion`
(queries padded to `query_length` with the mask token, every position kept), `attend_to_expansion_tokens`,
`skiplist_words` (document tokens dropped after the model run: punctuation by default). A missing key is
PyLate's default (`PYLATE_DEFAULTS`). Token ids (markers, mask, skip-list) are resolved at pack time with the
model's own tokenizer, as PyLate resolves them at load, and written into the manifest (`LateInteraction`).

Only what the run time reproduces exactly is accepted; anything else is refused with one line.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.pack.hf_checks import SourceError, is_int

# modules.json type of PyLate's Dense -> its module kind in hf_source (a Linear on every token; only a
# multivector model may have it). sentence-transformers 6 aliases the same path to its own Dense.
LATE_DENSE = "LateDense"
LATE_MODULE_TYPES = {"pylate.models.Dense.Dense": LATE_DENSE}
PYLATE_KEYS = (
    "query_prefix",
    "document_prefix",
    "query_length",
    "document_length",
    "do_query_expansion",
    "attend_to_expansion_tokens",
    "skiplist_words",
)
PYLATE_DEFAULTS: dict[str, Any] = {  # pylate/models/colbert.py, when neither the call nor the config sets one
    "query_prefix": "[Q] ",
    "document_prefix": "[D] ",
    "query_length": 32,
    "document_length": 180,
    "do_query_expansion": True,
    "attend_to_expansion_tokens": False,
    "skiplist_words": list(string.punctuation),
}
_MODULES = "Transformer -> pylate.models.Dense.Dense (-> Dense ...)"


@dataclass(frozen=True)
class LateSettings:
    """PyLate's query/document settings as read from the directory (token ids come later, from the tokenizer)."""

    query_prefix: str
    document_prefix: str
    query_length: int
    document_length: int
    query_expansion: bool
    attend_to_expansion: bool
    skiplist_words: tuple[str, ...]


def is_late_interaction(kinds: list[tuple[str, str]], st_meta: dict[str, Any]) -> bool:
    """A PyLate directory: its Dense module, or PyLate's keys / model_type in config_sentence_transformers."""
    return (
        any(k == LATE_DENSE for k, _ in kinds)
        or st_meta.get("model_type") == "ColBERT"
        or any(key in st_meta for key in PYLATE_KEYS)
    )


def late_settings(root: Path, kinds: list[tuple[str, str]], st_meta: dict[str, Any], positions: int) -> LateSettings:
    """PyLate's settings, checked (the projection's modules are read by hf_source's Dense reader)."""
    where = root / "config_sentence_transformers.json"
    order = [k for k, _ in kinds]
    if len(order) < 2 or order[0] != "Transformer" or any(k not in ("Dense", LATE_DENSE) for k in order[1:]):
        raise SourceError(f"{root / 'modules.json'}: modules {' -> '.join(order)}; supported: {_MODULES}")
    if st_meta.get("similarity_fn_name") not in (None, "MaxSim", "maxsim"):
        raise SourceError(f"{where}: similarity {st_meta['similarity_fn_name']!r}; supported: MaxSim")
    if st_meta.get("prompts") or st_meta.get("default_prompt_name"):
        raise SourceError(f"{where}: prompts are not supported for multivector; supported: none")
    value = {key: st_meta.get(key, PYLATE_DEFAULTS[key]) for key in PYLATE_KEYS}
    for key in ("query_prefix", "document_prefix"):
        if not isinstance(value[key], str):
            raise SourceError(f"{where}: {key} {value[key]!r}; expected a string (a marker token, or '')")
    for key in ("query_length", "document_length"):
        n = value[key]
        if not is_int(n) or not 2 <= n <= positions:
            raise SourceError(f"{where}: {key} {n!r}; supported: an integer, 2 to {positions} (positions)")
    for key in ("do_query_expansion", "attend_to_expansion_tokens"):
        if not isinstance(value[key], bool):
            raise SourceError(f"{where}: {key} {value[key]!r}; expected true or false")
    words = value["skiplist_words"]
    if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
        raise SourceError(f"{where}: skiplist_words must be a list of strings")
    expansion = bool(value["do_query_expansion"])
    return LateSettings(
        query_prefix=value["query_prefix"],
        document_prefix=value["document_prefix"],
        query_length=int(value["query_length"]),
        document_length=int(value["document_length"]),
        query_expansion=expansion,
        attend_to_expansion=expansion and bool(value["attend_to_expansion_tokens"]),  # PyLate's rule
        skiplist_words=tuple(words),
    )


def token_ids(late: LateSettings, tokenizer: Any, vocab_size: int, where: Path) -> dict[str, Any]:
    """The manifest's `late_interaction`: PyLate's settings with its token ids, resolved by the model's own
    tokenizer as PyLate resolves them (`convert_tokens_to_ids`; the mask token pads expanded queries, else EOS)."""
    out: dict[str, Any] = {
        "query_length": late.query_length,
        "document_length": late.document_length,
        "query_expansion": late.query_expansion,
        "attend_to_expansion": late.attend_to_expansion,
    }
    for side, prefix in (("query", late.query_prefix), ("document", late.document_prefix)):
        if not prefix:
            out[f"{side}_prefix_id"] = None
            continue
        found = tokenizer.convert_tokens_to_ids(prefix)
        if found is None or found == tokenizer.unk_token_id or not 0 <= found < vocab_size:
            raise SourceError(
                f"{where}: {side}_prefix {prefix!r} is not a token of the model's tokenizer (PyLate would add it "
                "with a freshly initialized embedding); supported: a prefix the saved tokenizer has"
            )
        out[f"{side}_prefix_id"] = int(found)
    expansion = tokenizer.mask_token_id if tokenizer.mask_token_id is not None else tokenizer.eos_token_id
    if expansion is None:
        expansion = tokenizer.pad_token_id
    if late.query_expansion and expansion is None:
        raise SourceError(f"{where}: query expansion needs a mask, EOS or pad token; the tokenizer has none")
    out["expansion_id"] = None if expansion is None else int(expansion)
    # PyLate maps each word with convert_tokens_to_ids: a word outside the vocabulary becomes the unknown token's
    # id (so unknown tokens are skipped too); kept as it does.
    skip = {tokenizer.convert_tokens_to_ids(w) for w in late.skiplist_words}
    out["skip_ids"] = sorted(int(i) for i in skip if i is not None)
    return out


def resolved(source: Any, tokenizer: Any, precision: Any) -> Any:
    """`source` (an HFSource) with its settings' token ids (`token_ids`); --dtype refused (the torch program's
    gate compares pooled outputs), --quantize int8 has its own gate (infra.pack.late_quality)."""
    from dataclasses import replace

    if precision.dtype != "float32":
        raise SourceError(
            f"--dtype {precision.dtype} is not served for multivector (its gate compares pooled outputs); "
            "use --quantize int8 (gated by MaxSim ranking agreement) or float32"
        )
    return replace(source, late=token_ids(source.late, tokenizer, int(source.config["vocab_size"]), source.root))


def add_to_manifest(manifest: dict[str, Any], source: Any) -> None:
    """The manifest's multivector fields: the width, `late_interaction` (with its token ids) and the tokenizer's
    cut for documents (PyLate's: one short of the length when a marker goes in; queries' own is the task's; the
    graph takes the longer of the two lengths, `max_seq_length`)."""
    manifest["dimension"] = source.dimension
    manifest["late_interaction"] = dict(source.late)
    marker = source.late["document_prefix_id"] is not None
    manifest["tokenizer"]["truncation"] = source.late["document_length"] - marker
