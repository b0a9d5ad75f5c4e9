"""The Open Inference Protocol (KServe v2, Triton's HTTP API), REST/JSON, mapped onto the tasks.

| path | answer |
|---|---|
| `GET /v2` | server metadata `{"name", "version", "extensions"}` |
| `GET /v2/health/live`, `/v2/health/ready` | `{"live": true}` / `{"ready": bool}`; the status code says it |
| `GET /v2/models/{name}[/versions/{v}]` | `{"name", "versions", "platform", "inputs", "outputs"}` |
| `GET /v2/models/{name}[/versions/{v}]/ready` | `{"name", "ready"}`; 404 for a model not served here |
| `POST /v2/models/{name}[/versions/{v}]/infer` | `{"model_name", "model_version", "id"?, "outputs"}` |

The tensors each task takes and gives (`tensors`): an embedding model takes `text` (BYTES, `[n]`) and gives
`embedding` (FP32, `[n, dimension]`); a rerank model `query` (BYTES, `[1]`) and `documents` (BYTES, `[n]`) →
`scores` (FP32, `[n]`, in the documents' order); a classify model `text` → `scores` (FP32, `[n, labels]`, in the
manifest's label order, as `GET /info`'s id2label); a tensor model its manifest's tensor specs, datatypes and
shapes (a free dimension is -1). Answers are JSON (the binary tensor extension is not served). Errors are the
protocol's `{"error": "<message>"}`, with the status of the project's typed error.

Used by the HTTP host (`handler.http_host.routes`) and by Lambda HTTP events (`Runtime._handle`); `match` is
the one place that reads the paths. A route object (`Infer`) is per request: its path names the model.
"""

from __future__ import annotations

import json
import math
from typing import Any

from handler.api.media import JSON_TYPE, Kind, NotAcceptableError
from handler.core.errors import InvalidInputError, RequestError, UnsupportedRequestError
from handler.core.manifest import Manifest
from handler.core.types import JSON
from handler.tasks import catalog, oip_io
from handler.tasks.oip_io import BYTES, DATATYPES

PREFIX = "/v2"
KNOWN_DATATYPES = (*DATATYPES.values(), "UINT16", "UINT32", "UINT64", "INT16", BYTES)
PLATFORMS = {"onnx": "onnxruntime_onnx"}  # Triton's name; other backends: warmstart_<backend>
BINARY_REFUSED = (
    "the binary tensor extension (Inference-Header-Content-Length) is not served: send JSON tensors "
    "(tritonclient: set_data_from_numpy(array, binary_data=False))"
)


class ModelNotServedError(RequestError):
    """The path names a model this instance does not serve; the message lists the ones it does."""

    status = 404


def match(path: str) -> tuple[str, str | None] | None:
    """(what the path asks, the model name or None), or None for a path that is not this protocol's (Cohere's
    `/v2/rerank` and `/v2/embed` are not). `versions/{v}` is accepted and ignored: one version is served."""
    if path.rstrip("/") == PREFIX:
        return "server", None
    parts = path.strip("/").split("/")
    if parts[:1] != ["v2"] or len(parts) < 2:
        return None
    if parts[1] == "health" and len(parts) == 3 and parts[2] in ("live", "ready"):
        return parts[2], None
    if parts[1] != "models" or len(parts) < 3 or not parts[2]:
        return None
    name, rest = parts[2], parts[3:]
    if rest[:1] == ["versions"] and len(rest) >= 2:
        rest = rest[2:]
    if not rest:
        return "model", name
    if rest == ["ready"]:
        return "model_ready", name
    if rest == ["infer"]:
        return "infer", name
    return None


def method_for(kind: str) -> str:
    return "POST" if kind == "infer" else "GET"


def error_answer(error: Exception) -> tuple[int, dict[str, str]]:
    """(status, the protocol's `{"error": message}`) for a request error; a fault of ours is a 500."""
    if isinstance(error, RequestError):
        return error.status, {"error": str(error)}
    return 500, {"error": f"{type(error).__name__}: {error}"}


def reshape_error(body: bytes) -> bytes:
    """The project's `{"error": {"type", "message"}}` body as the protocol's `{"error": message}`."""
    try:
        error = json.loads(body)["error"]
        return json.dumps({"error": error["message"] if isinstance(error, dict) else str(error)}).encode()
    except (ValueError, KeyError, TypeError):
        return body


def server_metadata(version: str) -> dict[str, Any]:
    return {"name": "warmstart", "version": version, "extensions": []}


def adapter(task: str, key: str) -> Any:
    """The task's tensors (`TaskSpec.oip`, `handler.tasks.oip_io`); UnsupportedRequestError naming the tasks
    this protocol serves for a task without them."""
    found = catalog.spec(task).oip
    if found is None:
        served = ", ".join(catalog.having(lambda s: s.oip is not None))
        raise UnsupportedRequestError(f"{key} is a {task} model; the inference protocol serves {served} models")
    if isinstance(found, str):  # a built-in task names its adapter class (oip_io is this module's, not init's)
        made = _adapters.get(found)
        if made is None:
            made = _adapters[found] = getattr(oip_io, found)()
        return made
    return found


_adapters: dict[str, Any] = {}  # adapter class name → the one instance


def model_metadata(manifest: Manifest, backend: str) -> dict[str, Any]:
    inputs, outputs = adapter(manifest.task, manifest.key).metadata(manifest)
    return {
        "name": manifest.id,
        "versions": [manifest.version],
        "platform": PLATFORMS.get(backend, f"warmstart_{backend}"),
        "inputs": inputs,
        "outputs": outputs,
    }


# ------------------------------------------------------------------------------------------------- requests


def _flat(data: Any, where: str) -> list[Any]:
    """The tensor's data, row-major (the protocol allows nested lists as well as a flat one)."""
    if not isinstance(data, list):
        raise InvalidInputError(f'{where}: "data" must be an array')
    out: list[Any] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            out.append(item)
        else:
            stack.pop()
    return out


def parse(payload: JSON) -> dict[str, Any]:
    """The inference request, checked: `{"id"?, "parameters"?, "inputs": [{"name", "shape", "datatype", "data",
    "parameters"?}], "outputs"?: [{"name"}]}`; each input's data as a flat list whose length its shape gives."""
    if not isinstance(payload, dict):
        raise InvalidInputError('the body must be an inference request object {"inputs": [...]}')
    inputs = payload.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise InvalidInputError('"inputs" must be a non-empty array of {"name", "shape", "datatype", "data"}')
    checked: dict[str, dict[str, Any]] = {}
    for i, tensor in enumerate(inputs):
        where = f"inputs[{i}]"
        if not isinstance(tensor, dict):
            raise InvalidInputError(f'{where} must be an object {{"name", "shape", "datatype", "data"}}')
        name, shape, datatype = tensor.get("name"), tensor.get("shape"), tensor.get("datatype")
        if not isinstance(name, str) or not name:
            raise InvalidInputError(f'{where}: "name" must be a non-empty string')
        where = f"input {name!r}"
        if name in checked:
            raise InvalidInputError(f"{where} is given twice")
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
            raise InvalidInputError(f'{where}: "shape" must be an array of integers')
        if any(d < 0 for d in shape):
            raise InvalidInputError(f"{where}: shape {shape} has a negative dimension")
        if datatype not in KNOWN_DATATYPES:
            raise InvalidInputError(f"{where}: datatype {datatype!r}; valid: {', '.join(KNOWN_DATATYPES)}")
        if "data" not in tensor:
            raise InvalidInputError(f'{where}: no "data" (the binary tensor extension is not served: send JSON data)')
        data = _flat(tensor["data"], where)
        if len(data) != math.prod(shape):
            raise InvalidInputError(f"{where}: shape {shape} holds {math.prod(shape)} elements; data has {len(data)}")
        checked[name] = {"shape": shape, "datatype": datatype, "data": data}
    outputs = payload.get("outputs")
    wanted = None
    if outputs is not None:
        if not isinstance(outputs, list) or not all(
            isinstance(o, dict) and isinstance(o.get("name"), str) for o in outputs
        ):
            raise InvalidInputError('"outputs" must be an array of {"name"}')
        wanted = [o["name"] for o in outputs]
    ident = payload.get("id")
    if ident is not None and not isinstance(ident, str):
        raise InvalidInputError('"id" must be a string')
    return {"id": ident, "inputs": checked, "outputs": wanted}


def run(task: Any, request: dict[str, Any]) -> dict[str, Any]:
    """A checked inference request on the model's task → the answer (with the native answer's model and usage,
    for the invocation's metrics; `Infer.response` leaves them out)."""
    answer, outputs = adapter(task.name, str(getattr(task, "model", task.name))).run(task, request["inputs"])
    wanted = request["outputs"]
    if wanted is not None:
        unknown = [n for n in wanted if n not in outputs]
        if unknown:
            raise InvalidInputError(f"outputs {unknown} are not this model's; it gives {sorted(outputs)}")
        outputs = {n: outputs[n] for n in wanted}
    model_id, _, version = str(answer["model"]).partition("@")
    body: dict[str, Any] = {"model_name": model_id, "model_version": version}
    if request["id"] is not None:
        body["id"] = request["id"]
    return {**body, "outputs": list(outputs.values()), "model": answer["model"], "usage": answer.get("usage")}


class Infer:
    """`POST /v2/models/{name}/infer` as a compatible route (`handler.api.compat.Route`), one per request:
    the model is the path's. Its run reads the model's task (the tensors depend on it), so it runs alone."""

    schema = ""
    answer = ""
    summary = "the Open Inference Protocol's inference"
    media: tuple[Kind, ...] = ("json",)

    def __init__(self, name: str) -> None:
        self.name = name
        self.path = f"{PREFIX}/models/{name}/infer"

    def check(self, task: str, key: str) -> None:
        adapter(task, key)

    def request(self, payload: JSON, find: Any) -> JSON:
        return {"model": self.name, "oip": parse(payload)}

    def takes(self, payload: JSON) -> bool:
        return True

    def run(self, task: Any, native: JSON) -> dict[str, Any]:
        assert isinstance(native, dict)
        return run(task, native["oip"])

    def response(self, body: dict[str, Any], original: JSON) -> JSON:
        return {k: v for k, v in body.items() if k not in ("model", "usage")}

    def npy(self, body: dict[str, Any], original: JSON) -> bytes:
        raise NotAcceptableError(f"the inference protocol answers {JSON_TYPE}")


# ------------------------------------------------------------------------------------------------- answers


def served(runtime: Any, name: str) -> str:
    """The key this instance serves `name` (an id or `id@version`) under; 404 naming the served ones."""
    described = runtime.registry.describe()
    keys = [m["key"] for m in described["loaded"]] + list(described["available"])
    for key in sorted(keys, key=lambda k: k != described["default"]):
        if name in (key, key.split("@", 1)[0]):
            return str(key)
    raise ModelNotServedError(f"model {name!r} is not served here; served: {', '.join(sorted(keys))}")


def get(runtime: Any, kind: str, name: str | None, version: str, ready: bool) -> tuple[int, dict[str, Any]]:
    """A GET route's (status, body); a request error is raised. `ready`: the instance serves (not draining)."""
    if kind == "server":
        return 200, server_metadata(version)
    if kind == "live":
        return 200, {"live": True}
    if kind == "ready":
        return (200 if ready else 503), {"ready": ready}
    assert name is not None
    key = served(runtime, name)
    if kind == "model_ready":  # an on-demand model loads with its first request: served is ready
        return (200 if ready else 503), {"name": key.split("@", 1)[0], "ready": ready}
    with runtime.registry.lease(key) as model:  # metadata: the model's manifest (an on-demand one loads)
        return 200, model_metadata(model.manifest, model.backend.name)


def lambda_answer(runtime: Any, kind: str, name: str | None, method: str, payload: Any, inv: Any) -> tuple[int, Any]:
    """A Lambda HTTP event on this protocol's path → (status, body); an error is raised (the caller counts,
    logs and answers it in the protocol's shape). `payload`: a callable giving the event's body."""
    from handler.core.version import VERSION

    if method != method_for(kind):
        from handler.api.sources import MethodNotAllowedError

        raise MethodNotAllowedError(f"method {method} is not allowed here; {method_for(kind)} it")
    if kind != "infer":
        return get(runtime, kind, name, VERSION, True)
    assert name is not None
    route = Infer(name)
    native = route.request(payload(), runtime.find)
    return 200, route.response(runtime.infer(native, inv, route.check, route.run), None)
