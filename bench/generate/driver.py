"""The child side of bench/generate/run.py: one generator in one long-lived process.

  serve KIND --model DIR [--threads N]
      load (the cold start: spawn → this process's first token is timed by the parent through the ready line,
      which is printed only after one generated token), then for each JSON line on stdin
      ({"prompt_tokens": n, "max_tokens": m}) generate greedily and print {"ttft_ms", "decode_tps", "tokens"}

KIND: ours (handler.app's runtime, the whole per-request path of the HTTP host's streamed answer: the task's
pieces as a client gets them) or transformers (AutoModelForCausalLM.generate with a streamer timing each token,
torch's intra-op threads set to ours).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

KINDS = ("ours", "transformers")
MARK = "generate-driver:"
WORDS = (  # noqa: SIM905 (a sentence reads better than 41 quoted words)
    "the cold start of a function is the time from nothing to its first answer and a small model serving chat "
    "from a function pays it on every new instance so the loading path matters as much as the decode loop"
).split()


def prompt_text(tokenizer: Any, n: int) -> str:
    """Text of about `n` tokens (within a few) for `tokenizer` (a `tokenizers.Tokenizer`)."""
    words: list[str] = []
    while len(tokenizer.encode(" ".join(words), add_special_tokens=False).ids) < n:
        words.extend(WORDS)
    while len(words) > 1 and len(tokenizer.encode(" ".join(words), add_special_tokens=False).ids) > n:
        words.pop()
    return " ".join(words)


class Ours:
    def __init__(self, model: str, threads: int | None) -> None:
        from handler import app  # the init: the same import Lambda runs

        self.runtime = app.runtime
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(f"{model}/tokenizer.json")

    def generate(self, text: str, max_tokens: int) -> dict[str, Any]:
        raw = json.dumps({"prompt": text, "max_tokens": max_tokens, "temperature": 0, "stream": True}).encode()
        t0 = time.perf_counter()
        first = None
        tokens = 0
        for piece in self.runtime.handle_http_stream(raw):
            if isinstance(piece, tuple):
                raise RuntimeError(f"not streamed: {piece[:2]}")
            n = len(piece.get("token_ids") or [])
            if n and first is None:
                first = time.perf_counter()
            tokens += n
        end = time.perf_counter()
        assert first is not None
        return {
            "ttft_ms": (first - t0) * 1000,
            "decode_tps": (tokens - 1) / (end - first) if tokens > 1 and end > first else 0.0,
            "tokens": tokens,
        }


class Transformers:
    def __init__(self, model: str, threads: int | None) -> None:
        import torch
        import transformers

        if threads:
            torch.set_num_threads(threads)
        self.torch = torch
        self.model = transformers.AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
        self.hf_tokenizer = transformers.AutoTokenizer.from_pretrained(model)
        self.tokenizer = self.hf_tokenizer.backend_tokenizer

    def generate(self, text: str, max_tokens: int) -> dict[str, Any]:
        times: list[float] = []

        class Timer:  # transformers' streamer protocol: put(prompt ids) first, then one put per token
            def __init__(self) -> None:
                self.calls = 0

            def put(self, value: Any) -> None:
                self.calls += 1
                if self.calls > 1:
                    times.append(time.perf_counter())

            def end(self) -> None:
                pass

        ids = self.torch.tensor([self.tokenizer.encode(text, add_special_tokens=False).ids])
        t0 = time.perf_counter()
        with self.torch.inference_mode():
            self.model.generate(
                ids,
                attention_mask=self.torch.ones_like(ids),
                max_new_tokens=max_tokens,
                min_new_tokens=max_tokens,
                do_sample=False,
                streamer=Timer(),
                pad_token_id=0,
            )
        first, end = times[0], times[-1]
        return {
            "ttft_ms": (first - t0) * 1000,
            "decode_tps": (len(times) - 1) / (end - first) if len(times) > 1 else 0.0,
            "tokens": len(times),
        }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["serve"])
    ap.add_argument("kind", choices=KINDS)
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    gen = (Ours if args.kind == "ours" else Transformers)(args.model, args.threads)
    loaded = time.perf_counter()
    first = gen.generate(prompt_text(gen.tokenizer, 16), 1)
    print(MARK + json.dumps({"load_ms": (loaded - t0) * 1000, "first": first}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        text = prompt_text(gen.tokenizer, int(request["prompt_tokens"]))
        print(MARK + json.dumps(gen.generate(text, int(request["max_tokens"]))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
