"""The HTTP API's request and answer shapes, as JSON Schema: the compatible routes validate requests with
them (`check`), and `GET /openapi.json` is written from them (`openapi`), so the document cannot drift from
what is served. Tests validate real answers against the answer schemas (tests/functional/test_openapi.py).

`check` is a small validator for the subset used here (type, enum, const, minimum, minItems, maxItems,
items, properties, required, anyOf, $ref): no third-party import on any path (a full validator costs tens of
milliseconds to import, and Lambda imports this module). Requests may carry fields not named here, as the
APIs we follow allow (OpenAI's `user`, a client's extras): they are ignored. What a route recognises but
refuses (token ids, `normalize: false`, `raw_scores: true`) is refused by the route first, with
`UnsupportedRequestError` and what to do instead; the schemas say what is accepted.

Native requests (`POST /invocations`) are each model's task's, validated by the task
([events.md](../../docs/events.md)); each task's spec (`handler.tasks.spec.TaskSpec`) holds their schemas,
and the document is written from every task's (`openapi(..., tasks)`), a plugin's included.

About one thing (every route's shapes, which refer to each other, and the validator that reads them), hence
its length.
"""

from __future__ import annotations

from typing import Any

from handler.core.errors import InvalidInputError
from handler.tasks.spec import (
    FLAG,
    MODEL,
    NUMBER,
    POSITIVE,
    STRING,
    TEXTS,
    VECTOR,
    VECTOR_OR_BASE64,
    Schema,
    TaskSpec,
    nullable,
)


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


_nullable = nullable
TRUNCATION_DIRECTION: Schema = _nullable(
    {"enum": ["Right", "right"], "description": "the end of a long text is dropped (Left is refused)"}
)

SCHEMAS: dict[str, Schema] = {
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["type", "message"],
                "properties": {"type": STRING, "message": STRING},
            }
        },
        "description": "every answer that is not 2xx; `type` is the error's class (docs/events.md#errors)",
    },
    # -- OpenAI
    "OpenAIEmbeddingsRequest": {
        "type": "object",
        "required": ["input"],
        "properties": {
            "input": TEXTS,
            "model": MODEL,
            "encoding_format": _nullable({"enum": ["float", "base64"]}),
            "dimensions": POSITIVE,
            "user": _nullable(STRING),
        },
    },
    "InfinityEmbeddingsRequest": {
        "type": "object",
        "required": ["input"],
        "properties": {
            "input": {
                "anyOf": [STRING, {"type": "array", "items": STRING, "minItems": 1}],
                "description": 'texts, or with "modality": "image" images as base64 or data:image/...;base64, URLs '
                "(a URL to fetch is refused)",
            },
            "modality": _nullable({"enum": ["text", "image"]}),
            "model": MODEL,
            "encoding_format": _nullable({"enum": ["float", "base64"]}),
            "dimensions": POSITIVE,
            "user": _nullable(STRING),
        },
    },
    "OpenAIEmbeddingsResponse": {
        "type": "object",
        "required": ["object", "data", "model", "usage"],
        "properties": {
            "object": {"const": "list"},
            "data": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["object", "index", "embedding"],
                    "properties": {
                        "object": {"const": "embedding"},
                        "index": {"type": "integer", "minimum": 0},
                        "embedding": VECTOR_OR_BASE64,
                    },
                },
            },
            "model": STRING,
            "usage": {
                "type": "object",
                "required": ["prompt_tokens", "total_tokens"],
                "properties": {"prompt_tokens": {"type": "integer"}, "total_tokens": {"type": "integer"}},
            },
        },
    },
    # -- OpenAI's completions (the generate task)
    "ChatCompletionRequest": {
        "type": "object",
        "required": ["messages"],
        "properties": {
            "messages": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "required": ["role", "content"],
                    "properties": {
                        "role": {
                            "enum": ["system", "user", "assistant", "developer"],
                            "description": "developer is read as system; tool messages are refused (no tools)",
                        },
                        "content": {
                            "anyOf": [
                                STRING,
                                {
                                    "type": "array",
                                    "items": {
                                        "type": "object",
                                        "required": ["type", "text"],
                                        "properties": {"type": {"const": "text"}, "text": STRING},
                                    },
                                },
                            ],
                            "description": "text, or text parts (other part types are refused)",
                        },
                    },
                },
            },
            "model": MODEL,
            "max_completion_tokens": POSITIVE,
            "max_tokens": POSITIVE,
            "chat_template_kwargs": _nullable(
                {"type": "object", "description": "vLLM's: passed to the chat template, e.g. enable_thinking"}
            ),
            "logprobs": _nullable({"enum": [False], "description": "log probabilities are not served"}),
            "top_logprobs": _nullable({"enum": [0], "description": "log probabilities are not served"}),
            "tools": _nullable({"type": "array", "maxItems": 0, "description": "tool calls are not served"}),
            "tool_choice": _nullable({"enum": ["none", "auto"]}),
        },
    },
    "CompletionRequest": {
        "type": "object",
        "required": ["prompt"],
        "properties": {
            "prompt": {
                "anyOf": [STRING, {"type": "array", "items": STRING, "minItems": 1, "maxItems": 1}],
                "description": "raw text (no chat template); a list of one text (token ids refused)",
            },
            "model": MODEL,
            "max_tokens": POSITIVE,
            "best_of": _nullable({"const": 1}),
            "echo": _nullable({"enum": [False], "description": "the prompt is not echoed"}),
            "logprobs": {"type": "null", "description": "log probabilities are not served"},
            "suffix": _nullable({"enum": [""], "description": "insertion is not served"}),
        },
    },
    # -- text-embeddings-inference
    "EmbedRequest": {
        "type": "object",
        "required": ["inputs"],
        "properties": {
            "inputs": TEXTS,
            "normalize": _nullable({"enum": [True], "description": "the model's vectors are normalized"}),
            "truncate": FLAG,
            "truncation_direction": TRUNCATION_DIRECTION,
            "prompt_name": _nullable(STRING),
            "dimensions": POSITIVE,
            "model": MODEL,
        },
    },
    "EmbedResponse": {"type": "array", "items": VECTOR},
    "EmbedSparseRequest": {
        "type": "object",
        "required": ["inputs"],
        "properties": {
            "inputs": TEXTS,
            "truncate": FLAG,
            "truncation_direction": TRUNCATION_DIRECTION,
            "prompt_name": _nullable(STRING),
            "model": MODEL,
        },
    },
    "EmbedSparseResponse": {
        "type": "array",
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["index", "value"],
                "properties": {"index": {"type": "integer", "minimum": 0}, "value": NUMBER},
            },
        },
        "description": "per input, its non-zero entries by ascending token id (a SPLADE model's)",
    },
    "SimilarityRequest": {
        "type": "object",
        "required": ["inputs"],
        "properties": {
            "inputs": {
                "type": "object",
                "required": ["source_sentence", "sentences"],
                "properties": {
                    "source_sentence": STRING,
                    "sentences": {"type": "array", "items": STRING, "minItems": 1},
                },
            },
            "parameters": _nullable(
                {
                    "type": "object",
                    "properties": {
                        "prompt_name": _nullable(STRING),
                        "truncate": FLAG,
                        "truncation_direction": TRUNCATION_DIRECTION,
                    },
                }
            ),
            "model": MODEL,
        },
    },
    "SimilarityResponse": {"type": "array", "items": NUMBER, "description": "cosine similarity per sentence"},
    "RerankRequest": {
        "type": "object",
        "required": ["query", "texts"],
        "properties": {
            "query": STRING,
            "texts": {"type": "array", "items": STRING, "minItems": 1},
            "return_text": FLAG,
            "raw_scores": _nullable({"enum": [False], "description": "scores are the model's activated ones"}),
            "truncate": FLAG,
            "truncation_direction": TRUNCATION_DIRECTION,
            "model": MODEL,
        },
    },
    "RerankResponse": {
        "type": "array",
        "items": {
            "type": "object",
            "required": ["index", "score"],
            "properties": {"index": {"type": "integer", "minimum": 0}, "score": NUMBER, "text": STRING},
        },
        "description": "best first",
    },
    "PredictRequest": {
        "type": "object",
        "required": ["inputs"],
        "properties": {
            "inputs": {
                "anyOf": [STRING, {"type": "array", "items": STRING, "minItems": 1}],
                "description": "one text or a list of texts (a list of two strings is two texts, not a pair)",
            },
            "raw_scores": _nullable({"enum": [False], "description": "scores are probabilities"}),
            "truncate": FLAG,
            "truncation_direction": TRUNCATION_DIRECTION,
            "parameters": _nullable(
                {
                    "type": "object",
                    "description": "the Inference API's parameters (InferenceClient.text_classification): "
                    "with them, the answer is a list per input, one text included",
                    "properties": {
                        "top_k": POSITIVE,
                        "function_to_apply": _nullable(
                            {
                                "enum": ["softmax", "sigmoid"],
                                "description": "the model's own: softmax (single label) or sigmoid (multi label)",
                            }
                        ),
                    },
                }
            ),
            "model": MODEL,
        },
    },
    "Prediction": {
        "type": "object",
        "required": ["label", "score"],
        "properties": {"label": STRING, "score": NUMBER},
    },
    "PredictResponse": {
        "anyOf": [
            {"type": "array", "items": ref("Prediction")},
            {"type": "array", "items": {"type": "array", "items": ref("Prediction")}},
        ],
        "description": "one text: its predictions; a list (or any request with `parameters`): one list per text",
    },
    "TokenizeRequest": {
        "type": "object",
        "required": ["inputs"],
        "properties": {
            "inputs": TEXTS,
            "add_special_tokens": FLAG,
            "prompt_name": _nullable(STRING),
            "model": MODEL,
        },
    },
    "TokenizeResponse": {
        "type": "array",
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["id", "text", "special", "start", "stop"],
                "properties": {
                    "id": {"type": "integer", "minimum": 0},
                    "text": STRING,
                    "special": {"type": "boolean"},
                    "start": _nullable({"type": "integer", "minimum": 0}),
                    "stop": _nullable({"type": "integer", "minimum": 0}),
                },
            },
        },
        "description": "per input, the tokens the model sees (truncated at its length); offsets in characters",
    },
    "DecodeRequest": {
        "type": "object",
        "required": ["ids"],
        "properties": {
            "ids": {
                "anyOf": [
                    {"type": "array", "items": {"type": "integer", "minimum": 0}},
                    {
                        "type": "array",
                        "items": {"type": "array", "items": {"type": "integer", "minimum": 0}},
                        "minItems": 1,
                    },
                ]
            },
            "skip_special_tokens": FLAG,
            "model": MODEL,
        },
    },
    "DecodeResponse": {"type": "array", "items": STRING},
    # -- Cohere / Jina / vLLM
    "CohereRerankRequest": {
        "type": "object",
        "required": ["query", "documents"],
        "properties": {
            "query": STRING,
            "documents": {
                "type": "array",
                "minItems": 1,
                "items": {"anyOf": [STRING, {"type": "object", "required": ["text"], "properties": {"text": STRING}}]},
            },
            "top_n": POSITIVE,
            "return_documents": FLAG,
            "model": MODEL,
            "max_tokens_per_doc": {"type": "null", "description": "refused: documents are cut at the model's limit"},
            "rank_fields": {"type": "null", "description": "refused: documents are text"},
        },
    },
    "CohereRerankResponse": {
        "type": "object",
        "required": ["model", "results", "usage"],
        "properties": {
            "model": STRING,
            "results": {"type": "array", "items": ref("RerankResult")},
            "usage": {
                "type": "object",
                "required": ["total_tokens"],
                "properties": {"total_tokens": {"type": "integer"}},
            },
        },
    },
    # -- Cohere's embed v2 (`ClientV2.embed`)
    "CohereEmbedRequest": {
        "type": "object",
        "required": ["texts"],
        "properties": {
            "texts": {"type": "array", "items": STRING, "minItems": 1},
            "model": MODEL,
            "input_type": _nullable(
                {
                    "enum": ["search_query", "search_document", "classification", "clustering"],
                    "description": "the model's prompt of that name (query, document/passage, ...) where it has one",
                }
            ),
            "embedding_types": _nullable(
                {
                    "type": "array",
                    "minItems": 1,
                    "items": {"enum": ["float", "base64"]},
                    "description": "int8, uint8, binary and ubinary are refused",
                }
            ),
            "output_dimension": POSITIVE,
            "truncate": _nullable({"enum": ["END"], "description": "the end of a long text is dropped"}),
            "max_tokens": {"type": "null", "description": "refused: texts are cut at the model's limit"},
            "images": {"type": "null", "description": "refused: texts only"},
            "inputs": {"type": "null", "description": "refused: send texts"},
            "priority": _nullable({"type": "integer"}),
        },
    },
    "CohereEmbedResponse": {
        "type": "object",
        "required": ["id", "embeddings", "texts", "meta"],
        "properties": {
            "id": STRING,
            "response_type": {"const": "embeddings_by_type"},
            "embeddings": {
                "type": "object",
                "properties": {
                    "float": {"type": "array", "items": VECTOR},
                    "base64": {"type": "array", "items": STRING, "description": "little-endian float32"},
                },
            },
            "texts": {"type": "array", "items": STRING},
            "meta": {
                "type": "object",
                "properties": {
                    "api_version": {"type": "object", "properties": {"version": STRING}},
                    "billed_units": {"type": "object", "properties": {"input_tokens": {"type": "integer"}}},
                },
            },
        },
    },
    "RerankResult": {
        "type": "object",
        "required": ["index", "relevance_score"],
        "properties": {
            "index": {"type": "integer", "minimum": 0},
            "relevance_score": NUMBER,
            "document": {"type": "object", "required": ["text"], "properties": {"text": STRING}},
        },
    },
    # -- native (POST /invocations): each task's own (`NativeRequest`, `NativeResponse`), added by `openapi`
    # -- health, facts, status
    "Ping": {
        "type": "object",
        "required": ["status", "instance_id", "model"],
        "properties": {"status": {"const": "ok"}, "instance_id": STRING, "model": STRING},
    },
    "Draining": {
        "type": "object",
        "required": ["status", "instance_id"],
        "properties": {"status": {"const": "draining"}, "instance_id": STRING},
        "description": "503 once SIGTERM came: the platform routes elsewhere",
    },
    "Health": {"type": "object", "required": ["ok"], "properties": {"ok": {"const": True}}},
    "Info": {
        "type": "object",
        "required": [
            "model_id",
            "model_dtype",
            "model_type",
            "max_concurrent_requests",
            "max_input_length",
            "max_batch_tokens",
            "max_client_batch_size",
            "auto_truncate",
            "tokenization_workers",
            "version",
        ],
        "properties": {
            "model_id": STRING,
            "model_sha": _nullable(STRING),
            "model_dtype": STRING,
            # each task's TEI name and facts (`TaskSpec.tei_kind`, `tei_info_schema`), written by `openapi`
            "model_type": {"type": "object"},
            "max_concurrent_requests": {"type": "integer", "minimum": 0},
            "max_input_length": {"type": "integer", "minimum": 0},
            "max_batch_tokens": {"type": "integer", "minimum": 0},
            "max_batch_requests": _nullable({"type": "integer", "minimum": 0}),
            "max_client_batch_size": {"type": "integer", "minimum": 0},
            "auto_truncate": {"type": "boolean"},
            "tokenization_workers": {"type": "integer", "minimum": 0},
            "version": STRING,
            "sha": _nullable(STRING),
            "docker_label": _nullable(STRING),
        },
        "description": "text-embeddings-inference's model facts, for the default model",
    },
    "Status": {"type": "object", "description": "counts and health (WARMSTART_HTTP_STATUS=full: everything)"},
}

# The default route (`POST /`) answers as the served model's task does, as text-embeddings-inference's does.
SCHEMAS["RootRequest"] = {
    "anyOf": [ref("EmbedRequest"), ref("SimilarityRequest"), ref("RerankRequest"), ref("PredictRequest")],
    "description": "embedding model: /embed's request, or /similarity's (`inputs` with `source_sentence`); "
    "reranker: /rerank's; classifier: /predict's",
}
SCHEMAS["RootResponse"] = {
    "anyOf": [ref("EmbedResponse"), ref("SimilarityResponse"), ref("RerankResponse"), ref("PredictResponse")]
}


def _generation_request(name: str) -> None:
    """The sampling fields both completion APIs share, added to request `name`'s properties."""
    SCHEMAS[name]["properties"].update(
        {
            "temperature": _nullable({"type": "number", "minimum": 0, "description": "0..2; 0 is greedy"}),
            "top_p": _nullable({"type": "number", "minimum": 0, "description": "0 < p <= 1"}),
            "top_k": _nullable({"type": "integer", "minimum": -1, "description": "vLLM's; -1 or 0: every token"}),
            "seed": _nullable({"type": "integer"}),
            "stop": _nullable(
                {"anyOf": [STRING, {"type": "array", "items": STRING, "maxItems": 4}], "description": "cut out"}
            ),
            "stream": FLAG,
            "stream_options": _nullable({"type": "object", "properties": {"include_usage": FLAG}}),
            "response_format": _nullable(
                {
                    "type": "object",
                    "required": ["type"],
                    "properties": {
                        "type": {"enum": ["text", "json_object", "json_schema"]},
                        "json_schema": {
                            "type": "object",
                            "required": ["name"],
                            "properties": {"name": STRING, "schema": {"type": "object"}, "strict": FLAG},
                        },
                    },
                }
            ),
            "n": _nullable({"const": 1, "description": "one choice per request"}),
            "presence_penalty": _nullable({"type": "number", "description": "only 0 is served"}),
            "frequency_penalty": _nullable({"type": "number", "description": "only 0 is served"}),
            "logit_bias": _nullable({"type": "object", "description": "only {} is served (no token biases)"}),
            "user": _nullable(STRING),
        }
    )


def _generation_response(name: str, obj: str, choice: Schema) -> None:
    """An answer (or, with `choices` allowed empty and `usage` optional, a stream chunk) of a completion API."""
    usage: Schema = {
        "type": "object",
        "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
        "properties": {
            k: {"type": "integer", "minimum": 0} for k in ("prompt_tokens", "completion_tokens", "total_tokens")
        },
    }
    chunk = name.endswith("Chunk")
    SCHEMAS[name] = {
        "type": "object",
        "required": ["id", "object", "created", "model", "choices"] + ([] if chunk else ["usage"]),
        "properties": {
            "id": STRING,
            "object": {"const": obj},
            "created": {"type": "integer"},
            "model": STRING,
            "choices": {
                "type": "array",
                "maxItems": 1,
                "items": {
                    "type": "object",
                    "required": ["index", "finish_reason", *choice["required"]],
                    "properties": {
                        "index": {"const": 0},
                        "logprobs": {"type": "null"},
                        "finish_reason": _nullable({"enum": ["stop", "length"]})
                        if chunk
                        else {"enum": ["stop", "length"]},
                        **choice["properties"],
                    },
                },
            },
            "usage": _nullable(usage) if chunk else usage,
        },
    }


for _name in ("ChatCompletionRequest", "CompletionRequest"):
    _generation_request(_name)
_ASSISTANT: Schema = {
    "type": "object",
    "required": ["role", "content"],
    "properties": {"role": {"const": "assistant"}, "content": STRING},
}
_TEXT: Schema = {"required": ["text"], "properties": {"text": STRING}}
_generation_response(
    "ChatCompletionResponse", "chat.completion", {"required": ["message"], "properties": {"message": _ASSISTANT}}
)
_generation_response(
    "ChatCompletionChunk",
    "chat.completion.chunk",
    {
        "required": ["delta"],
        "properties": {"delta": {"type": "object", "properties": {"role": {"const": "assistant"}, "content": STRING}}},
    },
)
_generation_response("CompletionResponse", "text_completion", _TEXT)
_generation_response("CompletionChunk", "text_completion", _TEXT)
SCHEMAS["ModelList"] = {
    "type": "object",
    "required": ["object", "data"],
    "properties": {
        "object": {"const": "list"},
        "data": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["id", "object", "created", "owned_by"],
                "properties": {
                    "id": STRING,
                    "object": {"const": "model"},
                    "created": {"type": "integer"},
                    "owned_by": STRING,
                    "key": {"type": "string", "description": "id@version"},
                    "task": _nullable({"type": "string", "description": "null: not loaded yet"}),
                },
            },
        },
    },
    "description": "OpenAI's model list: every model this instance serves",
}
# A streamed answer's events (`stream: true`), by route path: each `data:` line holds one of these.
STREAM_REQUESTS = {"ChatCompletionRequest": "ChatCompletionChunk", "CompletionRequest": "CompletionChunk"}


# ------------------------------------------------------------------------------------------------ validation

_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}
_JSON_NAMES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}


def _json_type(value: Any) -> str:
    return "null" if value is None else _JSON_NAMES.get(type(value), type(value).__name__)


def _is(value: Any, type_name: str) -> bool:
    if isinstance(value, bool) and type_name in ("integer", "number"):
        return False
    return isinstance(value, _TYPES[type_name])


def _resolve(schema: Schema) -> Schema:
    while "$ref" in schema:
        schema = SCHEMAS[schema["$ref"].rsplit("/", 1)[-1]]
    return schema


def _describe(schema: Schema) -> str:
    schema = _resolve(schema)
    if "anyOf" in schema:
        return " or ".join(_describe(s) for s in schema["anyOf"])
    if "const" in schema:
        return repr(schema["const"])
    if "enum" in schema:
        return "one of " + ", ".join(repr(v) for v in schema["enum"])
    kind = schema.get("type", "any value")
    if kind == "array" and "items" in schema:
        return f"a list of {_describe(schema['items'])}"
    return _NAMES.get(str(kind), str(kind))


# JSON types as a message says them ("must be a string or null").
_NAMES = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "object": "an object",
    "array": "a list",
    "null": "null",
}


def errors(value: Any, schema: Schema, where: str = "request") -> list[str]:
    """What is wrong with `value` against `schema`: one message per fault found, naming where (empty: valid)."""
    schema = _resolve(schema)
    if "anyOf" in schema:
        found = [errors(value, s, where) for s in schema["anyOf"]]
        if all(found):
            # One branch of the right type explains best; else say what would have been taken.
            typed = [f for f, s in zip(found, schema["anyOf"], strict=True) if _type_matches(value, s)]
            return typed[0] if len(typed) == 1 else [f"{_q(where)} must be {_describe(schema)}, got {_shown(value)}"]
        return []
    kind = schema.get("type")
    if kind is not None and not _is(value, kind):
        return [f"{_q(where)} must be {_describe(schema)}, got {_json_type(value)}"]
    if "const" in schema and (value != schema["const"] or type(value) is not type(schema["const"])):
        return [f"{_q(where)} must be {schema['const']!r}, got {_shown(value)}"]
    if "enum" in schema and not any(value == v and type(value) is type(v) for v in schema["enum"]):
        valid = ", ".join(str(v) for v in schema["enum"])  # a closed set: the error lists the valid choices
        return [f"{_q(where)} is {_shown(value)}; valid: {valid}"]
    if "minimum" in schema and _is(value, "number") and value < schema["minimum"]:
        return [f"{_q(where)} must be at least {schema['minimum']}, got {value!r}"]
    out: list[str] = []
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            return [f"{_q(where)} must have at least {schema['minItems']} item(s), got {len(value)}"]
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            return [f"{_q(where)} must have at most {schema['maxItems']} item(s), got {len(value)}"]
        if "items" in schema:
            for i, item in enumerate(value):
                out += errors(item, schema["items"], f"{where}[{i}]")
                if out:
                    return out  # the first bad item says enough
    if isinstance(value, dict):
        for name in schema.get("required", ()):
            if name not in value:
                out.append(f"{_field(where, name)} is required")
        for name, sub in schema.get("properties", {}).items():
            if name in value:
                out += errors(value[name], sub, _field(where, name))
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for name, item in value.items():
                if name not in schema.get("properties", {}):
                    out += errors(item, extra, _field(where, str(name)))
    return out


def _type_matches(value: Any, schema: Schema) -> bool:
    schema = _resolve(schema)
    if "anyOf" in schema:
        return any(_type_matches(value, s) for s in schema["anyOf"])
    kind = schema.get("type")
    return kind is None or _is(value, kind)


def _field(where: str, name: str) -> str:
    return name if where == "request" else f"{where}.{name}"


def _q(where: str) -> str:
    return where if where == "request" else f'"{where}"'


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check(value: Any, name: str) -> dict[str, Any]:
    """`value` against the schema `name`: returned when valid, else InvalidInputError naming every fault."""
    found = errors(value, SCHEMAS[name])
    if found:
        raise InvalidInputError("; ".join(found[:5]) + (f"; and {len(found) - 5} more" if len(found) > 5 else ""))
    assert isinstance(value, dict)
    return value


# ------------------------------------------------------------------------------------------------ the document


def operation(summary: str, answer: str | None, request: str | None = None, media: str = "application/json") -> Schema:
    """One OpenAPI operation: its request body (a schema name), its 200 answer, and the error answer."""
    op: Schema = {"summary": summary, "responses": {}}
    if request is not None:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": ref(request)}}}
    ok: Schema = {"description": "OK"}
    if answer is not None:
        ok["content"] = {media: {"schema": ref(answer) if media == "application/json" else {"type": "string"}}}
    op["responses"]["200"] = ok
    if request in STREAM_REQUESTS and answer is not None:
        chunk = STREAM_REQUESTS[request]
        ok["content"]["text/event-stream"] = {
            "schema": {
                "type": "string",
                "description": f'with "stream": true: server-sent events, each `data: ` line one {chunk} (JSON), '
                "then `data: [DONE]`; an error after the first event comes as an `error` event with the Error body",
            }
        }
    op["responses"]["default"] = {
        "description": "an error: 4xx for the request's faults, 503 busy or draining, 500 ours",
        "content": {"application/json": {"schema": ref("Error")}},
    }
    return op


def task_schemas(tasks: list[TaskSpec]) -> dict[str, Schema]:
    """The schemas each task's spec holds: the native request and answer (one branch per task), and `/info`'s
    `model_type` (one per task, under its TEI name)."""
    info = dict(SCHEMAS["Info"])
    model_types = [
        {
            "type": "object",
            "required": [t.info_kind],
            "properties": {t.info_kind: t.tei_info_schema or {"type": "object"}},
        }
        for t in tasks
    ]
    info["properties"] = {**info["properties"], "model_type": {"anyOf": model_types}}
    return {
        "NativeRequest": {
            "anyOf": [t.request for t in tasks],
            "description": "the model's task's request (docs/events.md); `application/x-npy` for a task that takes "
            "one array",
        },
        "NativeResponse": {"anyOf": [t.answer for t in tasks]},
        "Info": info,
    }


def openapi(paths: dict[str, dict[str, Schema]], version: str, tasks: list[TaskSpec]) -> dict[str, Any]:
    """The OpenAPI 3.1 document (JSON Schema 2020-12 schemas) for `paths` (path → method → operation), with
    every task's own schemas (`tasks`: the built-in ones and any a plugin adds)."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "warmstart HTTP host",
            "version": version,
            "description": "SageMaker's contract, OpenAI's, Cohere's and text-embeddings-inference's routes, "
            "mapped onto the served model's task. Every answer is JSON; not 2xx: the Error schema.",
        },
        "paths": paths,
        "components": {"schemas": {**SCHEMAS, **task_schemas(tasks)}},
    }
