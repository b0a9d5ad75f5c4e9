"""What a task declares about itself (`TaskSpec`), read by every layer that used to name tasks: the manifest's
task fields (checked at model load), the native request and answer schemas (`GET /openapi.json`), the compatible
routes it serves (`handler.api.compat`), TEI's `/info` facts, and how the runtime runs it (batched, streamed).

Each task module declares one next to its class (`SPEC = TaskSpec(...)`); `handler.tasks.catalog` finds it by
name, a built-in's from one table, any other from an installed package's `warmstart.tasks` entry point. So a
task is one module and one entry, and nothing else in handler/ names it.

The JSON Schema fragments here are what the task specs and `handler.api.schemas` share: plain dicts, as this
module is on Lambda's init path and the schemas module (with its validator) is not.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from handler.backends.contract import Backend
from handler.backends.pool import BufferPool
from handler.backends.registry import Needs
from handler.core.config import Config
from handler.core.manifest import Manifest
from handler.core.records import record
from handler.core.types import JSON, Protocol

Schema = dict[str, Any]


class Task(Protocol):
    """A loaded model's task: a native request's JSON → its answer."""

    name: str

    def __call__(self, payload: JSON) -> dict[str, Any]: ...

    def warmup(self) -> None: ...


class TaskFactory(Protocol):
    def __call__(
        self, manifest: Manifest, backend: Backend, config: Config, pool: BufferPool | None = None
    ) -> Task: ...


def nullable(schema: Schema) -> Schema:
    """The schema, or JSON null (a client's "not set")."""
    return {"anyOf": [schema, {"type": "null"}]}


STRING: Schema = {"type": "string"}
TEXTS: Schema = {
    "anyOf": [STRING, {"type": "array", "items": STRING, "minItems": 1}],
    "description": "one text, or a non-empty list of texts (token ids are refused: send text)",
}
MODEL: Schema = nullable(
    {
        "type": "string",
        "description": "a model this instance serves (`id` or `id@version`); any other name means the default "
        "model (clients always send one)",
    }
)
FLAG: Schema = nullable({"type": "boolean"})
POSITIVE: Schema = nullable({"type": "integer", "minimum": 1})
NUMBER: Schema = {"type": "number"}
VECTOR: Schema = {"type": "array", "items": NUMBER}
VECTOR_OR_BASE64: Schema = {"anyOf": [VECTOR, {"type": "string", "description": "base64 of little-endian float32"}]}
USAGE: Schema = {"type": "object", "required": ["tokens"], "properties": {"tokens": {"type": "integer"}}}
LABELS: Schema = {  # text-embeddings-inference's id2label / label2id, in `/info`
    "type": "object",
    "required": ["id2label", "label2id"],
    "properties": {
        "id2label": {"type": "object", "additionalProperties": STRING},
        "label2id": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}},
    },
}


def no_fields(raw: dict[str, Any]) -> dict[str, Any]:
    return {}


def no_info(manifest: Manifest) -> dict[str, Any]:
    return {}


@record
class TaskSpec:
    """One task, as the rest of the program sees it."""

    name: str  # the manifest's `task`
    factory: TaskFactory  # (manifest, backend, config, pool) → the task object serving requests
    request: Schema  # the native request's JSON Schema (`POST /invocations`); the task itself validates it
    answer: Schema  # the native answer's
    # The manifest's fields only this task reads, checked: raw manifest → `Manifest.options` (ValueError when
    # wrong: init reports it as the manifest's fault). Called at model load, before the backend is imported.
    fields: Callable[[dict[str, Any]], dict[str, Any]] = no_fields
    routes: tuple[str, ...] = ()  # compatible routes it serves, by path (`handler.api.compat.ROUTES`)
    batches: bool = False  # has `prepare(payload) -> Prepared`: requests may share a model run (`tasks.batch`)
    streams: bool = False  # its answer is a stream of pieces, not one value
    # What it hands a backend: arrays (`Backend.run`), or the whole request to an engine that owns its loop
    # (`Engine.submit`); init refuses a backend that needs what the task does not give.
    gives: tuple[Needs, ...] = ("arrays",)
    tei_kind: str | None = None  # its name in TEI's `/info` `model_type` (None: the task's own name)
    tei_info: Callable[[Manifest], dict[str, Any]] = no_info  # the details under that name
    tei_info_schema: Schema | None = None  # their schema (None: any object)
    npy_input: bool = False  # an `application/x-npy` body is its one input (`handler.api.media`)
    warmup_may_fail: bool = False  # a failed warm-up is reported, not fatal (generic inputs it cannot know)
    # It answers plain requests without numpy on a backend whose spec is `lean` (handler.core.numpy_gate), so a
    # Lambda start of it leaves numpy out until its first answer is made (handler.runtime.prefetch.lean_start).
    lean: bool = False
    # Its Open Inference Protocol tensors: the name of its adapter class in `handler.tasks.oip_io`, made by the
    # first such request (the module is not on a direct invoke's path), or an adapter; None: not served there.
    oip: Any = None
    # A valid native request, for what `warmstart local` suggests and `invoke` sends by default (None: the
    # request depends on the model, as a tensor model's input names do).
    example: dict[str, Any] | None = None

    @property
    def info_kind(self) -> str:
        return self.tei_kind or self.name
