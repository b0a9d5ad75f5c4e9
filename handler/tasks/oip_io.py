"""How a task's requests and answers are the Open Inference Protocol's tensors (`handler.api.oip`): each task's
spec names one adapter here (`TaskSpec.oip`), which lists the tensors it takes and gives (the model metadata)
and runs an inference request's checked inputs on the task. Inputs arrive as `{name: {"shape", "datatype",
"data": flat list}}` (their count already matches the shape); outputs leave as the protocol's tensors, row-major.

- `TextsToVectors`: `text` (BYTES `[n]`) → `embedding` (FP32 `[n, dimension]`).
- `QueryToScores`: `query` (BYTES `[1]`) and `documents` (BYTES `[n]`) → `scores` (FP32 `[n]`, documents' order).
- `TextsToLabelScores`: `text` (BYTES `[n]`) → `scores` (FP32 `[n, labels]`, the manifest's label order).
- `Tensors`: the manifest's tensor specs, with their datatypes (a free dimension is -1).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from handler.core.errors import InvalidInputError
from handler.core.manifest import Manifest

if TYPE_CHECKING:  # types only: the OIP module (handler.api.oip) is loaded by every Lambda HTTP event, a genai
    import numpy as np  # start's too, where no numpy is imported: each function below imports it where it runs

Tensor = dict[str, Any]
Inputs = dict[str, Tensor]  # checked request tensors by name: {"shape", "datatype", "data": flat list}
Outputs = dict[str, Tensor]  # answer tensors by name, in the metadata's order
# The manifest's dtypes → the protocol's datatypes; text travels as BYTES.
DATATYPES = {
    "float32": "FP32",
    "float16": "FP16",
    "float64": "FP64",
    "int64": "INT64",
    "int32": "INT32",
    "int8": "INT8",
    "uint8": "UINT8",
    "bool": "BOOL",
}
BYTES = "BYTES"


def tensor(name: str, datatype: str, shape: list[int]) -> Tensor:
    return {"name": name, "datatype": datatype, "shape": shape}


def output(name: str, array: Any, datatype: str) -> Tensor:
    import numpy as np  # deferred: see the TYPE_CHECKING import

    array = np.asarray(array)
    flat = array.reshape(-1)
    # FP32 stays a float32 array up to the edge (`handler.api.encode`: shortest float32 text); others as values.
    return {
        "name": name,
        "datatype": datatype,
        "shape": list(array.shape),
        "data": flat if datatype == "FP32" else flat.tolist(),
    }


def exactly(inputs: Inputs, names: list[str]) -> None:
    if sorted(inputs) != sorted(names):
        raise InvalidInputError(f"inputs must be exactly {sorted(names)}; got {sorted(inputs)}")


def texts(inputs: Inputs, name: str) -> list[str]:
    given = inputs[name]
    if given["datatype"] != BYTES:
        raise InvalidInputError(f"input {name!r} is {given['datatype']}; the model takes BYTES (text)")
    if not all(isinstance(t, str) for t in given["data"]):
        raise InvalidInputError(f"input {name!r}: BYTES data must be strings")
    return list(given["data"])


def numbers(name: str, given: Tensor, dtype: str) -> np.ndarray[Any, Any]:
    """A numeric input as an array of the model's dtype and the request's shape; a 400 for another datatype."""
    want = DATATYPES[dtype]
    if given["datatype"] != want:
        raise InvalidInputError(f"input {name!r} is {given['datatype']}; the model takes {want}")
    data = given["data"]
    # Exact types: numpy would turn 1.5 into 1 for an INT tensor, and true into 1.0 for an FP one.
    if want == "BOOL":
        ok = all(isinstance(x, bool) for x in data)
    elif want.startswith(("INT", "UINT")):
        ok = all(isinstance(x, int) and not isinstance(x, bool) for x in data)
    else:
        ok = all(isinstance(x, int | float) and not isinstance(x, bool) for x in data)
    if not ok:
        raise InvalidInputError(f"input {name!r}: {want} data must be {'booleans' if want == 'BOOL' else 'numbers'}")
    import numpy as np  # deferred: see the TYPE_CHECKING import

    try:
        return np.array(data, dtype=np.dtype(dtype)).reshape(given["shape"])
    except (OverflowError, ValueError) as e:
        raise InvalidInputError(f"input {name!r}: not {want} data ({e})") from None


class TextsToVectors:
    def metadata(self, manifest: Manifest) -> tuple[list[Tensor], list[Tensor]]:
        return [tensor("text", BYTES, [-1])], [tensor("embedding", "FP32", [-1, manifest.dimension or -1])]

    def run(self, task: Any, inputs: Inputs) -> tuple[dict[str, Any], Outputs]:
        exactly(inputs, ["text"])
        answer = task({"inputs": texts(inputs, "text")})
        import numpy as np  # deferred: see the TYPE_CHECKING import

        return answer, {"embedding": output("embedding", np.asarray(answer["embeddings"], np.float32), "FP32")}


class QueryToScores:
    def metadata(self, manifest: Manifest) -> tuple[list[Tensor], list[Tensor]]:
        return [tensor("query", BYTES, [1]), tensor("documents", BYTES, [-1])], [tensor("scores", "FP32", [-1])]

    def run(self, task: Any, inputs: Inputs) -> tuple[dict[str, Any], Outputs]:
        exactly(inputs, ["query", "documents"])
        query, documents = texts(inputs, "query"), texts(inputs, "documents")
        if len(query) != 1:
            raise InvalidInputError(f"input 'query' holds {len(query)} texts; the model takes one (shape [1])")
        answer = task({"query": query[0], "documents": documents})
        import numpy as np  # deferred: see the TYPE_CHECKING import

        scores = np.zeros(len(documents), np.float32)
        for result in answer["results"]:  # ranked: back into the documents' order
            scores[result["index"]] = result["relevance_score"]
        return answer, {"scores": output("scores", scores, "FP32")}


class TextsToLabelScores:
    def metadata(self, manifest: Manifest) -> tuple[list[Tensor], list[Tensor]]:
        return [tensor("text", BYTES, [-1])], [tensor("scores", "FP32", [-1, len(manifest.options["labels"])])]

    def run(self, task: Any, inputs: Inputs) -> tuple[dict[str, Any], Outputs]:
        exactly(inputs, ["text"])
        given, labels = texts(inputs, "text"), list(task.labels)
        answer = task({"inputs": given, "top_k": len(labels)})
        import numpy as np  # deferred: see the TYPE_CHECKING import

        scores = np.zeros((len(given), len(labels)), np.float32)
        for row, predictions in enumerate(answer["predictions"]):  # ranked: back into the labels' order
            for p in predictions:
                scores[row, labels.index(p["label"])] = p["score"]
        return answer, {"scores": output("scores", scores, "FP32")}


def _dims(shape: tuple[int | str, ...]) -> list[int]:
    return [d if isinstance(d, int) else -1 for d in shape]  # a free (symbolic) dimension is -1


class Tensors:
    def metadata(self, manifest: Manifest) -> tuple[list[Tensor], list[Tensor]]:
        return (
            [tensor(s.name, DATATYPES[s.dtype], _dims(s.shape)) for s in manifest.inputs],
            [tensor(s.name, DATATYPES[s.dtype], _dims(s.shape)) for s in manifest.outputs],
        )

    def run(self, task: Any, inputs: Inputs) -> tuple[dict[str, Any], Outputs]:
        exactly(inputs, list(task.inputs))
        arrays = {n: numbers(n, inputs[n], spec.dtype).tolist() for n, spec in task.inputs.items()}
        answer = task({"inputs": arrays})
        import numpy as np  # deferred: see the TYPE_CHECKING import

        return answer, {n: output(n, a, DATATYPES[str(np.asarray(a).dtype)]) for n, a in answer["outputs"].items()}
