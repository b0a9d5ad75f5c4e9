"""The built-in calibration prompts of a generate pack's quality gate (infra.pack.lm_quality): short chat turns
of different kinds (a question, an instruction, code, JSON, another language, a number), each rendered with the
model's own chat template. `--calibration FILE` replaces them (one user message per line)."""

from __future__ import annotations

PROMPTS = (
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "Explain step by step how a lambda function answers a request.",
    'Give me a JSON object with the keys "name", "age" and "city".',
    "def add(a, b):\n    return",
    "Traduis en français : the quick brown fox jumps over the lazy dog.",
    "日本語で自己紹介してください。",
    "What is 12 times 7? Answer with a number only.",
)
NEW_TOKENS = 16  # greedy tokens compared per prompt


def builtin_prompts() -> list[str]:
    return list(PROMPTS)
