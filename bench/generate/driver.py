"""The child side of bench/generate/run.py: one generator in one long-lived process.

  serve KIND --model DIR [--threads N]
      load (the cold start: spawn → this process's first token is timed by the parent through the ready line,
      which is printed only after one generated token), then for each JSON line on stdin
      ({"prompt_tokens": n, "max_tokens": m}) generate greedily and print {"ttft_ms", "decode_tps", "tokens"}
      (ours also "ttft_cpu_ms": the process's CPU time to the first token);
      llama and genai also answer {"op": "greedy", "ids": [...], "new_tokens": n} -> {"ids"} (greedy continuation)
      and {"op": "nll", "ids": [...]} -> {"nll": [...]} (each token's negative log-likelihood after its prefix),
      for bench/generate/peers.py's quality figures

KIND: ours (handler.app's runtime, the whole per-request path of the HTTP host's streamed answer: the task's
pieces as a client gets them), transformers (AutoModelForCausalLM.generate with a streamer timing each token,
torch's intra-op threads set to ours), llama (llama-cpp-python on a GGUF file, run by the python of the venv
peers.py builds: only the stdlib and llama_cpp are imported on that side) or genai (onnxruntime-genai's own
generator loop on our pack's model.onnx: the engine without warmstart's task around it).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from typing import Any

KINDS = ("ours", "transformers", "llama", "genai")
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
        report = app.runtime.init_report  # the init's phases, for bench/generate/cold.py
        self.init = {
            "phases_ms": report.get("phases_ms"),
            "total_ms": report.get("total_ms"),
            "coldstart": report.get("coldstart"),  # which decoder genai opened, for bench/generate/rss.py
        }
        # The prompt's tokenizer is the task's own (already parsed by init): a second parse of a 151k-token
        # tokenizer.json here (~0.3 s CPU) would be counted in ours' cold start and in no peer's.
        self.tokenizer = getattr(app.runtime.task, "tokenizer", None)
        if self.tokenizer is None:
            from tokenizers import Tokenizer

            self.tokenizer = Tokenizer.from_file(f"{model}/tokenizer.json")

    def generate(self, text: str, max_tokens: int) -> dict[str, Any]:
        raw = json.dumps({"prompt": text, "max_tokens": max_tokens, "temperature": 0, "stream": True}).encode()
        t0, cpu0 = time.perf_counter(), time.process_time()
        first = None
        tokens = 0
        for piece in self.runtime.handle_http_stream(raw):
            if isinstance(piece, tuple):
                raise RuntimeError(f"not streamed: {piece[:2]}")
            n = len(piece.get("token_ids") or [])
            if n and first is None:
                first, first_cpu = time.perf_counter(), time.process_time()
            tokens += n
        end = time.perf_counter()
        assert first is not None
        return {
            "ttft_ms": (first - t0) * 1000,
            # the process's CPU (every thread) to the first token: the prompt's cost, steadier than its wall time
            "ttft_cpu_ms": (first_cpu - cpu0) * 1000,
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


def timed(tokens: Iterator[int]) -> dict[str, Any]:
    """Time to the first of `tokens` (from now) and the decode rate after it, for the peers' drivers."""
    t0 = time.perf_counter()
    times = [time.perf_counter() for _ in tokens]
    first, end = times[0], times[-1]
    return {
        "ttft_ms": (first - t0) * 1000,
        "decode_tps": (len(times) - 1) / (end - first) if len(times) > 1 else 0.0,
        "tokens": len(times),
    }


class _Ids:
    def __init__(self, ids: list[int]) -> None:
        self.ids = ids


class LlamaTokenizer:
    """`prompt_text`'s view of a llama.cpp model's own tokenizer (the GGUF's vocabulary)."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm

    def encode(self, text: str, add_special_tokens: bool = False) -> _Ids:
        return _Ids(self.llm.tokenize(text.encode(), add_bos=add_special_tokens, special=False))


def log_softmax_at(logits: Any, token: int) -> float:
    """-log p(token) from one row of logits (numpy), computed stably."""
    import numpy as np

    row = np.asarray(logits, dtype=np.float64)
    top = row.max()
    return float(top + np.log(np.exp(row - top).sum()) - row[token])


class Llama:
    """llama-cpp-python as its users call it: `Llama(model_path)` (the file mapped), greedy by `generate` with
    top_k 1; the KV cache reset before each request so nothing of the previous prompt is reused."""

    def __init__(self, model: str, threads: int | None, ctx: int = 1024) -> None:
        import llama_cpp

        kwargs: dict[str, Any] = {"n_ctx": ctx, "n_batch": 512, "verbose": False, "logits_all": False}
        if threads:
            kwargs.update(n_threads=threads, n_threads_batch=threads)
        self.llm = llama_cpp.Llama(model_path=model, **kwargs)
        self.tokenizer = LlamaTokenizer(self.llm)
        self.model_path, self.kwargs = model, kwargs
        self._scoring: Any = None

    def _greedy(self, ids: list[int], max_tokens: int) -> Iterator[int]:
        self.llm.reset()
        steps = self.llm.generate(ids, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0, reset=True)
        for n, token in enumerate(steps, 1):
            yield int(token)
            if n >= max_tokens:
                return

    def generate(self, text: str, max_tokens: int) -> dict[str, Any]:
        ids = self.tokenizer.encode(text).ids
        return timed(self._greedy(ids, max_tokens))

    def greedy(self, ids: list[int], new_tokens: int) -> list[int]:
        return list(self._greedy(ids, new_tokens))

    def nll(self, ids: list[int]) -> list[float]:
        import llama_cpp

        if self._scoring is None:  # every position's logits: a second context, made once, for quality runs only
            self._scoring = llama_cpp.Llama(model_path=self.model_path, **{**self.kwargs, "logits_all": True})
        self._scoring.reset()
        self._scoring.eval(ids)
        scores = self._scoring.scores  # (n_ctx, vocab); row i: the logits after ids[: i + 1]
        return [log_softmax_at(scores[i], ids[i + 1]) for i in range(len(ids) - 1)]


class Genai:
    """onnxruntime-genai's own loop on a pack (its model.onnx + genai_config.json), the session's threads set as
    the genai backend sets them, the pack's tokenizer.json through `tokenizers` (the builder's tokenizer files
    are not packed)."""

    def __init__(self, model: str, threads: int | None) -> None:
        import onnxruntime_genai as og
        from tokenizers import Tokenizer

        self.og = og
        config = og.Config(model)
        if threads:
            session = {"intra_op_num_threads": threads, "inter_op_num_threads": 1}
            config.overlay(json.dumps({"model": {"decoder": {"session_options": session}}}))
        config.clear_providers()
        self.model = og.Model(config)
        self.tokenizer = Tokenizer.from_file(f"{model}/tokenizer.json")

    def _generator(self, ids: list[int], new_tokens: int) -> Any:
        params = self.og.GeneratorParams(self.model)
        params.set_search_options(do_sample=False, max_length=len(ids) + new_tokens)
        return self.og.Generator(self.model, params)

    def _greedy(self, ids: list[int], new_tokens: int) -> Iterator[int]:
        generator = self._generator(ids, new_tokens)
        generator.append_tokens(ids)
        n = 0
        while n < new_tokens and not generator.is_done():
            generator.generate_next_token()
            yield int(generator.get_next_tokens()[0])
            n += 1

    def generate(self, text: str, max_tokens: int) -> dict[str, Any]:
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        return timed(self._greedy(ids, max_tokens))

    def greedy(self, ids: list[int], new_tokens: int) -> list[int]:
        return list(self._greedy(ids, new_tokens))

    def nll(self, ids: list[int]) -> list[float]:
        import numpy as np

        generator = self._generator(ids, 1)
        out = []
        for i in range(len(ids) - 1):  # teacher-forced, one token a step: the loop's logits are the last row's
            generator.append_tokens([ids[i]])
            out.append(log_softmax_at(np.asarray(generator.get_logits())[0, -1], ids[i + 1]))
        return out


ENGINES = {"ours": Ours, "transformers": Transformers, "llama": Llama, "genai": Genai}


def answer(gen: Any, request: dict[str, Any]) -> dict[str, Any]:
    """One request line's answer: a timed generation, or a quality op (llama, genai)."""
    op = request.get("op", "generate")
    if op == "greedy":
        return {"ids": gen.greedy([int(i) for i in request["ids"]], int(request["new_tokens"]))}
    if op == "nll":
        return {"nll": gen.nll([int(i) for i in request["ids"]])}
    if op != "generate":
        raise ValueError(f"op {op!r}; valid: generate, greedy, nll")
    text = prompt_text(gen.tokenizer, int(request["prompt_tokens"]))
    return dict(gen.generate(text, int(request["max_tokens"])))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["serve"])
    ap.add_argument("kind", choices=KINDS)
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    gen = ENGINES[args.kind](args.model, args.threads)
    loaded = time.perf_counter()
    first = gen.generate(prompt_text(gen.tokenizer, 16), 1)
    hello = {"load_ms": (loaded - t0) * 1000, "first": first, "init": getattr(gen, "init", None)}
    print(MARK + json.dumps(hello), flush=True)
    for line in sys.stdin:
        print(MARK + json.dumps(answer(gen, json.loads(line))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
