"""The built-in calibration set: varied texts a reduced-precision pack is compared on against float32.

Generated here, deterministically (a seeded generator over word lists written in this file), never
downloaded: the shapes that break reduced precision first. Empty and whitespace-only texts, one word, emoji,
CJK, Arabic, Cyrillic, Greek, Hindi, code, numbers and dates, URLs, repeated characters, mixed scripts, and
texts past any model's max length (truncated: the last position's activations are the largest). `--calibration
FILE` replaces it: one text per line (JSON lines of strings also accepted, for texts holding newlines).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

DEFAULT_SIZE = 400

_EN = (
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "the",
    "lazy",
    "dog",
    "while",
    "a",
    "cold",
    "start",
    "waits",
    "for",
    "the",
    "first",
    "answer",
    "from",
    "a",
    "model",
    "that",
    "maps",
    "its",
    "weights",
    "into",
    "memory",
    "and",
    "serves",
    "embeddings",
    "to",
    "a",
    "search",
    "index",
    "of",
    "product",
    "reviews",
    "news",
    "articles",
    "medical",
    "notes",
    "legal",
    "contracts",
    "recipes",
    "travel",
    "guides",
    "and",
    "customer",
    "support",
    "tickets",
    "about",
    "billing",
    "refunds",
    "passwords",
    "shipping",
    "delays",
    "broken",
    "screens",
    "and",
    "weather",
    "forecasts",
    "for",
    "tomorrow",
    "morning",
)
_PHRASES = (
    "What is the capital of France?",
    "How do I reset my password?",
    "Paris is the capital and most populous city of France.",
    "The mitochondria is the powerhouse of the cell.",
    "I loved this product, would buy again!!!",
    "Worst purchase ever. Do not recommend.",
    "Refund request for order #48213",
    "Machine learning models need careful evaluation.",
    "Berlin is the capital of Germany.",
    "The patient presented with acute chest pain and shortness of breath.",
)
_OTHER = (
    "Le renard brun rapide saute par-dessus le chien paresseux.",
    "Der schnelle braune Fuchs springt über den faulen Hund.",
    "El rápido zorro marrón salta sobre el perro perezoso.",
    "A rápida raposa marrom pula sobre o cão preguiçoso.",
    "Быстрая коричневая лиса прыгает через ленивую собаку.",
    "Η γρήγορη καφέ αλεπού πηδάει πάνω από τον τεμπέλη σκύλο.",  # noqa: RUF001 (Greek, on purpose)
    "الثعلب البني السريع يقفز فوق الكلب الكسول.",
    "तेज़ भूरी लोमड़ी आलसी कुत्ते के ऊपर कूदती है।",
    "敏捷的棕色狐狸跳过了懒狗。",
    "素早い茶色の狐がのろまな犬を飛び越える。",
    "빠른 갈색 여우가 게으른 개를 뛰어넘는다.",
    "Hızlı kahverengi tilki tembel köpeğin üzerinden atlar.",  # noqa: RUF001 (Turkish, on purpose)
    "Szybki brązowy lis przeskakuje nad leniwym psem.",
    "naïve café façade coöperate résumé",
)
_CJK = (
    "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着"
    "去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主"
    "行方又如前所本见经头面公同三已老从动两长"
)
_EMOJI = "😀😂🥲😍🤔🙄😴🤯🥳😎👍👎🙏💪🔥✨🎉❤️💔🚀🌍🍕☕🐍🐈⚽🎸📈🧪🔒✅❌⚠️🇫🇷🇯🇵👩‍💻👨‍👩‍👧"
_CODE = (
    "def add(a, b):\n    return a + b",
    "for (let i = 0; i < n; i++) { sum += xs[i]; }",
    "SELECT id, name FROM users WHERE created_at > '2024-01-01' ORDER BY id DESC LIMIT 10;",
    '{"model": "all-minilm-l6-v2", "inputs": ["hello"], "dimensions": 128}',
    '#include <stdio.h>\nint main(void) { printf("%d\\n", 42); return 0; }',
    "git commit -m 'fix: off-by-one in the tokenizer' && git push origin main",
    '<div class="card"><a href="https://example.com/?q=1&r=2">link</a></div>',
    "x = np.einsum('bij,bjk->bik', a, b)  # batched matmul",
)


def builtin_texts(size: int = DEFAULT_SIZE, seed: int = 0) -> list[str]:
    """`size` varied texts (at least the fixed edge cases), the same for the same (size, seed)."""
    rng = random.Random(seed)
    fixed = [
        "",
        " ",
        "\t\n  \n",
        "a",
        "?",
        "😀",
        "中",
        "1234567890",
        "3.14159 2.71828 -0.0001 1e-9 6.022e23",
        "2026-12-04T21:27:29Z",
        "https://example.com/path/to/page?query=string&lang=en#section",
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        "!!!!!!!!!!!!!!!!!!????????????........",
        "THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG",
        *_PHRASES,
        *_OTHER,
        *_CODE,
    ]
    makers = (_sentence, _multilingual, _cjk, _emoji_text, _numbers, _code_like, _long, _noisy)
    texts = fixed[:size]
    while len(texts) < size:
        texts.append(makers[len(texts) % len(makers)](rng))
    return texts


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_EN) for _ in range(n))


def _sentence(rng: random.Random) -> str:
    text = _words(rng, rng.randint(3, 30))
    return text[:1].upper() + text[1:] + rng.choice((".", "?", "!", ""))


def _multilingual(rng: random.Random) -> str:
    return " ".join(rng.sample(_OTHER, rng.randint(1, 3)))


def _cjk(rng: random.Random) -> str:
    return "".join(rng.choice(_CJK) for _ in range(rng.randint(2, 80)))


def _emoji_text(rng: random.Random) -> str:
    parts = [rng.choice(_EMOJI) if rng.random() < 0.5 else rng.choice(_EN) for _ in range(rng.randint(1, 20))]
    return " ".join(parts)


def _numbers(rng: random.Random) -> str:
    kinds = (
        lambda: str(rng.randint(-(10**9), 10**9)),
        lambda: f"{rng.uniform(-1e4, 1e4):.{rng.randint(0, 6)}f}",
        lambda: f"{rng.randint(1, 28):02d}/{rng.randint(1, 12):02d}/{rng.randint(1900, 2100)}",
        lambda: f"+1-{rng.randint(200, 999)}-{rng.randint(100, 999)}-{rng.randint(1000, 9999)}",
        lambda: f"${rng.randint(1, 99999)}.{rng.randint(0, 99):02d}",
    )
    return " ".join(rng.choice(kinds)() for _ in range(rng.randint(1, 12)))


def _code_like(rng: random.Random) -> str:
    name = "_".join(rng.sample(_EN, 2))
    return rng.choice(_CODE) + f"\n{name} = {rng.randint(0, 999)}"


def _long(rng: random.Random) -> str:
    # Past any max length we pack (MiniLM 256 tokens, BERT 512): truncation, and the largest positions.
    parts = [_sentence(rng) for _ in range(rng.randint(60, 120))]
    if rng.random() < 0.3:
        parts.insert(rng.randint(0, len(parts)), _cjk(rng))
    return " ".join(parts)


def _noisy(rng: random.Random) -> str:
    text = list(_sentence(rng))
    for _ in range(rng.randint(1, 8)):
        i = rng.randrange(len(text) + 1)
        text.insert(i, rng.choice("#@%&*~^|\\/<>[]{}\u00a0\u200b\u00e9\u00df\u0301"))
    return "".join(text)


def read_calibration(path: Path) -> list[str]:
    """A user's calibration texts: one per line, or JSON lines of strings. Refused when empty."""
    try:
        raw = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--calibration {path}: cannot read it as UTF-8 text ({e})") from None
    texts: list[str] = []
    for n, line in enumerate(raw.splitlines(), 1):
        if line.startswith('"'):
            try:
                value = json.loads(line)
            except ValueError:
                value = line
            if not isinstance(value, str):
                raise ValueError(f"--calibration {path}: line {n} is JSON but not a string")
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:  # "\ud800": JSON escapes a lone surrogate, which no tokenizer takes
                raise ValueError(f"--calibration {path}: line {n} holds a lone surrogate, not valid Unicode") from None
            texts.append(value)
        else:
            texts.append(line)
    if not texts:
        raise ValueError(f"--calibration {path}: no texts (one per line)")
    return texts


def pairs(texts: list[str], seed: int = 0) -> list[tuple[str, str]]:
    """(query, document) pairs for a reranker: each query with a group of documents, some related."""
    rng = random.Random(seed)
    nonempty = [t for t in texts if t.strip()] or texts
    queries = nonempty[: max(min(8, len(nonempty)), len(texts) // 8)]  # 8 groups at least, where there are texts
    out = []
    for query in queries:
        for _ in range(8):
            doc = rng.choice(texts)
            if rng.random() < 0.3:
                doc = f"{query} {doc}"
            out.append((query, doc))
    return out
