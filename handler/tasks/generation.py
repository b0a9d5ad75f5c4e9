"""The `generate` task's checks: the manifest's `generation` facts (`fields`, at model load) and a native request's
fields (`check_request`: each refusal names the field and its valid range), and the WARMSTART_MAX_TOKENS setting.
The task itself (`handler.tasks.generate`) turns a checked request into the engine's request.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from handler.core.config import env_int
from handler.core.errors import InvalidInputError
from handler.core.types import JSON
from handler.tasks import chat

DEFAULT_MAX_TOKENS = 4096
MAX_STOPS = 4
MAX_SEED = (1 << 63) - 1
RESPONSE_FORMATS = ("text", "json_object", "json_schema")
FINISH = ("stop", "length")
SPECIAL_TOKENS = ("bos_token", "eos_token", "pad_token", "unk_token")
DEFAULT_KEYS = {"temperature": float, "top_p": float, "top_k": int, "do_sample": bool, "repetition_penalty": float}
KV_DTYPES = {"float32": 4, "float16": 2}


def max_tokens_setting(environ: Mapping[str, str] | None = None) -> int:
    """WARMSTART_MAX_TOKENS: the most tokens one request may generate (its `max_tokens` and the default)."""
    env = os.environ if environ is None else environ
    return env_int(env, "WARMSTART_MAX_TOKENS", DEFAULT_MAX_TOKENS, 1, 1 << 20)


# -- the manifest's `generation` -----------------------------------------------------------------------------


def _int(raw: Mapping[str, Any], key: str, lo: int, nullable: bool = False) -> int | None:
    value = raw.get(key)
    if value is None and nullable:
        return None
    if type(value) is not int or value < lo:
        raise ValueError(f"generation.{key} {value!r} is not an integer >= {lo}")
    return value


def fields(raw: dict[str, Any]) -> dict[str, Any]:
    """The manifest's `generation` object, checked (a ValueError names the field): `Manifest.options`."""
    gen = raw.get("generation")
    if not isinstance(gen, dict):
        raise ValueError("a generate model needs 'generation', an object (chat template, tokens, context length)")
    template = gen.get("chat_template")
    if template is not None and not isinstance(template, str):
        raise ValueError("generation.chat_template must be a string or null")
    specials = gen.get("special_tokens") or {}
    if not isinstance(specials, dict) or not all(v is None or isinstance(v, str) for v in specials.values()):
        raise ValueError("generation.special_tokens must map token names to strings or null")
    eos = gen.get("eos_token_ids")
    if not isinstance(eos, list) or not all(type(i) is int and i >= 0 for i in eos):
        raise ValueError(f"generation.eos_token_ids {eos!r} is not a list of token ids")
    add_bos = gen.get("add_bos_token", False)
    if not isinstance(add_bos, bool):
        raise ValueError(f"generation.add_bos_token {add_bos!r} is not true or false")
    defaults = gen.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise ValueError("generation.defaults must be an object")
    checked_defaults: dict[str, Any] = {}
    for key, value in defaults.items():
        kind = DEFAULT_KEYS.get(key)
        if kind is None:
            continue  # a generation_config key this task does not use
        if kind is bool and not isinstance(value, bool):
            raise ValueError(f"generation.defaults.{key} {value!r} is not true or false")
        if kind is not bool and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise ValueError(f"generation.defaults.{key} {value!r} is not a number")
        checked_defaults[key] = kind(value)
    kv = gen.get("kv")
    checked_kv = None
    if kv is not None:
        if not isinstance(kv, dict) or kv.get("dtype") not in KV_DTYPES:
            valid = ", ".join(KV_DTYPES)
            raise ValueError(f"generation.kv {kv!r}: needs layers, kv_heads, head_dim and dtype ({valid})")
        checked_kv = {k: _int(kv, k, 1) for k in ("layers", "kv_heads", "head_dim")} | {"dtype": kv["dtype"]}
    return {
        "chat_template": template,
        "special_tokens": {k: specials.get(k) for k in SPECIAL_TOKENS}
        | {k: v for k, v in specials.items() if k not in SPECIAL_TOKENS},
        "bos_token_id": _int(gen, "bos_token_id", 0, nullable=True),
        "eos_token_ids": list(eos),
        "pad_token_id": _int(gen, "pad_token_id", 0, nullable=True),
        "add_bos_token": add_bos,
        "context_length": _int(gen, "context_length", 1),
        "vocab_size": _int(gen, "vocab_size", 1),
        "defaults": checked_defaults,
        "kv": checked_kv,
    }


def kv_bytes_per_token(options: Mapping[str, Any]) -> int | None:
    """KV-cache bytes one token holds (2 x layers x kv heads x head dim x the dtype's size), None when unknown."""
    kv = options.get("kv")
    if not kv:
        return None
    return int(2 * kv["layers"] * kv["kv_heads"] * kv["head_dim"] * KV_DTYPES[kv["dtype"]])


# -- the request ---------------------------------------------------------------------------------------------


def _number(payload: Mapping[str, Any], key: str, lo: float, hi: float, lo_open: bool = False) -> float | None:
    value = payload.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise InvalidInputError(f'"{key}" must be a number, got {value!r}')
    if value > hi or value < lo or (lo_open and value == lo):
        low = f"> {lo}" if lo_open else f">= {lo}"
        raise InvalidInputError(f'"{key}" must be {low} and <= {hi}, got {value!r}')
    return float(value)


def _integer(payload: Mapping[str, Any], key: str, lo: int, hi: int) -> int | None:
    value = payload.get(key)
    if value is None:
        return None
    if type(value) is not int:
        raise InvalidInputError(f'"{key}" must be an integer, got {value!r}')
    if not lo <= value <= hi:
        raise InvalidInputError(f'"{key}" must be from {lo} to {hi}, got {value}')
    return value


def check_stop(value: Any) -> list[str]:
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if (
        not isinstance(stops, list)
        or not 1 <= len(stops) <= MAX_STOPS
        or not all(isinstance(s, str) and s for s in stops)
    ):
        raise InvalidInputError(f'"stop" must be a non-empty string or a list of 1 to {MAX_STOPS} non-empty strings')
    return list(stops)


def check_response_format(value: Any) -> dict[str, Any] | None:
    """`response_format` → the engine's constraint: None (free text), json_object, or json_schema's schema."""
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in RESPONSE_FORMATS:
        raise InvalidInputError(f'"response_format.type" {kind!r}; valid: {", ".join(RESPONSE_FORMATS)}')
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    spec = value.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if not isinstance(schema, dict):
        raise InvalidInputError('"response_format.json_schema.schema" must be a JSON Schema object')
    if not isinstance(spec.get("name", ""), str) or not isinstance(spec.get("strict", False), bool | None):
        raise InvalidInputError('"response_format.json_schema": name must be a string and strict true or false')
    return {"type": "json_schema", "schema": schema}


def check_request(payload: JSON, cap: int) -> dict[str, Any]:
    """The request's fields, checked: `{"messages" | "prompt", "max_tokens", "temperature", ..., "stop"}`
    (None where not given)."""
    if not isinstance(payload, dict):
        raise InvalidInputError('the request must be a JSON object with "messages" or "prompt"')
    has_messages, has_prompt = payload.get("messages") is not None, payload.get("prompt") is not None
    if has_messages == has_prompt:
        raise InvalidInputError('give exactly one of "messages" (a chat) or "prompt" (raw text)')
    out: dict[str, Any] = {}
    if has_messages:
        out["messages"] = chat.check_messages(payload["messages"])
    else:
        if not isinstance(payload["prompt"], str) or not payload["prompt"]:
            raise InvalidInputError('"prompt" must be a non-empty string')
        out["prompt"] = payload["prompt"]
    out["max_tokens"] = _integer(payload, "max_tokens", 1, cap)
    out["temperature"] = _number(payload, "temperature", 0, 2)
    out["top_p"] = _number(payload, "top_p", 0, 1, lo_open=True)
    out["top_k"] = _integer(payload, "top_k", 0, 1 << 31)
    out["seed"] = _integer(payload, "seed", -MAX_SEED - 1, MAX_SEED)
    out["stop"] = check_stop(payload.get("stop"))
    out["response_format"] = check_response_format(payload.get("response_format"))
    kwargs = payload.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise InvalidInputError('"chat_template_kwargs" must be an object, e.g. {"enable_thinking": false}')
    if kwargs and has_prompt:
        raise InvalidInputError('"chat_template_kwargs" is for "messages"; a raw "prompt" is not templated')
    out["chat_template_kwargs"] = kwargs or {}
    if not isinstance(payload.get("stream", False), bool):
        raise InvalidInputError(f'"stream" must be true or false, got {payload["stream"]!r}')
    if payload.get("model") is not None and not isinstance(payload["model"], str):
        raise InvalidInputError('"model" must be a string')
    return out
