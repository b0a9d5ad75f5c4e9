"""The onnx backend on ONNX Runtime's C API (handler.backends.ort_capi): answers bit-identical to the Python
binding's, no `onnxruntime` import on a CPU start, the binding for CUDA and as the fallback, every OrtValue and
OrtStatus released, ORT's errors typed."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from handler.backends import ort_capi
from handler.backends.contract import BackendSettings
from handler.backends.device import CudaProbe
from handler.backends.ort import OnnxBackend, runtime
from handler.backends.ort_spec import OrtSettings
from handler.core.config import Config
from handler.core.errors import ModelLoadError, ModelRunError
from handler.core.manifest import load_manifest
from handler.observability.report import PhaseTimer
from handler.runtime.invocation import Runtime
from infra.pack.optimize import optimize
from tests.conftest import ROOT, portable_copy

# Texts of many lengths, so a batch pads most of them; 32 of them for batch 32.
TEXTS = [
    "a",
    "hello world",
    "the quick brown fox jumps over the lazy dog " * 3,
    "東京 🚀 emoji and accents: café naïve",
    "what is the capital of france?",
    "word " * 60,
    "",
    "12345 67890",
]
BATCH32 = [f"{t} {i}" for i, t in enumerate(TEXTS * 4)]


def embed(model: Path, texts: list[str], **env: str) -> tuple[np.ndarray, dict[str, Any]]:
    runtime = Runtime.start(Config(model_dir=model, backend="onnx", warmup=False), environ=env, emit=None)
    reply = runtime.handle({"inputs": texts})
    return np.asarray(reply["embeddings"], np.float32), runtime.init_report["coldstart"]


@pytest.fixture(scope="module")
def optimized_dir(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default pack with the optimized, prepacked copy `make setup` builds (`warmstart optimize`), made here."""
    out = portable_copy(model_dir, tmp_path_factory.mktemp("capi") / "model")
    optimize(out)
    return out


@pytest.mark.parametrize("optimized", [True, False], ids=["optimized", "portable"])
@pytest.mark.parametrize("texts", [TEXTS[2:3], BATCH32], ids=["b1", "b32"])
def test_the_c_api_answers_bit_identically_to_the_binding(
    optimized_dir: Path, optimized: bool, texts: list[str]
) -> None:
    env = {} if optimized else {"WARMSTART_ORT_OPTIMIZED": "0"}
    c, c_facts = embed(optimized_dir, texts, **env)
    py, py_facts = embed(optimized_dir, texts, WARMSTART_ORT_CAPI="0", **env)
    assert c_facts["onnx_api"]["used"] == "c" and py_facts["onnx_api"] == {
        "used": "python",
        "reason": "off (WARMSTART_ORT_CAPI=0)",
    }
    assert c_facts["onnx_optimized"]["used"] is py_facts["onnx_optimized"]["used"] is optimized
    assert c.shape == (len(texts), 384) and np.array_equal(c, py)  # bit for bit, not merely close


PROBE = """
import json, sys
from pathlib import Path
from handler.core.config import Config
from handler.runtime.invocation import Runtime
runtime = Runtime.start(Config(model_dir=Path(sys.argv[1]), backend="onnx", warmup=False), environ={}, emit=None)
reply = runtime.handle({"inputs": ["hello world", "a second, longer text"]})
maps = [line.split()[-1] for line in open("/proc/self/maps") if "onnxruntime" in line]
imported = sorted(m for m in sys.modules if m.startswith("onnxruntime"))
api, facts = runtime.init_report["coldstart"]["onnx_api"], runtime.backend.describe()
libraries = sorted({Path(m).name for m in maps})
shape = list(reply["embeddings"].shape)
print(json.dumps({"shape": shape, "imported": imported, "api": api, "describe": facts, "libraries": libraries}))
"""


def test_a_cpu_start_answers_without_importing_onnxruntime(model_dir: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(model_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    facts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert facts["shape"] == [2, 384] and facts["imported"] == []
    assert facts["api"]["used"] == "c" and facts["describe"]["onnxruntime_api"] == "c"
    import onnxruntime  # the test's own process: the wheel's version is what the C library reports

    assert facts["describe"]["onnxruntime"] == onnxruntime.__version__
    # the C library is mapped, the binding's module (its own copy of the runtime) is not
    assert any(n.startswith("libonnxruntime.so") for n in facts["libraries"])
    assert not any("pybind11_state" in n for n in facts["libraries"])


def settings(cuda: bool = False, **own: Any) -> BackendSettings[OrtSettings]:
    probe = CudaProbe(True, "1 CUDA device(s) (a fake probe)") if cuda else CudaProbe(False, "no device")
    return BackendSettings(threads=1, cuda=probe, spin=False, own=OrtSettings(**own))


def test_cuda_takes_the_binding(model_dir: Path) -> None:
    backend = OnnxBackend()
    backend.initialize(load_manifest(model_dir), settings(cuda=True), PhaseTimer())
    assert backend.capi is None and backend.api["used"] == "python" and backend.api["reason"].startswith("CUDA")
    assert type(backend.session).__module__.startswith("onnxruntime")
    assert backend.optimized["reason"].startswith("CUDA")
    ids = np.array([[101, 7592, 2088, 102]], np.int64)
    out = backend.run({"input_ids": ids, "attention_mask": np.ones_like(ids)})
    assert out["sentence_embedding"].shape == (1, 384)


@pytest.fixture
def unusable(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The C library of a release the table was not checked for: loaded afresh, refused at its version."""
    monkeypatch.setattr(ort_capi, "_api", None)
    monkeypatch.setattr(ort_capi, "_api_error", None)
    monkeypatch.setattr(ort_capi, "VERSIONS", ("0.0.",))
    yield


def test_a_library_of_another_release_is_not_called_and_the_binding_serves(model_dir: Path, unusable: None) -> None:
    with pytest.raises(
        ort_capi.CapiUnavailable, match=r"onnxruntime 1\.\d+\.\d+: its C API is called with the table of 0\.0\.x only"
    ):
        ort_capi.api()
    backend = OnnxBackend()
    backend.initialize(load_manifest(model_dir), settings(), PhaseTimer())
    assert backend.capi is None and backend.api["used"] == "python"
    assert backend.api["reason"].startswith("C API unusable: onnxruntime 1.")
    assert backend.optimized["used"] is True  # the version came from the binding: the prepacked copy still fits


class Counting:
    """Wraps the library's value functions to record every OrtValue and OrtStatus made and released."""

    def __init__(self, api: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self.made: list[int] = []
        self.released: list[int] = []
        self.statuses = 0
        self.statuses_released = 0
        create, run, release, release_status, error_message = (
            api.CreateTensorWithDataAsOrtValue,
            api.Run,
            api.ReleaseValue,
            api.ReleaseStatus,
            api.GetErrorMessage,
        )

        def counted_create(*args: Any) -> Any:
            status = create(*args)
            if not status:
                self.made.append(args[-1]._obj.value)  # the OrtValue** out argument (a byref)
            return status

        def counted_run(*args: Any) -> Any:
            outputs = args[-1]
            empty = [i for i, v in enumerate(outputs) if not v]
            status = run(*args)
            self.made += [outputs[i] for i in empty if outputs[i]]  # values ORT allocated
            return status

        def counted_release(value: Any) -> None:
            self.released.append(value)
            release(value)

        def counted_message(status: Any) -> Any:
            self.statuses += 1
            return error_message(status)

        def counted_release_status(status: Any) -> None:
            self.statuses_released += 1
            release_status(status)

        for name, fn in (
            ("CreateTensorWithDataAsOrtValue", counted_create),
            ("Run", counted_run),
            ("ReleaseValue", counted_release),
            ("GetErrorMessage", counted_message),
            ("ReleaseStatus", counted_release_status),
        ):
            monkeypatch.setattr(api, name, fn)


def test_every_value_and_status_is_released_over_many_calls(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    backend = OnnxBackend()
    backend.initialize(load_manifest(model_dir), settings(), PhaseTimer())
    assert backend.capi is not None
    counting = Counting(ort_capi.api(), monkeypatch)
    ids = np.full((4, 12), 2000, np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    first = backend.run(feeds)["sentence_embedding"]
    for _ in range(100):  # outputs preallocated (the shapes follow from the feeds)
        assert np.array_equal(backend.run(feeds)["sentence_embedding"], first)
    for _ in range(20):  # outputs ORT allocates and copies out
        assert np.array_equal(backend.capi.run(feeds)[0], first)
    for _ in range(10):  # failed runs: ORT's message, the status and the inputs released
        with pytest.raises(
            ModelRunError,
            match=r"ONNX Runtime failed running it: Unexpected input data type\. Actual: \(tensor\(int32\)\)",
        ):
            backend.run({"input_ids": ids.astype(np.int32), "attention_mask": np.ones_like(ids)})
    assert backend._bound is not None  # a failed run does not turn the preallocated outputs off
    # per call: 2 inputs and the output (preallocated or ORT's); a failed run: 2 inputs + the output, then 2 inputs
    assert len(counting.made) == 101 * 3 + 20 * 3 + 10 * 5
    assert sorted(counting.made) == sorted(counting.released)
    assert counting.statuses == counting.statuses_released == 10 * 2  # the preallocated try, then the plain one


def test_a_model_ort_cannot_load_is_a_model_load_error_with_its_message(tmp_path: Path) -> None:
    bad = tmp_path / "model.onnx"
    bad.write_bytes(b"not a protobuf")
    with pytest.raises(ort_capi.OrtError, match=r"(?i)protobuf") as caught:
        ort_capi.Session(str(bad), intra_threads=1, optimization=0)
    assert caught.value.code == 7  # ORT_INVALID_PROTOBUF
    with pytest.raises(ort_capi.OrtError, match=r"missing\.onnx"):
        ort_capi.Session(str(tmp_path / "missing.onnx"), intra_threads=1, optimization=0)
    with pytest.raises(ModelLoadError, match=r"model.onnx: ONNX Runtime could not load it: .*(?i:protobuf)"):
        OnnxBackend()._create_capi(bad, settings(), 0, {})


def test_inputs_and_outputs_are_described_as_the_binding_describes_them(model_dir: Path) -> None:
    import onnxruntime as ort

    path = str(model_dir / "model.onnx")
    session = ort_capi.Session(path, intra_threads=1, optimization=2)
    binding = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    assert [(i.name, i.dims) for i in session.inputs] == [(i.name, i.shape) for i in binding.get_inputs()]
    assert [(o.name, o.dims) for o in session.outputs] == [(o.name, o.shape) for o in binding.get_outputs()]
    # dtype names, not numpy types: a lean start describes its session before numpy is imported (numpy_gate)
    assert [i.dtype for i in session.inputs] == ["int64", "int64"] and session.outputs[0].dtype == "float32"
    session.close()
    session.close()  # twice is harmless


def test_typed_buffers_run_as_arrays_do(model_dir: Path) -> None:
    """`run_buffers` (a lean start's run, no numpy): `array('q')` feeds, each output's dtype name, shape and bytes,
    the same bytes `run` gives; a typecode it does not pass, or values that do not fill the shape, are refused."""
    from array import array

    session = ort_capi.Session(str(model_dir / "model.onnx"), intra_threads=1, optimization=2)
    ids = np.array([[101, 7592, 2088, 102], [101, 2088, 102, 0]], np.int64)
    mask = (ids != 0).astype(np.int64)
    want = session.run({"input_ids": ids, "attention_mask": mask})
    got = session.run_buffers(
        {"input_ids": (array("q", ids.ravel().tolist()), (2, 4)), "attention_mask": (array("q", mask.ravel()), (2, 4))}
    )
    assert [(d, s, b) for d, s, b in got] == [(w.dtype.name, list(w.shape), w.tobytes()) for w in want]
    with pytest.raises(ort_capi.OrtError, match="typecode 'i'"):
        session.run_buffers({"input_ids": (array("i", [1]), (1, 1)), "attention_mask": (array("q", [1]), (1, 1))})
    with pytest.raises(ort_capi.OrtError, match=r"3 values for the shape \[1, 2\]"):
        session.run_buffers({"input_ids": (array("q", [1, 2, 3]), (1, 2)), "attention_mask": (array("q", [1]), (1, 1))})
    session.close()


def test_outputs_named_like_the_inputs_dims_but_shaped_otherwise_fall_back_to_ort_allocating(tmp_path: Path) -> None:
    """A graph that declares its output [batch, seq] and answers [seq, batch]: the preallocated output is refused
    by ORT, the plain run answers right, and from then on outputs are ORT's (the binding path does the same)."""
    from onnx import TensorProto, helper, save_model

    graph = helper.make_graph(
        [helper.make_node("Transpose", ["x"], ["y"], perm=[1, 0])],
        "mislabelled",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    save_model(model, str(tmp_path / "t.onnx"))
    backend = OnnxBackend()
    backend.version, backend.api = runtime(settings())
    backend._create(tmp_path / "t.onnx", settings(), PhaseTimer(), preoptimized=True)
    assert backend.capi is not None and backend._bound == [("y", "float32", ["batch", "seq"])]
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert np.array_equal(backend.run({"x": x})["y"], x.T) and backend._bound is None
    assert np.array_equal(backend.run({"x": x[:1]})["y"], x[:1].T)


@pytest.mark.parametrize(
    "requirements",
    ["layers/requirements.txt", "infra/deploy/requirements-gpu.txt", "infra/deploy/requirements-pack.txt"],
)
def test_every_pinned_onnxruntime_is_a_release_the_table_was_checked_for(requirements: str) -> None:
    """A bump of onnxruntime would silently turn every CPU start back to the binding: it fails here instead, until
    the indices and signatures in ort_capi are checked against the new release's onnxruntime_c_api.h."""
    pins = [
        line.split("==", 1)[1].strip()
        for line in (ROOT / requirements).read_text().splitlines()
        if line.startswith(("onnxruntime==", "onnxruntime-gpu=="))
    ]
    assert pins and all(pin.startswith(ort_capi.VERSIONS) for pin in pins), (pins, ort_capi.VERSIONS)


def test_other_threads_run_while_a_session_computes(model_dir: Path) -> None:
    """ctypes releases the GIL for the foreign call (CFUNCTYPE): the HTTP host's other requests, its loop and
    the batcher run while ORT computes. This thread notes the time as it loops; held, the GIL would let it note
    nothing in the middle of the run."""
    import threading
    import time

    session = ort_capi.Session(str(model_dir / "model.onnx"), intra_threads=1, optimization=2)
    ids = np.full((32, 64), 2000, np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    session.run(feeds)  # the first run's one-time work out of the way
    window: list[float] = []
    done = threading.Event()

    def compute() -> None:
        window.append(time.perf_counter())
        session.run(feeds)
        window.append(time.perf_counter())
        done.set()

    worker = threading.Thread(target=compute)
    stamps: list[float] = []
    worker.start()
    while not done.is_set():
        stamps.append(time.perf_counter())
    worker.join()
    start, end = window
    margin = (end - start) / 10  # the Python steps around the foreign call hold the GIL: the middle only
    assert sum(start + margin < t < end - margin for t in stamps) > 1_000
