"""The task contract and the catalog of tasks: validate a request's JSON, turn it into backend feeds, and the
outputs into the answer. `embedding`: handler.tasks.embedding; `rerank`, `classify`: handler.tasks.scored;
`tensor`: handler.tasks.tensor."""

from __future__ import annotations

from typing import Any, Protocol

from handler.backends.contract import Backend
from handler.backends.pool import BufferPool
from handler.core.config import Config
from handler.core.manifest import Manifest
from handler.core.types import JSON
from handler.tasks.embedding import EmbeddingTask
from handler.tasks.scored import ClassifyTask, RerankTask
from handler.tasks.tensor import TensorTask


class Task(Protocol):
    name: str

    def __call__(self, payload: JSON) -> dict[str, Any]: ...

    def warmup(self) -> None: ...


class TaskFactory(Protocol):
    def __call__(
        self, manifest: Manifest, backend: Backend, config: Config, pool: BufferPool | None = None
    ) -> Task: ...


TASKS: dict[str, TaskFactory] = {
    "embedding": EmbeddingTask,
    "rerank": RerankTask,
    "classify": ClassifyTask,
    "tensor": TensorTask,
}
