"""The vllm backend (handler/backends/vllm_engine.py) over a fake `vllm` package (tests/fixtures/fake_vllm.py: vLLM
0.33's API shapes, no GPU), on a real `warmstart pack --backends vllm` of a tiny model, through the real `generate`
task and the HTTP host's app: OpenAI chat completions streamed and not, the eos that stopped a generation left out
of the text, usage counts, the request's mapping onto SamplingParams / StructuredOutputsParams and the engine's
onto AsyncEngineArgs, typed errors (the next request served), a closed stream aborting vLLM's request, and the
warm standby (WARMSTART_STANDBY_AFTER_S) putting the engine to sleep and the next request waking it."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from handler.backends.device import CudaProbe
from handler.core.config import Config
from handler.core.errors import ConfigError, InvalidInputError, ModelLoadError
from handler.http_host.settings import HostSettings
from handler.http_host.standby import Standby, standby_after_s
from handler.runtime.invocation import Runtime
from tests.fixtures import fake_vllm
from tests.functional.test_http_compat import client_for
from tests.functional.test_http_generate import events

USER = [{"role": "user", "content": "hello there"}]
GPU = CudaProbe(True, "1 CUDA device(s)", ["Fake H100"])


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fake_vllm.vllm_pack(tmp_path_factory.mktemp("vllm"))


@pytest.fixture
def start(pack: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    fake_vllm.install(monkeypatch)
    monkeypatch.setattr("handler.models.loader.probe_cuda", lambda mode="auto": GPU)
    made: list[Runtime] = []

    def make(warmup: bool = False, **env: str) -> Runtime:
        runtime = Runtime.start(Config(model_dir=pack, backend=None, warmup=warmup), environ=env, emit=None)
        made.append(runtime)
        return runtime

    yield make
    for runtime in made:
        runtime.backend.close()  # type: ignore[attr-defined]  # the engine's loop thread


def llm() -> fake_vllm.FakeLLM:
    return fake_vllm.ENGINES[-1]


def test_the_pack_holds_what_vllm_loads(pack: Path) -> None:
    from tests.fixtures.lm_pack import source_dir

    manifest = json.loads((pack / "manifest.json").read_text())
    assert manifest["default_backend"] == "vllm" and list(manifest["backends"]) == ["vllm"]
    entry = manifest["backends"]["vllm"]
    assert entry["dir"] == "hf" and {"hf/config.json", "hf/model.safetensors", "hf/tokenizer.json"} <= set(
        entry["files"]
    )
    for name in entry["files"]:  # the source's bytes, listed with their SHA-256 like every packed file
        data = (source_dir("qwen3") / name.removeprefix("hf/")).read_bytes()
        assert (pack / name).read_bytes() == data
        assert manifest["files"][name]["sha256"] == hashlib.sha256(data).hexdigest()
    assert manifest["generation"]["kv"]["dtype"] == "float16" and manifest["version"].endswith("-vllm")


def test_pack_refusals_name_what_is_valid(tmp_path: Path) -> None:
    from infra.pack.hf_source import UnsupportedModelError
    from infra.pack.lm_vllm import check_precision, choose
    from infra.pack.precision import Precision, PrecisionError

    assert choose(None) == ("genai",) and choose(["vllm", "genai", "vllm"]) == ("vllm", "genai")
    with pytest.raises(UnsupportedModelError, match=r"backends onnx: task generate packs genai, vllm \(one or both\)"):
        choose(["onnx"])
    with pytest.raises(PrecisionError, match="--quantize int4: the vllm backend loads the source's weights as"):
        check_precision(Precision(quantize="int4"))


def test_the_cli_packs_vllm_alone_and_genai_with_vllm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from infra.cli import main
    from infra.pack import hf_pack, lm_pack, lm_vllm
    from tests.fixtures.lm_pack import source_dir

    src = source_dir("qwen3")
    assert main(["pack", "--from", str(src), "--backends", "vllm", "--out", str(tmp_path / "v"), "--json"]) == 0
    packed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert packed["backends"] == ["vllm"] and "hf/model.safetensors" in packed["files"]
    # genai,vllm: genai's pack (its builder and gate: test_pack_lm) with vllm's hf/ copy added by lm_vllm.more
    seen: dict[str, Any] = {}
    monkeypatch.setattr(lm_pack, "pack_lm", lambda *a, **kw: seen.update(kw) or tmp_path / "both")
    assert hf_pack.pack_from(src, tmp_path / "both", backends=["genai", "vllm"]) == tmp_path / "both"
    assert seen["more"] is lm_vllm.more
    hf_pack.pack_from(src, tmp_path / "both", backends=["genai"])
    assert seen["more"] is None


def test_streamed_chat_is_vllms_tokens_detokenized(start: Any, pack: Path) -> None:
    runtime = start()
    with client_for(runtime) as client:
        body = {"messages": USER, "temperature": 0, "max_tokens": 7, "stream": True,
                "stream_options": {"include_usage": True}}  # fmt: skip
        r = client.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        chunks = events(r.text)
        whole = client.post("/v1/chat/completions", json={**body, "stream": False}).json()
    prompt, params, _ = llm().requests[0]
    want = llm().tokens(prompt["prompt_token_ids"], params, 7)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-2] if c["choices"])
    assert (
        text
        == Tokenizer.from_file(str(pack / "tokenizer.json")).decode(want)
        == whole["choices"][0]["message"]["content"]
    )
    assert chunks[-1] == "[DONE]" and chunks[-3]["choices"][0]["finish_reason"] == "length"
    n = len(prompt["prompt_token_ids"])
    assert chunks[-2]["usage"] == whole["usage"] == {"prompt_tokens": n, "completion_tokens": 7, "total_tokens": n + 7}


def test_the_request_maps_onto_vllms_params(start: Any, pack: Path) -> None:
    runtime = start(WARMSTART_VLLM_GPU_MEMORY_PERCENT="80", WARMSTART_VLLM_MAX_NUM_SEQS="32")
    args = llm().args  # the engine: the pack's hf/ copy, CUDA graphs captured at init, nothing from the checkpoint
    assert (args.model, args.tokenizer) == (str(pack / "hf"), str(pack / "hf"))
    assert (args.enforce_eager, args.enable_sleep_mode, args.generation_config) == (False, False, "vllm")
    assert (args.gpu_memory_utilization, args.max_num_seqs) == (0.8, 32)
    assert args.max_model_len == runtime.manifest.options["context_length"]
    eos = runtime.manifest.options["eos_token_ids"]

    runtime.handle({"prompt": "hi", "temperature": 0, "max_tokens": 3}, None)
    runtime.handle({"prompt": "hi", "temperature": 0.7, "top_p": 0.9, "top_k": 5, "seed": -3, "max_tokens": 4}, None)
    (prompt, greedy, _), (_, sampled, _) = llm().requests
    assert prompt == {"prompt_token_ids": runtime.task.prompt_ids({"prompt": "hi"})}  # type: ignore[attr-defined]
    assert (greedy.temperature, greedy.top_p, greedy.top_k, greedy.seed, greedy.max_tokens) == (0.0, 1.0, 0, None, 3)
    assert (sampled.temperature, sampled.top_p, sampled.top_k, sampled.max_tokens) == (0.7, 0.9, 5, 4)
    assert sampled.seed == (-3) % (1 << 63)  # vLLM reads -1 as "no seed": a negative seed made non-negative
    for params in (greedy, sampled):  # only the manifest's eos ids stop; the task detokenizes; deltas
        assert params.stop_token_ids == eos and params.ignore_eos and not params.detokenize
        assert params.output_kind is fake_vllm.RequestOutputKind.DELTA and params.structured_outputs is None


def test_an_eos_stop_is_not_text_and_finishes_stop(start: Any) -> None:
    runtime = start()
    llm().stop_after = 3
    answer = runtime.handle({"prompt": "hello", "temperature": 0, "max_tokens": 10}, None)
    prompt, params, _ = llm().requests[-1]
    want = Tokenizer.from_file(str(runtime.manifest.root / "tokenizer.json")).decode(
        llm().tokens(prompt["prompt_token_ids"], params, 3)
    )
    assert answer["finish_reason"] == "stop" and answer["text"] == want
    assert answer["usage"]["completion_tokens"] == 3  # the eos token itself is not counted


def test_json_modes_map_to_structured_outputs(start: Any) -> None:
    runtime = start()
    schema = {"type": "object", "properties": {}}
    with client_for(runtime) as client:
        plain = {"messages": USER, "temperature": 0, "max_tokens": 20}
        r = client.post("/v1/chat/completions", json={**plain, "response_format": {"type": "json_object"}})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == '{"ok":true}'
        fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
        r = client.post("/v1/chat/completions", json={**plain, "response_format": fmt})
        assert r.json()["choices"][0]["message"]["content"] == "{}"
        # A schema vLLM's grammar compiler refuses: the request's error (400), typed, before any chunk.
        bogus = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "bogus"}}}
        r = client.post("/v1/chat/completions", json={**plain, "stream": True, "response_format": bogus})
        assert r.status_code == 400 and r.json()["error"]["type"] == "InvalidInputError", r.text
        assert "vLLM refuses the request" in r.json()["error"]["message"]
    object_mode, schema_mode = (p.structured_outputs for _, p, _ in llm().requests[:2])
    assert (object_mode.json_object, object_mode.json, object_mode.disable_any_whitespace) == (True, None, True)
    assert (schema_mode.json, schema_mode.json_object, schema_mode.disable_any_whitespace) == (schema, None, True)


def test_engine_faults_are_typed_and_the_next_request_is_served(start: Any) -> None:
    runtime = start()
    with client_for(runtime) as client:
        body = {"messages": USER, "temperature": 0, "max_tokens": 4}
        llm().fail_with = fake_vllm.EngineDeadError("EngineCore encountered an issue")
        r = client.post("/v1/chat/completions", json=body)
        assert r.status_code == 500 and "vLLM failed the request: EngineDeadError" in r.text
        llm().finish_with = "abort"  # vLLM aborted it (not our client): never a silently short answer
        r = client.post("/v1/chat/completions", json=body)
        assert r.status_code == 500 and "finished the request with 'abort'" in r.text, r.text
        llm().finish_with = None
        assert client.post("/v1/chat/completions", json=body).status_code == 200
    assert runtime.backend._active == 0  # type: ignore[attr-defined]  # every request's count given back
    bad = {"prompt_ids": [1], "max_tokens": 2, "temperature": 0.5, "top_p": 1.0, "top_k": -5, "seed": 1,
           "eos_token_ids": [0], "response_format": None}  # fmt: skip
    with pytest.raises(InvalidInputError, match="vLLM refuses the request: top_k must be 0"):
        runtime.backend.submit(bad)  # type: ignore[attr-defined]


def test_closing_the_stream_aborts_vllms_request(start: Any) -> None:
    runtime = start()
    llm().delay_s = 0.01  # still generating when the reader leaves
    stream = runtime.task.stream({"prompt": "hello", "temperature": 0, "max_tokens": 50})  # type: ignore[attr-defined]
    next(stream)
    stream.close()
    _, _, rid = llm().requests[-1]
    deadline = time.monotonic() + 2
    while rid not in llm().aborted and time.monotonic() < deadline:
        time.sleep(0.01)
    assert llm().aborted == [rid] and runtime.backend._active == 0  # type: ignore[attr-defined]


def test_the_standby_sleeps_the_idle_engine_and_a_request_wakes_it(start: Any) -> None:
    runtime = start(warmup=True, WARMSTART_STANDBY_AFTER_S="1")  # the engine made with sleep mode
    assert llm().args.enable_sleep_mode is True
    body = {"messages": USER, "temperature": 0, "max_tokens": 3}
    with client_for(runtime, HostSettings(standby_after_s=0.2)) as client:
        assert client.post("/v1/chat/completions", json=body).status_code == 200
        deadline = time.monotonic() + 3
        while not runtime.backend.sleeping and time.monotonic() < deadline:  # type: ignore[attr-defined]
            time.sleep(0.02)
        assert llm().calls == ["sleep(1)"]  # level 1: weights to CPU memory, KV cache freed
        asked = len(llm().requests)
        assert client.post("/v1/chat/completions", json={**body, "stream": True}).status_code == 200
        assert llm().calls[:2] == ["sleep(1)", "wake_up"] and len(llm().requests) == asked + 1  # woken first
        standby = client.get("/status").json()["standby"]
        assert standby["after_s"] == 0.2 and standby["sleeping"] is False and standby["error"] is None
        assert standby["sleeps"] == 1 and standby["wakes"] == 1 and standby["last_wake_ms"] is not None
    facts = runtime.backend.describe()  # type: ignore[attr-defined]
    assert facts["sleep_mode"] and facts["standby"]["sleeps"] >= 1 and facts["standby"]["wakes"] == 1
    assert facts["standby"]["last_wake_ms"] is not None


def test_the_standby_setting_is_checked_at_the_boundary() -> None:
    assert standby_after_s({}) is None and standby_after_s({"WARMSTART_STANDBY_AFTER_S": " "}) is None
    assert standby_after_s({"WARMSTART_STANDBY_AFTER_S": "300"}) == 300
    assert HostSettings.from_environ({"WARMSTART_STANDBY_AFTER_S": "60"}).standby_after_s == 60
    for bad, why in (("0", r"outside \[1, 604800\]"), ("soon", "is not an integer")):
        with pytest.raises(ConfigError, match=why):
            HostSettings.from_environ({"WARMSTART_STANDBY_AFTER_S": bad})

    class NoSleep:
        name = "onnx"

    with pytest.raises(ConfigError, match="backend 'onnx' has no sleep mode"):
        Standby.for_backend(NoSleep(), 60)
    assert Standby.for_backend(NoSleep(), None) is None


def test_without_a_gpu_vllm_is_refused_before_its_import(pack: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_vllm.install(monkeypatch)
    monkeypatch.setattr("handler.models.loader.probe_cuda", lambda mode="auto": CudaProbe(False, "no NVIDIA driver"))
    before = len(fake_vllm.ENGINES)
    with pytest.raises(ModelLoadError, match=r"runs on a CUDA GPU .*no NVIDIA driver.*WARMSTART_BACKEND=genai"):
        Runtime.start(Config(model_dir=pack, backend=None, warmup=False), environ={}, emit=None)
    assert len(fake_vllm.ENGINES) == before


def test_vllms_refusal_at_load_is_a_model_load_error(start: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fake_vllm.FakeLLM, "refuse", "Model architectures ['Qwen3ForCausalLM'] failed to be inspected")
    with pytest.raises(ModelLoadError, match=r"hf: vLLM cannot load the model: ValueError: Model architectures"):
        start()  # and its loop thread stopped and closed (an unclosed loop fails the run: filterwarnings=error)
