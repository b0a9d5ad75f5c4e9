"""A task is one module and one catalog entry: a task whose spec comes from outside handler/ (a module on the
path, found through the `warmstart.tasks` entry points that `handler.core.plugins` reads) is served with no
edit to handler/: its manifest fields checked at init, its native request through a Lambda event and the HTTP
host, a compatible route it declares, TEI's `/info` under its own name, and its schemas in `/openapi.json`.

The entry point itself is stood in for (the installed-package test builds a real one into a venv): this file
is about what the rest of handler/ does with a spec it has never seen."""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest
from starlette.testclient import TestClient

from handler.core import plugins
from handler.core.config import Config
from handler.core.errors import ModelLoadError
from handler.http_host.host import Host
from handler.http_host.routes import create_app
from handler.runtime.invocation import Runtime
from handler.runtime.workers import Sizing, WorkerPool
from handler.tasks import catalog
from handler.tasks.spec import TaskSpec
from infra.pack.packers import pack_onnx
from tests.conftest import http_v2_event, write_tiny_onnx

# A task module as a plugin package would ship it: texts → a 4-wide vector each, through the tiny ONNX model
# (x = [characters, vowels, scale], k = 0), answered in the embedding shape so OpenAI's route can serve it.
TOY = """
from __future__ import annotations

from typing import Any

import numpy as np

from handler.core.errors import InvalidInputError
from handler.tasks.spec import MODEL, STRING, TEXTS, TaskSpec


class ToyTask:
    name = "toy-vectors"

    def __init__(self, manifest, backend, config, pool=None):
        self.backend, self.model, self.scale = backend, manifest.key, manifest.options["toy_scale"]

    def __call__(self, payload: Any) -> dict[str, Any]:
        texts = payload.get("inputs") if isinstance(payload, dict) else None
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise InvalidInputError('"inputs" must be a list of strings')
        x = np.array([[len(t), sum(c in "aeiou" for c in t), self.scale] for t in texts], np.float32)
        y = self.backend.run({"x": x, "k": np.zeros(len(texts), np.int64)})["y"]
        return {"embeddings": y.tolist(), "model": self.model, "usage": {"tokens": len(texts)}}

    def warmup(self) -> None:
        self({"inputs": ["warm-up"]})


def fields(raw: dict[str, Any]) -> dict[str, Any]:
    scale = raw.get("toy_scale")
    if type(scale) is not int:
        raise ValueError(f"a toy-vectors model needs 'toy_scale', an integer; got {scale!r}")
    return {"toy_scale": scale}


SPEC = TaskSpec(
    name=ToyTask.name,
    factory=ToyTask,
    request={"title": "toy-vectors", "type": "object", "required": ["inputs"],
             "properties": {"inputs": TEXTS, "model": MODEL}},
    answer={"title": "toy-vectors", "type": "object", "required": ["embeddings", "model"],
            "properties": {"embeddings": {"type": "array"}, "model": STRING}},
    fields=fields,
    routes=("/v1/embeddings",),
    tei_info=lambda manifest: {"scale": manifest.options["toy_scale"]},
    tei_info_schema={"type": "object", "required": ["scale"], "properties": {"scale": {"type": "integer"}}},
)
"""


@pytest.fixture(params=["entry point", "built-in table"])
def plugin(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The toy module importable and named by a stand-in `warmstart.tasks` entry point, or by one more line in
    `catalog.BUILTIN_TASKS` (a built-in task: its module and that one entry)."""
    (tmp_path / "warmstart_toy.py").write_text(textwrap.dedent(TOY))
    monkeypatch.syspath_prepend(str(tmp_path))
    if request.param == "entry point":
        monkeypatch.setitem(plugins._found, "task", {"toy-vectors": "warmstart_toy:SPEC"})
    else:
        monkeypatch.setitem(plugins._found, "task", {})
        monkeypatch.setitem(catalog.BUILTIN_TASKS, "toy-vectors", "warmstart_toy:SPEC")
    monkeypatch.setattr(catalog, "_specs", {})
    yield "toy-vectors"
    sys.modules.pop("warmstart_toy", None)


def toy_model(root: Path, **fields: Any) -> tuple[Path, Any, Any]:
    w, b = write_tiny_onnx(root / "tiny.onnx")
    packed = pack_onnx(root / "tiny.onnx", root / "packed", "toy", "1")
    manifest = json.loads((packed / "manifest.json").read_text())
    manifest |= {"task": "toy-vectors", "toy_scale": 3} | fields
    (packed / "manifest.json").write_text(json.dumps({k: v for k, v in manifest.items() if v is not None}))
    return packed, w, b


def start(model: Path) -> Runtime:
    return Runtime.start(Config(model_dir=model, backend=None), environ={}, emit=None)


def test_a_task_from_outside_is_served_by_every_way_in(plugin: str, tmp_path: Path) -> None:
    model, w, b = toy_model(tmp_path)
    runtime = start(model)
    want = (np.array([[5, 2, 3], [2, 1, 3]], np.float32) @ w + b).tolist()
    reply = runtime.handle({"inputs": ["hello", "hi"]}, None)  # a direct invoke
    np.testing.assert_allclose(reply["embeddings"], want, rtol=1e-6)
    # A Lambda HTTP event on a compatible route the spec declares, and one it does not.
    event = runtime.handle(http_v2_event("/v1/embeddings", {"input": ["hello", "hi"]}), None)
    assert event["statusCode"] == 200, event
    assert [d["embedding"] for d in json.loads(event["body"])["data"]] == reply["embeddings"]
    refused = runtime.handle(http_v2_event("/rerank", {"query": "q", "texts": ["a"]}), None)
    error = json.loads(refused["body"])["error"]
    assert refused["statusCode"] == 400 and error["type"] == "UnsupportedRequestError"
    assert "needs a rerank, multivector or hybrid model" in error["message"] and "toy-vectors" in error["message"]

    workers = WorkerPool(Sizing(min_workers=1, max_workers=2, max_queue=4), cpus=2)
    with TestClient(create_app(Host(lambda: runtime, workers))) as client:
        assert client.post("/invocations", json={"inputs": ["hello", "hi"]}).json() == reply
        assert client.post("/v1/embeddings", json={"input": "hello"}).json()["data"][0]["embedding"] == want[0]
        r = client.post("/tokenize", json={"inputs": "hello"})  # a text task's route: not this one's
        assert r.status_code == 400 and "toy-vectors" in r.json()["error"]["message"]
        info = client.get("/info").json()
        assert info["model_type"] == {"toy-vectors": {"scale": 3}}
        document = client.get("/openapi.json").json()
    components = document["components"]["schemas"]
    assert "toy-vectors" in [b.get("title") for b in components["NativeRequest"]["anyOf"]]
    # The real answers are what the document says, read with a full validator.
    for schema, value in (("NativeResponse", reply), ("Info", info)):
        jsonschema.Draft202012Validator(
            {"$ref": f"#/components/schemas/{schema}", "components": {"schemas": components}}
        ).validate(value)
    assert catalog.spec(plugin).streams is False and catalog.spec(plugin).batches is False


def test_a_task_from_outside_checks_its_own_manifest_fields(plugin: str, tmp_path: Path) -> None:
    model, _, _ = toy_model(tmp_path, toy_scale=None)
    with pytest.raises(
        ModelLoadError, match=r"manifest\.json: invalid manifest: a toy-vectors model needs 'toy_scale'"
    ):
        start(model)


def test_an_unknown_task_lists_the_installed_ones_too(plugin: str, tmp_path: Path) -> None:
    model, _, _ = toy_model(tmp_path, task="speech")
    valid = "valid tasks: embedding, rerank, classify, tensor, generate, image-text, multivector, sparse, hybrid, "
    valid += "toy-vectors"
    with pytest.raises(ModelLoadError, match=valid):
        start(model)


def test_every_built_in_task_is_one_entry_whose_spec_names_it() -> None:
    for name in catalog.BUILTIN_TASKS:
        spec = catalog.spec(name)
        assert isinstance(spec, TaskSpec) and spec.name == name and spec.request["title"] == name
    assert [s.name for s in catalog.specs()][: len(catalog.BUILTIN_TASKS)] == list(catalog.BUILTIN_TASKS)
