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
from typing import Any

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


# The retrieval check beside cosine (infra.pack.quality.retrieval): queries, each with one document written to
# answer it, among documents on other topics. Top-1/top-10 agreement of a reduced precision with float32.
RETRIEVAL_QUERIES = (
    "What is the capital of France?",
    "How do I reset my password?",
    "What causes chest pain and shortness of breath?",
    "How long does shipping take?",
    "Can I get a refund for a broken screen?",
    "What will the weather be tomorrow morning?",
    "How do I bake bread at home?",
    "Which programming language is best for data science?",
    "Who wrote the theory of relativity?",
    "How much does the premium plan cost?",
    "Wie spät ist es in Berlin?",
    "東京の人口は何人ですか？",  # noqa: RUF001 (Japanese punctuation, on purpose)
)
RETRIEVAL_DOCS = (
    "Paris is the capital and most populous city of France.",
    "To reset your password, open settings, choose security and follow the link we email you.",
    "Acute chest pain with shortness of breath can signal a heart attack or a pulmonary embolism.",
    "Standard shipping takes three to five business days; express arrives the next day.",
    "Screens broken on arrival are refunded in full within thirty days of purchase.",
    "Tomorrow morning will be cloudy with light rain clearing by noon.",
    "Mix flour, water, salt and yeast, let the dough rise overnight and bake at 230 degrees.",
    "Python is the most widely used language for data science, with numpy and pandas.",
    "Albert Einstein published the special theory of relativity in 1905.",
    "The premium plan costs twelve dollars a month, billed yearly.",
    "In Berlin gilt die mitteleuropäische Zeit, eine Stunde vor UTC.",
    "東京都の人口は約1400万人です。",
    "Berlin is the capital of Germany.",
    "Madrid is the capital of Spain and its largest city.",
    "The mitochondria is the powerhouse of the cell.",
    "Our support team answers billing questions on weekdays.",
    "Passwords must be at least twelve characters long.",
    "A balanced diet includes vegetables, grains and protein.",
    "The stock market fell sharply after the announcement.",
    "Cats sleep for up to sixteen hours a day.",
    "The football match ended in a draw after extra time.",
    "Rust guarantees memory safety without a garbage collector.",
    "Mount Everest is the highest mountain above sea level.",
    "Coffee contains caffeine, a natural stimulant.",
    "The museum opens at nine and closes at six.",
    "Electric cars are charged at home or at public stations.",
    "Photosynthesis turns light, water and carbon dioxide into sugar.",
    "The contract may be terminated with thirty days notice.",
    "Hotels near the beach are booked out in August.",
    "Vaccines train the immune system to recognize a pathogen.",
    "The recipe calls for two eggs and a cup of sugar.",
    "Jupiter is the largest planet in the solar system.",
    "Gradient descent updates weights against the gradient of the loss.",
    "Le musée du Louvre est le musée le plus visité du monde.",
    "El tren sale de la estación a las ocho de la mañana.",
    "Москва является столицей России.",
    "서울은 대한민국의 수도이다.",
    "The library lends books for three weeks at a time.",
    "Solar panels convert sunlight into electricity.",
    "The meeting was moved to Thursday afternoon.",
)


def retrieval_texts() -> list[str]:
    """The retrieval check's queries, then its documents (infra.pack.quality finds them by text)."""
    return [*RETRIEVAL_QUERIES, *RETRIEVAL_DOCS]


def model_texts(tokenizer: Any, max_length: int) -> list[str]:
    """The texts a model's own tokenizer makes hard, as users send them: its special tokens written as text
    (alone, together, inside a sentence), repetition past `max_length`, a text exactly `max_length` tokens long
    and one a token over, and a text in each script the vocabulary covers (a few of its tokens)."""
    specials = sorted({str(t) for t in getattr(tokenizer, "all_special_tokens", ()) if str(t).strip()})
    out = [*specials, " ".join(specials), "".join(specials)]
    out += [f"the answer is {t} here" for t in specials]
    out += [f"{a} {b}" for a in specials for b in specials if a != b][:20]
    out += ["hello " * (max_length + 50), "the " * (4 * max_length), "ab" * (2 * max_length), "😀" * max_length]
    out += [_exact(tokenizer, max_length, n) for n in (0, 1)]
    out += _scripts(tokenizer)
    return [t for t in dict.fromkeys(out) if t]


def _exact(tokenizer: Any, max_length: int, over: int) -> str:
    """A text of `max_length + over` tokens with the tokenizer's own specials (words added until it is)."""
    words = [_EN[i % len(_EN)] for i in range(max_length)]

    def count(text: str) -> int:  # truncated one past the target: transformers warns of longer sequences
        return len(tokenizer(text, truncation=True, max_length=max_length + over + 1)["input_ids"])

    lo, hi = 0, len(words)
    while lo < hi:  # the longest prefix within the length: tokens grow with words
        mid = (lo + hi + 1) // 2
        if count(" ".join(words[:mid])) <= max_length + over:
            lo = mid
        else:
            hi = mid - 1
    text = " ".join(words[:lo])
    for _ in range(8):  # a word can be several tokens: single-token words fill the rest
        if count(text) >= max_length + over:
            break
        text += " a"
    return text


def _scripts(tokenizer: Any, per_script: int = 24) -> list[str]:
    """A text per Unicode script in the vocabulary (its first letter's name's first word: LATIN, CJK, ARABIC,
    HANGUL...), of up to `per_script` of its tokens, in vocabulary order (deterministic)."""
    import unicodedata

    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    found: dict[str, list[str]] = {}
    for token, _ in sorted(vocab.items(), key=lambda kv: kv[1]):
        word = token.lstrip("#▁Ġ")
        letter = next((c for c in word if c.isalpha()), None)
        if letter is None:
            continue
        script = unicodedata.name(letter, "UNKNOWN").split(" ")[0]
        if script != "LATIN" and len(found.setdefault(script, [])) < per_script:
            found[script].append(word)
    return [" ".join(words) for _, words in sorted(found.items())]
