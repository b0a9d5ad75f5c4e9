"""The generate engine on an int4 pack's Q4MatMul decoder (handler.backends.genai_load.open_first): the
single-stream engine (onnxruntime-genai) and the batching one (ONNX Runtime) open model.q4.onnx with the op's
library and give the greedy tokens the MatMulNBits decoder gives (WARMSTART_GENAI_Q4=off); a library that cannot be
loaded is reported and the next decoder serves, with the same answers.

The library is built into the pack's folder: onnxruntime-genai 0.18 loads one only from under the working
directory or the model's folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from handler.backends import q4lib
from handler.core.config import Config
from handler.runtime.invocation import Runtime
from tests.fixtures.lm_pack import pack_tiny_lm

PROMPTS = ["the sea", "what is the capital of france ? paris is", "hello"]


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = pack_tiny_lm(tmp_path_factory.mktemp("q4engine"), "qwen3", quantize="int4")
    q4lib.build(out / "libws_q4.so")
    return out


def start(pack: Path, **env: str) -> Runtime:
    env = {q4lib.ENV_LIBRARY: str(pack / "libws_q4.so"), **env}
    return Runtime.start(Config(model_dir=pack, backend=None, warmup=False), environ=env, emit=None)


def greedy(runtime: Runtime, prompt: str, n: int = 16) -> list[int]:
    ask = {"prompt": prompt, "temperature": 0, "max_tokens": n}
    return [t for piece in runtime.task.stream(ask) for t in piece["token_ids"]]  # type: ignore[attr-defined]


def answers(runtime: Runtime) -> list[list[int]]:
    return [greedy(runtime, p) for p in PROMPTS]


def q4_report(runtime: Runtime) -> dict[str, Any]:
    return runtime.backend.q4  # type: ignore[attr-defined, no-any-return]


@pytest.fixture(scope="module")
def reference(pack: Path) -> list[list[int]]:
    runtime = start(pack, WARMSTART_GENAI_Q4="off")
    assert q4_report(runtime)["reason"] == "off (WARMSTART_GENAI_Q4=off)"
    return answers(runtime)


def test_the_single_stream_engine_opens_the_q4_decoder_and_answers_the_same(
    pack: Path, reference: list[list[int]]
) -> None:
    runtime = start(pack)
    report = q4_report(runtime)
    assert report["used"] is True and report["model"] == "model.q4.onnx"
    assert report["graph_passes"] == "ORT_DISABLE_ALL"
    assert runtime.backend.optimized["reason"] == "the Q4MatMul decoder was opened"  # type: ignore[attr-defined]
    assert answers(runtime) == reference
    assert all(len(a) == 16 for a in reference)


def test_the_batching_engine_opens_the_q4_decoder_and_answers_the_same(pack: Path, reference: list[list[int]]) -> None:
    runtime = start(pack, WARMSTART_GENAI_BATCH="4")
    assert q4_report(runtime)["used"] is True
    assert answers(runtime) == reference


@pytest.mark.parametrize("batch", ["1", "4"])
def test_a_library_that_cannot_load_falls_back_to_the_portable_decoder(
    pack: Path, tmp_path: Path, reference: list[list[int]], batch: str
) -> None:
    broken = pack / "broken.so"
    broken.write_bytes(b"not a shared library")
    runtime = start(pack, WARMSTART_GENAI_BATCH=batch, **{q4lib.ENV_LIBRARY: str(broken)})
    report = q4_report(runtime)
    assert report["used"] is False and report["reason"].startswith("load failed:")
    assert answers(runtime) == reference
