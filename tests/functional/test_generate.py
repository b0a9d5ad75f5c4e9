"""The `generate` task on the onnxruntime-genai engine, through `Runtime.handle` with JSON events (a direct invoke)
and the HTTP host's native route: a tiny random qwen3 chat model packed as the contract says
(tests/fixtures/genai_pack.py). Greedy answers are token-exact against transformers; max_tokens, eos and stop
strings end it with the right reason; a seed reproduces across calls and instances; the context is checked; a
JSON schema constrains a sampled answer; the invocation's deadline stops it early; `"stream": true` is SSE."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from starlette.testclient import TestClient

from handler.core import deadline
from handler.core.config import Config
from handler.core.errors import InvalidInputError, ModelLoadError
from handler.http_host.host import Host
from handler.http_host.routes import create_app
from handler.runtime.invocation import Runtime
from handler.runtime.workers import Sizing, WorkerPool
from handler.tasks import chat
from handler.tasks.generate import PIECE
from tests.conftest import FakeContext
from tests.fixtures.genai_pack import cached_genai_pack, tiny_genai_pack

HELLO = [{"role": "user", "content": "what is the capital of france ?"}]
GREEDY = {"messages": HELLO, "temperature": 0}


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cached_genai_pack(tmp_path_factory.mktemp("genai"), "qwen3")  # shared with test_genai_batch.py


def start(model: Path, **settings: Any) -> Runtime:
    return Runtime.start(Config(model_dir=model, backend=None, **settings), environ={}, emit=None)


@pytest.fixture(scope="module")
def runtime(pack: Path) -> Runtime:
    return start(pack, warmup=True)


def pieces(runtime: Runtime, payload: dict[str, Any]) -> list[dict[str, Any]]:
    got = list(runtime.task.stream(payload))  # type: ignore[attr-defined]
    for piece in got:
        jsonschema.validate(piece, PIECE)
    return got


def token_ids(got: list[dict[str, Any]]) -> list[int]:
    return [t for piece in got for t in piece["token_ids"]]


def transformers_greedy(src: Path, messages: list[dict[str, Any]], n: int, eos: list[int]) -> tuple[list[int], int]:
    """transformers' greedy tokens for the rendered chat (eos cut off), and the prompt's length."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf = AutoTokenizer.from_pretrained(src)
    prompt = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = hf(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
    model = AutoModelForCausalLM.from_pretrained(src)
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=n, do_sample=False, attention_mask=torch.ones_like(ids))
    want = out[0, ids.shape[1] :].tolist()
    return (want[:-1] if want and want[-1] in eos else want), ids.shape[1]


def test_a_greedy_answer_is_token_exact_against_transformers(runtime: Runtime, pack: Path) -> None:
    from transformers import AutoTokenizer

    src = pack.parent / "src" / "qwen3-lm"
    eos = runtime.manifest.options["eos_token_ids"]
    want, n = transformers_greedy(src, HELLO, 24, eos)
    stopped = len(want) < 24
    got = pieces(runtime, {**GREEDY, "max_tokens": 24})
    assert token_ids(got) == want
    last = got[-1]
    assert last["finish_reason"] == ("stop" if stopped else "length")
    assert last["usage"] == {"prompt_tokens": n, "completion_tokens": len(want), "total_tokens": n + len(want)}
    answer = runtime.handle({**GREEDY, "max_tokens": 24}, None)  # a direct invoke: one gathered answer
    hf = AutoTokenizer.from_pretrained(src)
    assert answer["text"] == hf.decode(want, skip_special_tokens=True) == "".join(p["text"] for p in got)
    assert answer["model"] == "qwen3-tiny@1" and answer["usage"] == last["usage"]


def test_qwen2_greedy_is_token_exact_too(tmp_path: Path) -> None:
    packed = tiny_genai_pack(tmp_path, "qwen2")
    runtime = start(packed)
    chat_ = [{"role": "system", "content": "be brief"}, *HELLO]
    want, _ = transformers_greedy(
        packed.parent / "src" / "qwen2-lm", chat_, 16, runtime.manifest.options["eos_token_ids"]
    )
    assert len(want) >= 4, want  # a real comparison, not two empty answers
    assert token_ids(pieces(runtime, {"messages": chat_, "temperature": 0, "max_tokens": 16})) == want


def test_max_tokens_ends_with_length(runtime: Runtime) -> None:
    answer = runtime.handle({**GREEDY, "max_tokens": 3}, None)
    assert answer["finish_reason"] == "length" and answer["usage"]["completion_tokens"] == 3


def _with_generation(pack: Path, dest: Path, **changes: Any) -> Path:
    """A copy of the pack whose manifest's `generation` has `changes` (the manifest is not among its files)."""
    out = dest / "pack"
    shutil.copytree(pack, out)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["generation"].update(changes)
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


def test_an_eos_token_ends_with_stop_and_is_not_sent(runtime: Runtime, pack: Path, tmp_path: Path) -> None:
    greedy = token_ids(pieces(runtime, {**GREEDY, "max_tokens": 8}))
    third = greedy[2]
    assert third not in greedy[:2], "the test needs the third greedy token to be new"
    eos_at_third = start(_with_generation(pack, tmp_path, eos_token_ids=[third]))
    got = pieces(eos_at_third, {**GREEDY, "max_tokens": 8})
    assert token_ids(got) == greedy[:2]
    assert got[-1]["finish_reason"] == "stop" and got[-1]["usage"]["completion_tokens"] == 2


def test_a_stop_string_is_cut_and_never_sent(runtime: Runtime) -> None:
    full = runtime.handle({**GREEDY, "max_tokens": 24}, None)["text"]
    printable = [i for i in range(4, len(full) - 2) if full[i : i + 2].isprintable() and full[i : i + 2].strip()]
    assert printable, full
    at = printable[0]
    stop = full[at : at + 2]
    cut = full[: full.find(stop)]
    got = pieces(runtime, {**GREEDY, "max_tokens": 24, "stop": ["never there", stop]})
    assert "".join(p["text"] for p in got) == cut
    assert all(stop not in p["text"] for p in got) and got[-1]["finish_reason"] == "stop"
    assert runtime.handle({**GREEDY, "max_tokens": 24, "stop": stop}, None)["text"] == cut


def test_a_seed_reproduces_across_calls_and_instances(runtime: Runtime, pack: Path) -> None:
    sampled = {"prompt": "the sea is", "temperature": 1.0, "top_p": 1.0, "max_tokens": 16}
    first = token_ids(pieces(runtime, {**sampled, "seed": 42}))
    assert token_ids(pieces(runtime, {**sampled, "seed": 42})) == first
    other = start(pack, warmup=False)  # another instance, without the warm-up's run
    assert token_ids(pieces(other, {**sampled, "seed": 42})) == first
    assert token_ids(pieces(runtime, {**sampled, "seed": 43})) != first
    # No seed: one drawn per request, so two answers differ (16 tokens of a 400-token vocabulary alike: ~never).
    assert token_ids(pieces(runtime, sampled)) != token_ids(pieces(runtime, sampled))


def test_a_prompt_over_the_context_is_refused_naming_both_numbers(runtime: Runtime) -> None:
    context = runtime.manifest.options["context_length"]
    with pytest.raises(InvalidInputError, match=rf"\+ max_tokens 600 = \d+ exceeds context length {context}"):
        runtime.handle({**GREEDY, "max_tokens": 600}, None)
    long_prompt = "the quick brown fox " * 400
    with pytest.raises(InvalidInputError, match=rf"the prompt is \d+ tokens; the model's context length is {context}"):
        runtime.handle({"prompt": long_prompt}, None)
    # Without max_tokens, what the context leaves after the prompt.
    got = runtime.handle({"prompt": "the quick brown fox " * 50, "temperature": 0}, None)
    assert got["usage"]["total_tokens"] <= context


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "city": {"enum": ["paris", "tokyo"]},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_a_json_schema_constrains_a_sampled_answer(runtime: Runtime, seed: int) -> None:
    answer = runtime.handle(
        {
            "messages": [{"role": "user", "content": "json please"}],
            "temperature": 1.0,
            "seed": seed,
            "max_tokens": 200,
            "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}},
        },
        None,
    )
    jsonschema.validate(json.loads(answer["text"]), SCHEMA)
    assert answer["finish_reason"] == "stop"


def test_json_object_gives_an_object(runtime: Runtime) -> None:
    free = {"messages": HELLO, "temperature": 1.0, "seed": 5, "max_tokens": 40}
    answer = runtime.handle({**free, "response_format": {"type": "json_object"}}, None)
    if answer["finish_reason"] == "stop":  # an object the model closed within 40 tokens
        assert isinstance(json.loads(answer["text"]), dict)
    else:
        assert answer["text"].startswith("{")
    with pytest.raises(json.JSONDecodeError):  # the same request unconstrained is not JSON
        json.loads(runtime.handle(free, None)["text"])


def test_the_deadline_stops_generation_early_with_length(runtime: Runtime) -> None:
    long = {**GREEDY, "max_tokens": 480, "stop": "never there"}
    free = runtime.handle(long, FakeContext(900_000))
    assert free["usage"]["completion_tokens"] > 100 or free["finish_reason"] == "stop"
    # 0.45 s left is under the 0.5 s margin: nothing is generated; the answer still comes, ended as "length".
    none = runtime.handle(long, FakeContext(450))
    assert none["finish_reason"] == "length" and none["usage"]["completion_tokens"] == 0
    assert deadline.remaining_s() is None  # cleared after the invocation


def test_the_deadline_cuts_a_long_generation(runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    slow = runtime.task.engine._run  # type: ignore[attr-defined]

    def paced(request: dict[str, Any], matcher: Any) -> Iterator[dict[str, Any]]:
        for item in slow(request, matcher):
            time.sleep(0.01)  # 10 ms a token: 480 tokens would take 4.8 s
            yield item

    monkeypatch.setattr(runtime.task.engine, "_run", paced)  # type: ignore[attr-defined]
    started = time.monotonic()
    answer = runtime.handle({"prompt": "the sea", "temperature": 0, "max_tokens": 480}, FakeContext(1_000))
    took = time.monotonic() - started
    assert answer["finish_reason"] == "length" and 5 < answer["usage"]["completion_tokens"] < 80, answer
    assert took < 0.9, took  # stopped before the 1 s deadline


def test_the_http_host_streams_pieces_as_server_sent_events(pack: Path) -> None:
    runtime = start(pack)  # its own instance: the host's shutdown drains the runtime it serves
    workers = WorkerPool(Sizing(min_workers=1, max_workers=1, max_queue=4), cpus=1)
    body = {**GREEDY, "max_tokens": 6}
    with TestClient(create_app(Host(lambda: runtime, workers))) as client:
        one = client.post("/invocations", json=body)
        assert one.status_code == 200
        answer = one.json()
        with client.stream("POST", "/invocations", json={**body, "stream": True}) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            data = [line[5:].strip() for line in r.iter_lines() if line.startswith("data:")]
        refused = client.post("/invocations", json={"prompt": "x", "temperature": 9, "stream": True})
    assert data[-1] == "[DONE]"
    got = [json.loads(d) for d in data[:-1]]
    for piece in got:
        jsonschema.validate(piece, PIECE)
    assert "".join(p["text"] for p in got) == answer["text"]
    assert got[-1]["finish_reason"] == answer["finish_reason"] == "length"
    assert got[-1]["usage"] == answer["usage"] and answer["usage"]["completion_tokens"] == 6
    assert refused.status_code == 400 and refused.json()["error"]["type"] == "InvalidInputError"
    assert '"temperature"' in refused.json()["error"]["message"]


def test_the_init_report_names_the_kv_budget(runtime: Runtime, pack: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    facts = runtime.init_report["kv_budget"]
    assert facts["kv_bytes_per_token"] == 2 * 2 * 2 * 16 * 4  # 2 x layers x kv heads x head dim x 4 bytes
    if facts["memory_from"] == "fallback":  # no known memory limit here: the context length is the only limit
        assert facts["max_total_tokens"] is None
    # A Lambda's memory setting: the memory left after the model, over 512 bytes a token, at most the context.
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "10240")
    big = start(pack).init_report["kv_budget"]
    assert big["memory_from"] == "lambda" and big["max_total_tokens"] == 512  # the context length bounds it
    # Less than the process already holds: the init fails with the figures (it used to start with a budget of
    # one token and refuse every request, its warm-up's included).
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "1")
    with pytest.raises(ModelLoadError, match=r"too little memory: .* of 1 MB \(lambda\).* room for 0 tokens"):
        start(pack, warmup=False)


def test_a_kv_budget_under_the_context_refuses_a_request_over_it(runtime: Runtime) -> None:
    engine = runtime.task.engine  # type: ignore[attr-defined]
    task = runtime.task
    saved = engine.max_total_tokens, task.max_total  # type: ignore[attr-defined]
    try:
        engine.max_total_tokens = task.max_total = 40  # type: ignore[attr-defined]
        with pytest.raises(InvalidInputError, match="one request may hold in this instance's memory 40"):
            runtime.handle({**GREEDY, "max_tokens": 30}, None)
    finally:
        engine.max_total_tokens, task.max_total = saved  # type: ignore[attr-defined]


def test_a_chat_template_error_is_the_requests(runtime: Runtime) -> None:
    assert chat.compile_template.cache_info().currsize >= 1  # compiled once, at the warm-up or first chat
    with pytest.raises(InvalidInputError, match=r'"messages"\[0\].role'):
        runtime.handle({"messages": [{"role": "robot", "content": "x"}]}, None)


def test_a_schema_that_cannot_be_compiled_is_the_requests_error(runtime: Runtime) -> None:
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}
    with pytest.raises(InvalidInputError, match='"response_format": the schema cannot be used'):
        runtime.handle({**GREEDY, "max_tokens": 4, "response_format": bad}, None)


def test_a_function_url_event_gets_the_answer_and_a_typed_400(runtime: Runtime) -> None:
    from tests.conftest import http_v2_event

    direct = runtime.handle({**GREEDY, "max_tokens": 5}, None)
    reply = runtime.handle(http_v2_event("/", {**GREEDY, "max_tokens": 5, "stream": True}), FakeContext(60_000))
    assert reply["statusCode"] == 200 and json.loads(reply["body"]) == direct  # one buffered answer on Lambda
    refused = runtime.handle(http_v2_event("/", {"prompt": "x", "top_p": 0}), None)
    error = json.loads(refused["body"])["error"]
    assert refused["statusCode"] == 400 and error["type"] == "InvalidInputError" and '"top_p"' in error["message"]


def test_concurrent_requests_each_get_their_own_generator(runtime: Runtime) -> None:
    from concurrent.futures import ThreadPoolExecutor

    asks = [{"prompt": "the sea is", "temperature": 1.0, "max_tokens": 24, "seed": s} for s in range(6)]
    alone = [token_ids(pieces(runtime, ask)) for ask in asks]
    with ThreadPoolExecutor(6) as pool:  # as the HTTP host's workers run them: one model, six generators at once
        together = list(pool.map(lambda ask: token_ids(pieces(runtime, ask)), asks))
    assert together == alone and len({tuple(t) for t in alone}) == 6
