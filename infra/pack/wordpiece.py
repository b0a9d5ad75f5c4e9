"""Prove at pack time that a model's tokenizer.json is plain BERT WordPiece, so init may build the tokenizer
from the vocabulary alone (handler.tasks.tokens.bert_wordpiece: about half the time of parsing the JSON).

Two checks, both recorded in the manifest (`tokenizer.shortcut`): the JSON's pipeline is exactly the BERT one
(normalizer, pre-tokenizer, model, post-processor, special tokens: nothing the shortcut would drop), and on
hard cases (accents, CJK, emoji, control and zero-width characters, over-long words, special tokens inside
text, truncation, batches with padding, pairs) both give identical ids, type ids and attention masks. Init
uses the shortcut only when the proof names the SHA-256 of the tokenizer.json it ships with.

`warmstart pack` runs the proof on every model it packs (infra.pack.hf_pack): a tokenizer that is not plain
BERT simply gets no shortcut. `warmstart optimize` runs it too, for packs made before that.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from handler.core.manifest import MANIFEST_NAME, load_manifest, sha256_file

VOCAB = "vocab.txt"
HARD_CASES = [
    "A cold start is the time from nothing to the first answer.",
    "",
    " ",
    "hello",
    "HELLO World",
    "naïve café résumé",
    "ÅNGSTRÖM Ærøskøbing",
    "東京タワーは高い",
    "中文分词测试",
    "한국어 텍스트",
    "Ελληνικά και Кириллица",
    "مرحبا بالعالم",
    "emoji 🚀🔥👍🏽 family 👨‍👩‍👧",
    "tabs\tand\nnewlines\r\nmixed",
    "control\x00chars\x07here\x1f",
    "zero\u200bwidth\u200djoiners\ufeff",
    "non\u00a0breaking\u2003spaces",
    "ﬁ ligature and ½ fractions ²",
    "combining e\u0301 accents a\u0308",
    "punctuation!!! ...??? (brackets) [square] {curly}",
    "[CLS] [SEP] [MASK] [PAD] [UNK] inside text",
    "[mask] lowercase special",
    "email@example.com https://example.com/path?q=1&r=2",
    "numbers 3.14159 1,000,000 -42 1e-9",
    "hyphen-ated words and under_scores",
    "a" * 99,
    "b" * 100,
    "c" * 101,
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "x" * 300,
    " ".join(["word"] * 400),
    "The quick brown fox jumps over the lazy dog. " * 30,
    "$100 €50 £20 ¥1000",
    "C++ C# F# .NET node.js",
    "don't won't it's y'all",
    "«quotes» \u201ccurly\u201d \u2018single\u2019",
    "Ünïcödé ÑÖÑ-ÄSCÏÏ",
    "\uff46\uff55\uff4c\uff4c\uff57\uff49\uff44\uff54\uff48 \uff21\uff22\uff23",  # fullwidth "fullwidth ABC"
    "mixed 日本語 and English 123",
    "\u0000\u0001",
    "##subword ##prefix",
]


class NotPlainBert(ValueError):
    """The tokenizer does something the vocabulary-only WordPiece tokenizer would not."""


def bert_settings(raw: dict[str, Any]) -> dict[str, Any]:
    """The shortcut's settings from tokenizer.json, or NotPlainBert saying which part differs."""
    norm, pre, model, post = (
        raw.get("normalizer"),
        raw.get("pre_tokenizer"),
        raw.get("model"),
        raw.get("post_processor"),
    )
    if not norm or norm.get("type") != "BertNormalizer":
        raise NotPlainBert(f"normalizer {norm and norm.get('type')} is not BertNormalizer")
    if not pre or pre.get("type") != "BertPreTokenizer":
        raise NotPlainBert(f"pre-tokenizer {pre and pre.get('type')} is not BertPreTokenizer")
    if not model or model.get("type") != "WordPiece":
        raise NotPlainBert(f"model {model and model.get('type')} is not WordPiece")
    vocab = model["vocab"]
    if sorted(vocab.values()) != list(range(len(vocab))):
        raise NotPlainBert("vocabulary ids are not 0..n-1 (a vocab.txt could not reproduce them)")
    if any("\n" in t or "\r" in t or t != t.strip() for t in vocab):
        raise NotPlainBert("a vocabulary entry has whitespace a vocab.txt line cannot hold")
    cls, sep = _template(post)
    specials = []
    for added in raw.get("added_tokens", []):
        flags = (added.get("single_word"), added.get("lstrip"), added.get("rstrip"), added.get("normalized"))
        if not added.get("special") or any(flags) or vocab.get(added["content"]) != added["id"]:
            raise NotPlainBert(f"added token {added['content']!r} is not a plain special token of the vocabulary")
        specials.append(added["content"])
    for name, token in (("cls", cls), ("sep", sep)):
        if vocab.get(token[0]) != token[1]:
            raise NotPlainBert(f"{name} token {token} does not match the vocabulary")
    return {
        "clean_text": bool(norm["clean_text"]),
        "handle_chinese_chars": bool(norm["handle_chinese_chars"]),
        "strip_accents": norm.get("strip_accents"),
        "lowercase": bool(norm["lowercase"]),
        "unk_token": model["unk_token"],
        "continuing_subword_prefix": model["continuing_subword_prefix"],
        "max_input_chars_per_word": int(model["max_input_chars_per_word"]),
        "cls": list(cls),
        "sep": list(sep),
        "special_tokens": specials,
    }


def _template(post: Any) -> tuple[tuple[str, int], tuple[str, int]]:
    if post and post.get("type") == "BertProcessing":
        return (post["cls"][0], int(post["cls"][1])), (post["sep"][0], int(post["sep"][1]))
    if not post or post.get("type") != "TemplateProcessing":
        raise NotPlainBert(f"post-processor {post and post.get('type')} is neither BERT's template nor BertProcessing")
    single = post["single"]
    shape = [(next(iter(p)), p[next(iter(p))]["id"], p[next(iter(p))]["type_id"]) for p in single]
    if len(shape) != 3 or [s[0] for s in shape] != ["SpecialToken", "Sequence", "SpecialToken"] or shape[1][1] != "A":
        raise NotPlainBert(f"post-processor template {single} is not [CLS] $A [SEP]")
    if any(s[2] != 0 for s in shape):
        raise NotPlainBert("post-processor template uses a type id other than 0")
    tokens = post["special_tokens"]
    cls, sep = shape[0][1], shape[2][1]
    return (cls, int(tokens[cls]["ids"][0])), (sep, int(tokens[sep]["ids"][0]))


def prove_tokenizer(path: Path, max_length: int, pad_id: int, vocab_dir: Path) -> dict[str, Any]:
    """Check the shortcut for the tokenizer.json at `path` (truncation `max_length`, pad id `pad_id`) on
    HARD_CASES, single texts and pairs; write `vocab_dir`/vocab.txt and return the manifest's
    `tokenizer.shortcut` entry. Raises NotPlainBert (nothing written) when the tokenizer is not plain BERT or
    any id, type id or mask differs. A pack-time step of `warmstart pack` (infra.pack.hf_pack) and of
    `warmstart optimize` (for packs made before it)."""
    from tokenizers import Tokenizer, __version__

    from handler.tasks.tokens import TextEncoder

    raw = json.loads(path.read_text(encoding="utf-8"))
    settings = bert_settings(raw)
    vocab = raw["model"]["vocab"]
    tmp = vocab_dir / f".{VOCAB}.tmp"
    tmp.write_text("".join(t + "\n" for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])), encoding="utf-8")
    try:
        reference = TextEncoder(path, max_length, pad_id)
        # The runtime's own construction (TextEncoder → handler.tasks.tokens.bert_wordpiece), so the proof covers it.
        shortcut = TextEncoder(path, max_length, pad_id, shortcut=(tmp, settings))
        if shortcut._tok.get_vocab_size() != Tokenizer.from_str(json.dumps(raw)).get_vocab_size():
            raise NotPlainBert("vocabulary sizes differ")
        batches: list[list[Any]] = [[case] for case in HARD_CASES] + [HARD_CASES, HARD_CASES[::3]]
        # Pairs (rerank, classify: a query and a document), truncated "longest_first" and type ids on the second.
        pairs = list(zip(HARD_CASES, HARD_CASES[::-1], strict=True))
        batches += [[pair] for pair in pairs[::4]] + [pairs]
        for batch in batches:
            a, b = reference.tokenize(batch), shortcut.tokenize(batch)
            same = len(a) == len(b) and all(
                x.ids == y.ids and x.attention_mask == y.attention_mask and x.type_ids == y.type_ids
                for x, y in zip(a, b, strict=True)
            )
            if not same:
                first = batch[0] if isinstance(batch[0], str) else " / ".join(batch[0])
                raise NotPlainBert(f"ids differ on {first[:60]!r} (batch of {len(batch)})")
        os.replace(tmp, vocab_dir / VOCAB)
    finally:
        tmp.unlink(missing_ok=True)
    return {
        "kind": "wordpiece",
        "vocab": VOCAB,
        "settings": settings,
        "proof": {
            "tokenizer_sha256": sha256_file(path),
            "cases": len(HARD_CASES),
            "batches": len(batches),
            "pairs": len(pairs),
            "tokenizers": __version__,
        },
    }


def prove(model_dir: Path) -> dict[str, Any]:
    """The proof for a packed model directory, recorded in its manifest (vocab.txt listed); returns the entry.
    Raises NotPlainBert (nothing written) when the tokenizer is not plain BERT or any id differs."""
    model_dir = model_dir.resolve()
    manifest = load_manifest(model_dir)
    spec = manifest.tokenizer
    if not spec.get("file"):
        raise NotPlainBert(f"{model_dir}: no tokenizer file in the manifest")
    path = manifest.path(spec["file"])
    max_length, pad_id = int(spec.get("truncation") or 512), int(spec.get("pad_id", 0))
    entry = prove_tokenizer(path, max_length, pad_id, model_dir)
    _record(model_dir, entry)
    return entry


def _record(model_dir: Path, entry: dict[str, Any]) -> None:
    path = model_dir / MANIFEST_NAME
    raw = json.loads(path.read_text())
    raw["files"][VOCAB] = {"size": (model_dir / VOCAB).stat().st_size, "sha256": sha256_file(model_dir / VOCAB)}
    raw["tokenizer"]["shortcut"] = entry
    tmp = path.with_name(f".{MANIFEST_NAME}.tmp")
    tmp.write_text(json.dumps(raw, indent=2) + "\n")
    os.replace(tmp, path)
    load_manifest(model_dir)
