"""The `generate` task over the fake engine (tests/fixtures/fake_engine.py: deterministic tokens, no model), through
`Runtime.handle`: what the task does around any engine — pieces per token, stop strings held back across pieces,
a closed stream closing the engine's, the deadline against a paced engine, the engine's own "stop", the
WARMSTART_MAX_TOKENS cap — and the fake engine itself as other tests will use it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from handler.core.config import Config
from handler.core.errors import InvalidInputError
from handler.runtime.invocation import Runtime
from handler.tasks import chat
from tests.conftest import FakeContext
from tests.fixtures.fake_engine import FakeEngine, fake_generate_pack, register


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fake_generate_pack(tmp_path_factory.mktemp("fake"), "qwen3")


@pytest.fixture
def start(pack: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    register(monkeypatch)

    def make(**env: str) -> Runtime:
        return Runtime.start(Config(model_dir=pack, backend=None, warmup=False), environ=env, emit=None)

    return make


def engine(runtime: Runtime) -> FakeEngine:
    assert isinstance(runtime.backend, FakeEngine)
    return runtime.backend


PROMPT = {"prompt": "hello world", "temperature": 0, "max_tokens": 12}


def test_each_token_is_a_piece_and_the_answer_is_their_text(start: Any, pack: Path) -> None:
    runtime = start()
    pieces = list(runtime.task.stream(PROMPT))  # type: ignore[attr-defined]
    request = engine(runtime).requests[-1]
    want = engine(runtime).tokens(request, 12)
    assert [p["token_ids"] for p in pieces[:-1]] == [[t] for t in want]
    tok = Tokenizer.from_file(str(pack / "tokenizer.json"))
    assert "".join(p["text"] for p in pieces) == tok.decode(want)
    assert pieces[-1] == {
        "text": "",
        "token_ids": [],
        "finish_reason": "length",
        "usage": {"prompt_tokens": len(request["prompt_ids"]), "completion_tokens": 12,
                  "total_tokens": len(request["prompt_ids"]) + 12},
    }  # fmt: skip
    answer = runtime.handle(PROMPT, None)
    assert answer["text"] == tok.decode(want) and answer["model"] == "fake-lm@1"
    # The task's request to the engine: the contract's fields, the seed always given.
    assert set(request) == {"prompt_ids", "max_tokens", "temperature", "top_p", "top_k", "seed", "eos_token_ids",
                            "response_format"}  # fmt: skip
    assert request["eos_token_ids"] == runtime.manifest.options["eos_token_ids"]
    assert isinstance(request["seed"], int) and request["response_format"] is None


def test_a_stop_string_across_pieces_is_held_back_then_cut(start: Any) -> None:
    runtime = start()
    plain = list(runtime.task.stream(PROMPT))  # type: ignore[attr-defined]
    texts = [p["text"] for p in plain[:-1]]
    k = next(i for i in range(1, len(texts) - 1) if texts[i] and texts[i + 1])
    stop = texts[k][-1] + texts[k + 1][:1]  # spans the boundary of pieces k and k + 1
    full = "".join(texts)
    pieces = list(runtime.task.stream({**PROMPT, "stop": stop}))  # type: ignore[attr-defined]
    assert "".join(p["text"] for p in pieces) == full[: full.find(stop)]
    assert all(stop not in p["text"] for p in pieces) and pieces[-1]["finish_reason"] == "stop"
    # The character that could begin it was not sent with piece k: held until piece k + 1 proved it a stop.
    assert all(not p["text"].endswith(stop[0]) or stop[0] in stop[1:] for p in pieces[:-1])


def test_closing_the_stream_closes_the_engines(start: Any) -> None:
    runtime = start()
    stream = runtime.task.stream(PROMPT)  # type: ignore[attr-defined]
    next(stream)
    stream.close()
    assert engine(runtime).closed == 1 and len(engine(runtime).made) == 1


def test_the_engines_stop_ends_with_stop(start: Any) -> None:
    runtime = start(WARMSTART_FAKE_STOP_AFTER="3")
    answer = runtime.handle(PROMPT, None)
    assert answer["finish_reason"] == "stop" and answer["usage"]["completion_tokens"] == 3


def test_the_deadline_stops_a_paced_engine(start: Any) -> None:
    runtime = start(WARMSTART_FAKE_DELAY_MS="20")
    answer = runtime.handle({**PROMPT, "max_tokens": 200}, FakeContext(800))  # ~0.3 s before the margin
    assert answer["finish_reason"] == "length" and 3 <= answer["usage"]["completion_tokens"] <= 20, answer
    assert engine(runtime).closed == 1  # the engine's generation was stopped, not left running


def test_seeds_with_sampling(start: Any) -> None:
    runtime = start()
    sampled = {"prompt": "hello", "temperature": 0.8, "max_tokens": 6}
    one = runtime.handle({**sampled, "seed": 1}, None)["text"]
    assert runtime.handle({**sampled, "seed": 1}, None)["text"] == one
    assert runtime.handle({**sampled, "seed": 2}, None)["text"] != one
    runtime.handle(sampled, None)
    runtime.handle(sampled, None)
    assert len({r["seed"] for r in engine(runtime).requests[-2:]}) == 2  # drawn per request


def test_max_tokens_setting_caps_and_defaults(start: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WARMSTART_MAX_TOKENS", "8")
    runtime = start()
    assert runtime.handle({"prompt": "hello", "temperature": 0}, None)["usage"]["completion_tokens"] == 8
    with pytest.raises(InvalidInputError, match='"max_tokens" must be from 1 to 8, got 9'):
        runtime.handle({"prompt": "hello", "max_tokens": 9}, None)


def test_sampling_defaults_come_from_the_manifest(start: Any) -> None:
    runtime = start()
    runtime.handle({"prompt": "hello", "max_tokens": 1}, None)
    request = engine(runtime).requests[-1]
    # tests/lm_models.py's generation_config: do_sample, temperature 0.7, top_p 0.8, top_k 20
    assert (request["temperature"], request["top_p"], request["top_k"]) == (pytest.approx(0.7), pytest.approx(0.8), 20)
    runtime.handle({"prompt": "hello", "max_tokens": 1, "temperature": 0, "top_k": 0}, None)
    assert engine(runtime).requests[-1]["temperature"] == 0 and engine(runtime).requests[-1]["top_k"] == 0


def test_a_json_response_format_gives_json(start: Any) -> None:
    runtime = start()
    ask = {"prompt": "hello", "max_tokens": 50}
    got = runtime.handle({**ask, "response_format": {"type": "json_object"}}, None)
    assert got["text"] == '{"fake":true}' and got["finish_reason"] == "stop"
    schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    assert runtime.handle({**ask, "response_format": schema}, None)["text"] == "{}"


def test_the_warm_up_runs_the_engine_on_a_short_prompt_and_only_compiles_the_chat(
    pack: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The warm-up is init's (a host's start, provisioned Lambda): the first run's one-time costs, not a chat's
    # prefill that no request reuses. The chat template is compiled by it all the same.
    register(monkeypatch)
    chat.compile_template.cache_clear()
    runtime = Runtime.start(Config(model_dir=pack, backend=None, warmup=True), environ={}, emit=None)
    assert "warmup" in runtime.init_report["phases_ms"]
    (request,) = engine(runtime).requests  # one engine run, on the raw one-word prompt
    assert len(request["prompt_ids"]) <= 2 and request["max_tokens"] == 2 and request["temperature"] == 0
    template = runtime.manifest.options["chat_template"]
    assert template is not None and chat.compile_template.cache_info().currsize == 1
    hits = chat.compile_template.cache_info().hits
    chat.compile_template(template)
    assert chat.compile_template.cache_info().hits == hits + 1  # the first chat finds it compiled
