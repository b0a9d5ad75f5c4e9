"""The genai engine's model and generators through onnxruntime-genai's C API (handler.backends.genai_capi): the
same tokens as the library's Python binding (greedy, seeded sampling, and logits read and written back), the
tokenizer parsed in a thread beside the model's load where there is more than one CPU (the load's C calls leave
the GIL free), and a bad pack refused with the library's message, at init. The tiny pack is
tests/fixtures/genai_pack.py's cached qwen3 (shared with test_generate)."""

from __future__ import annotations

import ctypes
import json
import shutil
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import onnxruntime_genai as og  # type: ignore[import-untyped]  # the binding, the reference here
import pytest
from tokenizers import Tokenizer

from handler.backends import genai, genai_capi
from handler.backends.genai import overlay
from handler.core.config import Config
from handler.core.errors import ModelLoadError
from handler.runtime.invocation import Runtime
from tests.fixtures.genai_pack import cached_genai_pack

PROMPT = [5, 17, 42, 7, 99, 3, 64, 12]
SAMPLED = {"do_sample": True, "temperature": 0.9, "top_p": 0.95, "top_k": 40, "random_seed": 1234}


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cached_genai_pack(tmp_path_factory.mktemp("genai"), "qwen3")


def binding_tokens(pack: Path, search: dict[str, Any], new: int) -> list[int]:
    config = og.Config(str(pack))
    config.overlay(overlay(1, None))
    config.clear_providers()
    model = og.Model(config)
    params = og.GeneratorParams(model)
    params.set_search_options(**search)
    generator = og.Generator(model, params)
    generator.append_tokens(PROMPT)
    out = []
    for _ in range(new):
        generator.generate_next_token()
        out.append(int(generator.get_next_tokens()[0]))
    return out


def capi_tokens(model: genai_capi.Model, search: dict[str, Any], new: int) -> list[int]:
    generator = genai_capi.Generator(model, search)
    try:
        generator.append_tokens(PROMPT)
        out = []
        for _ in range(new):
            generator.generate_next_token()
            out.append(generator.next_token())
        return out
    finally:
        generator.close()


def test_the_c_api_gives_the_bindings_tokens_greedy_and_sampled(pack: Path) -> None:
    model = genai_capi.Model(str(pack), overlay(1, None))
    greedy = {"max_length": len(PROMPT) + 12, "do_sample": False}
    assert capi_tokens(model, greedy, 12) == binding_tokens(pack, greedy, 12)
    sampled = {"max_length": len(PROMPT) + 12, **SAMPLED}
    drawn = capi_tokens(model, sampled, 12)
    assert drawn == binding_tokens(pack, sampled, 12)
    assert drawn == capi_tokens(model, sampled, 12)  # the seed alone decides the draw
    model.close()
    model.close()  # twice: nothing freed twice


def test_logits_read_and_written_back_steer_the_next_token(pack: Path) -> None:
    model = genai_capi.Model(str(pack), overlay(1, None))
    generator = genai_capi.Generator(model, {"max_length": len(PROMPT) + 2, "do_sample": False})
    generator.append_tokens(PROMPT)
    logits = generator.get_logits()
    assert logits.dtype == np.float32 and logits.ndim == 3 and logits.shape[:2] == (1, 1)
    assert logits.std() > 0  # a real model's row, not a zeroed buffer
    # The binding's logits for the same prompt are the same numbers.
    config = og.Config(str(pack))
    config.overlay(overlay(1, None))
    config.clear_providers()
    reference = og.Model(config)
    params = og.GeneratorParams(reference)
    params.set_search_options(max_length=len(PROMPT) + 2, do_sample=False)
    other = og.Generator(reference, params)
    other.append_tokens(PROMPT)
    np.testing.assert_array_equal(logits, np.asarray(other.get_logits()))
    # Forbid every token but one: greedy must take it (what a JSON constraint's mask relies on).
    chosen = int(np.argsort(logits.reshape(-1))[len(logits.reshape(-1)) // 2])  # not the argmax
    masked = np.full_like(logits, -np.inf)
    masked.reshape(-1)[chosen] = 0.0
    generator.set_logits(masked)
    generator.generate_next_token()
    assert generator.next_token() == chosen
    generator.close()


def test_the_tokenizer_is_parsed_while_the_model_loads(pack: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tokenizer is parsed beside the model's load, not after it. The load is stood in for by a foreign call
    that sleeps (a foreign call through ctypes releases the GIL, as the library's load does: on the
    0.6B pack another thread ran at 2.29 M loops/s beside it, at 0.02 M/s beside the binding's og.Model)."""
    import tokenizers

    events: dict[str, float] = {}
    libc = ctypes.CDLL(None)
    real_load, real_tokenizer = genai._model, tokenizers.Tokenizer

    def slow_load(*args: Any) -> Any:
        args[4].set()  # what the library's Model does before its load call: the init may go on
        libc.usleep(400_000)
        model = real_load(*args[:4])
        events["loaded"] = time.perf_counter()
        return model

    class Timed:
        @staticmethod
        def from_file(path: str) -> Any:
            events["parse"] = time.perf_counter()
            return real_tokenizer.from_file(path)

    monkeypatch.setattr(genai, "load_beside_init", lambda: True)  # whatever this machine's CPUs
    monkeypatch.setattr(genai, "_model", slow_load)
    monkeypatch.setattr(tokenizers, "Tokenizer", Timed)
    runtime = Runtime.start(Config(model_dir=pack, backend=None, warmup=False), environ={}, emit=None)
    assert events["parse"] < events["loaded"], events  # parsed before the load ended
    monkeypatch.undo()
    answer = runtime.task({"prompt": "hello world", "max_tokens": 3, "temperature": 0})  # type: ignore[operator]
    assert answer["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize("beside", [True, False])
def test_the_tokenizer_parsed_beside_the_load_or_by_the_task_and_reported(
    pack: Path, beside: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(genai, "load_beside_init", lambda: beside)
    runtime = Runtime.start(Config(model_dir=pack, backend=None, warmup=True), environ={}, emit=None)
    report = runtime.init_report
    if beside:
        parsed = report["coldstart"]["genai_tokenizer"]
        assert parsed["parsed"] is True and parsed["parse_ms"] > 0 and parsed["waited_ms"] >= 0
    else:
        assert "genai_tokenizer" not in report["coldstart"]
    answer = runtime.task({"prompt": "hello world", "max_tokens": 4, "temperature": 0})  # type: ignore[operator]
    assert answer["usage"]["completion_tokens"] == 4
    ids = runtime.task.tokenizer.encode("hello world", add_special_tokens=False).ids  # type: ignore[attr-defined]
    assert ids == Tokenizer.from_file(str(pack / "tokenizer.json")).encode("hello world", add_special_tokens=False).ids


@pytest.mark.parametrize(
    ("affinity", "quota", "lambda_vcpus", "beside"),
    [(2, None, 1.7, True), (2, None, 1.0, False), (1, None, 1.7, False), (16, 0.5, None, False), (4, None, None, True)],
)
def test_the_load_goes_beside_the_init_only_with_more_than_one_cpu(
    affinity: int, quota: float | None, lambda_vcpus: float | None, beside: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    detail = {"affinity": affinity, "cgroup_quota": quota, "lambda_vcpus": lambda_vcpus}
    monkeypatch.setattr(genai, "cpu_budget", lambda environ=None: SimpleNamespace(detail=detail))
    assert genai.load_beside_init() is beside


def test_a_bad_pack_fails_the_init_with_the_librarys_message(pack: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(pack, broken)
    config = json.loads((broken / "genai_config.json").read_text())
    config["model"]["decoder"]["filename"] = "missing.onnx"
    (broken / "genai_config.json").write_text(json.dumps(config))
    # the manifest lists genai_config.json's size and hash: refresh them, so the loader reaches the engine
    manifest = json.loads((broken / "manifest.json").read_text())
    import hashlib

    data = (broken / "genai_config.json").read_bytes()
    manifest["files"]["genai_config.json"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (broken / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ModelLoadError, match=r"onnxruntime-genai cannot load the model: .*missing\.onnx"):
        Runtime.start(Config(model_dir=broken, backend=None, warmup=False), environ={}, emit=None)
    with pytest.raises(genai_capi.GenaiError, match=r"missing\.onnx"):
        genai_capi.Model(str(broken), overlay(1, None))


def test_the_parse_starts_only_once_the_load_needs_no_gil(pack: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The parse holds the GIL from its start to its end (~0.2 s on Qwen3) and the load needs it up to its C call:
    a parse started at once would make the load wait it out and run after it, nothing overlapped. So the parse
    thread starts once the load is inside the C call."""
    import tokenizers

    events: dict[str, float] = {}
    libc = ctypes.CDLL(None)
    real_load, real_tokenizer = genai._model, tokenizers.Tokenizer

    def slow_load(*args: Any) -> Any:
        time.sleep(0.05)  # the load's own Python before its C call, a little longer
        events["entered"] = time.perf_counter()
        args[4].set()
        libc.usleep(200_000)
        return real_load(*args[:4])

    class Timed:
        @staticmethod
        def from_file(path: str) -> Any:
            events["parse"] = time.perf_counter()
            return real_tokenizer.from_file(path)

    monkeypatch.setattr(genai, "load_beside_init", lambda: True)
    monkeypatch.setattr(genai, "_model", slow_load)
    monkeypatch.setattr(tokenizers, "Tokenizer", Timed)
    Runtime.start(Config(model_dir=pack, backend=None, warmup=False), environ={}, emit=None)
    assert events["entered"] <= events["parse"], events


def test_another_library_version_is_refused_not_called(pack: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(genai_capi, "_lib", None)
    monkeypatch.setattr(og, "__version__", "0.19.0")
    with pytest.raises(genai_capi.GenaiError, match=r"onnxruntime-genai 0\.19\.0: .* 0\.18\.x only"):
        genai_capi.Model(str(pack), overlay(1, None))
    with pytest.raises(ModelLoadError, match=r"cannot load the model: onnxruntime-genai 0\.19\.0"):
        Runtime.start(Config(model_dir=pack, backend=None, warmup=False), environ={}, emit=None)
