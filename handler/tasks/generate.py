"""The `generate` task: a chat (`messages`) or a raw `prompt` → generated text, streamed as pieces.

The task checks the request (every field named with its valid range), renders the chat with the model's own
template (`handler.tasks.chat`), tokenizes, checks the context, draws the seed, and hands an engine (a backend
that needs "request": `handler.backends.contract.Engine`) the token ids and sampling options. The engine yields
token ids; the task detokenizes them incrementally, cuts stop strings, stops before the invocation's deadline
(`handler.core.deadline`), and ends with the finish reason and usage. `gather` joins the pieces into one answer.

The manifest's `generation` object (chat template, special tokens, eos ids, context length, sampling defaults,
the KV-cache shape) is checked at model load into `Manifest.options`, and the request's fields are checked, by
`handler.tasks.generation`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from handler.backends.contract import Backend, Engine
from handler.backends.pool import BufferPool
from handler.core import deadline
from handler.core.config import Config
from handler.core.errors import InvalidInputError
from handler.core.manifest import Manifest, regular_path
from handler.core.types import JSON
from handler.tasks import chat
from handler.tasks.generation import (
    FINISH,
    MAX_SEED,
    RESPONSE_FORMATS,
    check_request,
    fields,
    max_tokens_setting,
)
from handler.tasks.spec import FLAG, MODEL, STRING, TaskSpec, nullable

PREFIX_TOKENS = 8  # of the prompt, the detokenizer's context for the first generated token
DEADLINE_MARGIN_S = 0.5  # stop this long (plus one step's time) before the invocation's deadline


def held_prefix(text: str, stops: list[str]) -> int:
    """How many characters at the end of `text` could begin a stop string (held back until known not to)."""
    best = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:n]):
                best = n
                break
    return best


class _Decoder:
    """Token ids → text deltas, incrementally: tokenizers' DecodeStream (special tokens skipped) when the
    installed version has it, else the whole text decoded again with the completed prefix cut off."""

    def __init__(self, tokenizer: Any, prompt_ids: list[int]) -> None:
        self.tokenizer = tokenizer
        from tokenizers import decoders

        stream = getattr(decoders, "DecodeStream", None)  # tokenizers >= 0.21
        self.stream = None
        if stream is not None:
            # The prompt's tail as context (as vLLM detokenizes): a first token's leading space, which a
            # SentencePiece decoder drops at the start of a text, is kept.
            try:
                self.stream = stream(ids=prompt_ids[-PREFIX_TOKENS:], skip_special_tokens=True)
            except TypeError:  # a version without the prefix
                self.stream = stream(skip_special_tokens=True)
        self.prefix = prompt_ids[-PREFIX_TOKENS:]
        self.ids: list[int] = []
        self.done = ""
        self.sent = ""  # every delta given so far

    def step(self, token: int) -> str | None:
        if self.stream is not None:
            self.ids.append(token)
            out: str | None = self.stream.step(self.tokenizer, token)
            self.sent += out or ""
            return out
        self.ids.append(token)
        text: str = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):  # a partial UTF-8 character: wait for its next byte
            return None
        delta, self.done = text[len(self.done) :], text
        self.sent += delta
        return delta or None

    def rest(self) -> str:
        """What the tokens hold that no delta gave: the bytes of a character the generation ended inside of.
        Decoded whole as transformers' `decode` gives them (U+FFFD), so the answer is the same text."""
        if not self.ids:
            return ""
        base = self.tokenizer.decode(self.prefix, skip_special_tokens=True)
        full = self.tokenizer.decode(self.prefix + self.ids, skip_special_tokens=True)
        text = full[len(base) :] if full.startswith(base) else ""
        return text[len(self.sent) :] if text.startswith(self.sent) else ""


class GenerateTask:
    name = "generate"

    def __init__(self, manifest: Manifest, backend: Backend | Engine, config: Config, pool: BufferPool | None = None):
        from tokenizers import Tokenizer  # deferred: the tokenizers' extension is imported by the task, not init

        self.engine: Engine = backend  # type: ignore[assignment]  # init paired it: a backend that needs "request"
        self.model = manifest.key
        self.options = manifest.options
        self.context_length: int = self.options["context_length"]
        self.cap = max_tokens_setting()
        tokenizer_path = manifest.path(manifest.tokenizer["file"])
        # The engine may have parsed it beside its model's load (handler.backends.genai: parsed_tokenizer).
        take = getattr(self.engine, "parsed_tokenizer", None)
        parsed = take(tokenizer_path) if callable(take) else None
        if parsed is not None:
            self.tokenizer = parsed
        else:
            with regular_path(tokenizer_path) as path:
                self.tokenizer = Tokenizer.from_file(path)
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        # The engine's own limit on one request's tokens (its KV-cache budget), where it states one.
        limit = getattr(self.engine, "max_total_tokens", None)
        self.max_total = min(self.context_length, limit) if isinstance(limit, int) and limit > 0 else None

    # -- the request → the engine's request --

    def prompt_ids(self, req: Mapping[str, Any]) -> list[int]:
        if "prompt" in req:
            ids: list[int] = self.tokenizer.encode(req["prompt"], add_special_tokens=self.options["add_bos_token"]).ids
            return ids
        template = self.options["chat_template"]
        if template is None:
            raise InvalidInputError('this model has no chat template: send "prompt" (raw text) instead of "messages"')
        text = chat.render(template, req["messages"], self.options["special_tokens"], req["chat_template_kwargs"])
        # The template writes its own special tokens (<|im_start|>, bos): encoded as specials, nothing added.
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        return ids

    def engine_request(self, req: Mapping[str, Any]) -> dict[str, Any]:
        ids = self.prompt_ids(req)
        n = len(ids)
        if n == 0:
            raise InvalidInputError("the prompt is empty once tokenized")
        context = self.context_length
        limit, what = (context, "context length")
        if self.max_total is not None and self.max_total < context:
            limit, what = self.max_total, "the most tokens one request may hold in this instance's memory"
        if req["max_tokens"] is None:
            if n >= limit:
                raise InvalidInputError(f"the prompt is {n} tokens; the model's {what} is {limit}")
            max_tokens = min(self.cap, limit - n)
        else:
            max_tokens = req["max_tokens"]
            if n + max_tokens > limit:
                raise InvalidInputError(
                    f"the prompt's {n} tokens + max_tokens {max_tokens} = {n + max_tokens} exceeds {what} {limit}"
                )
        defaults = self.options["defaults"]
        temperature = req["temperature"]
        if temperature is None:
            temperature = defaults.get("temperature", 1.0) if defaults.get("do_sample") else 0.0
        top_p = req["top_p"] if req["top_p"] is not None else defaults.get("top_p", 1.0)
        top_k = req["top_k"] if req["top_k"] is not None else defaults.get("top_k", 0)
        seed = req["seed"]
        if seed is None:  # drawn fresh: instances restored from one snapshot must not share a stream
            seed = int.from_bytes(os.urandom(8), "little") & MAX_SEED
        return {
            "prompt_ids": ids,
            "max_tokens": max_tokens,
            "temperature": float(temperature),
            "top_p": float(top_p),
            "top_k": int(top_k),
            "seed": seed,
            "eos_token_ids": list(self.options["eos_token_ids"]),
            "response_format": req["response_format"],
        }

    # -- serving --

    def stream(self, payload: JSON) -> Iterator[dict[str, Any]]:
        """The request checked now (an error is the request's, before any piece); the pieces as generated."""
        req = check_request(payload, self.cap)
        request = self.engine_request(req)
        return self._pieces(request, req["stop"])

    def _pieces(self, request: dict[str, Any], stops: list[str]) -> Iterator[dict[str, Any]]:
        tokens = self.engine.submit(request)
        if not isinstance(tokens, Iterator):
            raise TypeError(f"a generate engine's submit returns an iterator, not {type(tokens).__name__}")
        decoder = _Decoder(self.tokenizer, request["prompt_ids"])
        held, held_ids = "", []  # text not yet sent (a possible stop string's start), and its ids
        made, finish, cut_by_stop = 0, "length", False
        step_s, last = 0.0, time.perf_counter()
        try:
            while True:
                left = deadline.remaining_s()
                if left is not None and left < step_s + DEADLINE_MARGIN_S:
                    finish = "length"
                    break
                item = next(tokens, None)
                if item is None:
                    break
                if "finish_reason" in item:
                    finish = item["finish_reason"]
                    break
                token = int(item["token_id"])
                made += 1
                now = time.perf_counter()
                step_s, last = max(step_s * 0.8 + (now - last) * 0.2, now - last), now
                held_ids.append(token)
                delta = decoder.step(token)
                if delta is None:
                    continue
                held += delta
                cut = min((i for i in (held.find(s) for s in stops) if i >= 0), default=-1)
                if cut >= 0:
                    if held[:cut]:
                        yield {"text": held[:cut], "token_ids": held_ids}
                    held, held_ids, finish, cut_by_stop = "", [], "stop", True
                    break
                keep = held_prefix(held, stops) if stops else 0
                if len(held) > keep:
                    yield {"text": held[: len(held) - keep], "token_ids": held_ids}
                    held, held_ids = held[len(held) - keep :], []
        finally:
            close = getattr(tokens, "close", None)
            if callable(close):
                close()  # the engine's generator (and its KV cache) freed now, not at garbage collection
        if not cut_by_stop:
            # Ended inside a character (max_tokens, eos, the deadline): its bytes as transformers decodes them.
            # A stop string the rest completes is still cut.
            held += decoder.rest()
            cut = min((i for i in (held.find(s) for s in stops) if i >= 0), default=-1)
            if cut >= 0:
                held, finish = held[:cut], "stop"
        if held or held_ids:
            yield {"text": held, "token_ids": held_ids}
        n = len(request["prompt_ids"])
        yield {
            "text": "",
            "token_ids": [],
            "finish_reason": finish,
            "usage": {"prompt_tokens": n, "completion_tokens": made, "total_tokens": n + made},
        }

    def gather(self, pieces: Iterable[dict[str, Any]]) -> dict[str, Any]:
        texts, last = [], {}
        for piece in pieces:
            texts.append(piece.get("text", ""))
            last = piece
        return {
            "text": "".join(texts),
            "finish_reason": last.get("finish_reason", "length"),
            "usage": last.get("usage", {}),
            "model": self.model,
        }

    def __call__(self, payload: JSON) -> dict[str, Any]:
        return self.gather(self.stream(payload))

    def warmup(self) -> None:
        """The first run's one-time costs paid off the request path, at the least compute: the chat template
        compiled and rendered (jinja2 imported), the tokenizer's encode and incremental decode, and the engine's
        first prefill and decode step, on a one-word raw prompt (2 tokens generated). The chat's own prompt is
        rendered and tokenized but not run: its prefill would cost ~10 tokens' compute that no request reuses
        (each request gets its own generator and cache; nothing of the warm-up is kept)."""
        if self.options["chat_template"] is not None:  # the template compiled now, not on the first chat
            self.prompt_ids(check_request({"messages": [{"role": "user", "content": "hello"}]}, self.cap))
        for _ in self.stream({"prompt": "hello", "max_tokens": 2, "temperature": 0}):
            pass


USAGE = {
    "type": "object",
    "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
    "properties": {k: {"type": "integer"} for k in ("prompt_tokens", "completion_tokens", "total_tokens")},
}
CONTENT = {
    "anyOf": [
        STRING,
        {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["type", "text"],
                "properties": {"type": {"const": "text"}, "text": STRING},
            },
        },
    ]
}
REQUEST = {
    "title": "generate",
    "type": "object",
    "description": 'exactly one of "messages" or "prompt"',
    "properties": {
        "messages": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["role", "content"],
                "properties": {"role": {"enum": list(chat.ROLES)}, "content": CONTENT},
            },
        },
        "prompt": {"type": "string", "minLength": 1},
        "max_tokens": nullable({"type": "integer", "minimum": 1}),
        "temperature": nullable({"type": "number", "minimum": 0, "maximum": 2}),
        "top_p": nullable({"type": "number", "exclusiveMinimum": 0, "maximum": 1}),
        "top_k": nullable({"type": "integer", "minimum": 0}),
        "seed": nullable({"type": "integer"}),
        "stop": nullable(
            {
                "anyOf": [
                    {"type": "string", "minLength": 1},
                    {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1, "maxItems": 4},
                ]
            }
        ),
        "response_format": nullable(
            {
                "type": "object",
                "required": ["type"],
                "properties": {
                    "type": {"enum": list(RESPONSE_FORMATS)},
                    "json_schema": {
                        "type": "object",
                        "required": ["schema"],
                        "properties": {"name": STRING, "schema": {"type": "object"}, "strict": FLAG},
                    },
                },
            }
        ),
        "chat_template_kwargs": nullable({"type": "object"}),
        "stream": FLAG,
        "model": MODEL,
    },
}
PIECE = {
    "type": "object",
    "required": ["text", "token_ids"],
    "properties": {
        "text": STRING,
        "token_ids": {"type": "array", "items": {"type": "integer"}},
        "finish_reason": {"enum": list(FINISH)},
        "usage": USAGE,
    },
}
ANSWER = {
    "title": "generate",
    "type": "object",
    "required": ["text", "finish_reason", "usage", "model"],
    "properties": {"text": STRING, "finish_reason": {"enum": list(FINISH)}, "usage": USAGE, "model": STRING},
}

SPEC = TaskSpec(
    name=GenerateTask.name,
    factory=GenerateTask,
    request=REQUEST,
    answer=ANSWER,
    example={"messages": [{"role": "user", "content": "hello"}], "max_tokens": 16},
    fields=fields,
    routes=("/v1/chat/completions", "/v1/completions"),
    streams=True,
    gives=("request",),
)
