"""Many streams sharing the decode steps (handler.backends.genai_batch, WARMSTART_GENAI_BATCH > 1) on a tiny random
qwen3 pack: greedy answers alone, batched and from the single-stream engine are the same tokens; a request joins
a running batch and leaves it (its reader closing frees its row and blocks); a KV pool with room for one request
makes the next wait, never share; a full queue is 503 with Retry-After on the HTTP host; a JSON-constrained row
batched with free ones still gives JSON; the settings are checked at the boundary."""

from __future__ import annotations

import hashlib
import json
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from handler.backends.genai_batch import wait_idle
from handler.backends.genai_spec import GenaiSettings
from handler.core.config import Config
from handler.core.errors import ConfigError, InvalidInputError, ServiceBusyError
from handler.http_host.host import Host
from handler.http_host.routes import create_app
from handler.runtime.invocation import Runtime
from handler.runtime.workers import Sizing, WorkerPool
from tests.fixtures.genai_pack import cached_genai_pack

PROMPTS = [
    "the sea",
    "what is the capital of france ? paris is",
    "hello",
    "json { name age } write a short poem about the sea . the sea is blue and deep",
]


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cached_genai_pack(tmp_path_factory.mktemp("genai"), "qwen3")


def start(pack: Path, **env: str) -> Runtime:
    return Runtime.start(Config(model_dir=pack, backend=None, warmup=False), environ=env, emit=None)


@pytest.fixture(scope="module")
def batched(pack: Path) -> Runtime:
    return start(pack, WARMSTART_GENAI_BATCH="4")


def greedy(runtime: Runtime, prompt: str, n: int = 24) -> list[int]:
    ask = {"prompt": prompt, "temperature": 0, "max_tokens": n}
    return [t for piece in runtime.task.stream(ask) for t in piece["token_ids"]]  # type: ignore[attr-defined]


def engine(runtime: Runtime) -> Any:
    return runtime.backend.batch  # type: ignore[attr-defined]


def gated(runtime: Runtime, pace_s: float = 0.0) -> tuple[threading.Event, Callable[[], None]]:
    """Hold the scheduler before each model run until the event is set (so a test sees rows in place), and
    then `pace_s` more a run; the second callable puts the engine back."""
    gate = threading.Event()
    batch = engine(runtime)
    run = batch._step

    def held(*args: Any, **kwargs: Any) -> None:
        gate.wait(10)
        time.sleep(pace_s)
        run(*args, **kwargs)

    batch._step = held
    return gate, lambda: setattr(batch, "_step", run)


def test_greedy_alone_batched_and_single_stream_are_the_same_tokens(pack: Path, batched: Runtime) -> None:
    single = start(pack)
    expected = [greedy(single, p) for p in PROMPTS]
    alone = [greedy(batched, p) for p in PROMPTS]
    steps = engine(batched).steps
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = list(pool.map(lambda p: greedy(batched, p), PROMPTS))
    assert alone == expected and together == expected
    assert len({tuple(t) for t in expected}) == len(PROMPTS)
    # Fewer model runs than the requests' tokens: they shared steps.
    assert engine(batched).steps - steps < sum(len(t) for t in expected)
    assert engine(batched).largest >= 2
    facts = batched.backend.describe()["batch"]
    assert facts["rows"] == 4 and facts["kv_block_tokens"] == 64
    assert engine(batched).last_only  # the head ran over each row's last token only (handler.backends.lastlogits)


def test_a_request_joins_a_running_batch_and_leaves_when_its_reader_closes(batched: Runtime) -> None:
    batch = engine(batched)
    expected = greedy(batched, "hello", 8)
    gate, ungate = gated(batched, pace_s=0.002)  # each step 2 ms longer: the long request outlasts the short
    try:
        gate.set()
        long: Iterator[dict[str, Any]] = batched.task.stream(  # type: ignore[attr-defined]
            {"prompt": "the sea", "temperature": 0, "max_tokens": 480}
        )
        next(long)  # the long one is decoding
        assert greedy(batched, "hello", 8) == expected  # joined, answered while the long one runs
        assert [r.max_tokens for r in batch._rows if not r.done] == [480]
        assert batch._free_blocks < batch.pool_blocks
        long.close()  # the reader leaves: its row and blocks are free at the next step
        assert wait_idle(batch)
    finally:
        ungate()
    assert batch._free_blocks == batch.pool_blocks and batch._decoding == 0 and not batch._rows


def test_a_pool_with_room_for_one_makes_the_next_wait_never_share(pack: Path) -> None:
    runtime = start(pack, WARMSTART_GENAI_BATCH="4", WARMSTART_GENAI_KV_TOKENS="128")
    batch = engine(runtime)
    assert runtime.backend.max_total_tokens == 128  # type: ignore[attr-defined]
    alone = [greedy(runtime, p, 60) for p in PROMPTS[:2]]
    gate, ungate = gated(runtime)
    try:
        with ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(greedy, runtime, p, 60) for p in PROMPTS[:2]]
            assert wait_for(lambda: len(batch._rows) == 1 and len(batch._waiting) == 1)  # no blocks for the second
            gate.set()
            together = [f.result(60) for f in futures]
    finally:
        ungate()
    assert together == alone
    with pytest.raises(InvalidInputError, match="128"):  # more than the whole pool: refused, naming it
        list(runtime.task.stream({"prompt": "the sea", "max_tokens": 200}))  # type: ignore[attr-defined]


def wait_for(check: Callable[[], bool], timeout_s: float = 60.0) -> bool:  # generous: a loaded CI host
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.005)
    return False


def test_a_full_queue_is_503_with_retry_after_on_the_http_host(pack: Path) -> None:
    runtime = start(pack, WARMSTART_GENAI_BATCH="2", WARMSTART_GENAI_QUEUE="1")
    batch = engine(runtime)
    gate, ungate = gated(runtime)
    held = [runtime.task.stream({"prompt": p, "temperature": 0, "max_tokens": 4}) for p in PROMPTS[:2]]  # type: ignore[attr-defined]
    try:
        firsts = [pool_next(held[0])]  # one row at its first step (held by the gate), then one waiting: in turn,
        assert wait_for(lambda: len(batch._rows) == 1)  # or both may join the same first step
        firsts.append(pool_next(held[1]))
        assert wait_for(lambda: len(batch._rows) == 1 and len(batch._waiting) == 1)
        workers = WorkerPool(Sizing(min_workers=1, max_workers=2, max_queue=4), cpus=1)
        with TestClient(create_app(Host(lambda: runtime, workers))) as client:
            refused = client.post("/invocations", json={"prompt": "x", "max_tokens": 2, "stream": True})
            assert workers.sizing.min_workers >= 3  # a worker for each stream the engine takes, and one more
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["type"] == ServiceBusyError.__name__
        assert "WARMSTART_GENAI_QUEUE=1" in refused.json()["error"]["message"]
        gate.set()
        assert all("token_ids" in f.result(60) for f in firsts)  # both served once a row was free
    finally:
        gate.set()
        ungate()
        for it in held:
            it.close()
    assert wait_idle(batch)


def pool_next(it: Iterator[dict[str, Any]]) -> Any:
    """The first piece, read on a thread (a reader blocks until the scheduler gives it a token)."""
    from concurrent.futures import Future

    done: Future[Any] = Future()
    threading.Thread(target=lambda: done.set_result(next(it)), daemon=True).start()
    return done


def test_a_json_row_batched_with_free_rows_gives_json(batched: Runtime) -> None:
    free = {"prompt": "json please", "temperature": 1.0, "max_tokens": 40}
    asks = [{**free, "seed": s} for s in range(3)]
    asks.append({**free, "seed": 7, "max_tokens": 80, "response_format": {"type": "json_object"}})
    with ThreadPoolExecutor(len(asks)) as pool:
        answers = list(pool.map(lambda a: batched.handle(a, None), asks))
    constrained = answers[-1]
    if constrained["finish_reason"] == "stop":
        assert isinstance(json.loads(constrained["text"]), dict)
    else:
        assert constrained["text"].startswith("{")
    again = batched.handle(asks[0], None)  # a seed reproduces whatever shared its steps
    assert again["text"] == answers[0]["text"]


def test_the_settings_are_checked_at_the_boundary() -> None:
    assert GenaiSettings.from_environ({}) == GenaiSettings(1, 0, 1)
    assert GenaiSettings.from_environ({"WARMSTART_GENAI_BATCH": "8"}).queue == 8
    # One request per instance on Lambda: batching is off whatever the setting.
    on_lambda = {"WARMSTART_GENAI_BATCH": "8", "AWS_LAMBDA_FUNCTION_NAME": "f"}
    assert GenaiSettings.from_environ(on_lambda).batch == 1
    for key, value in (("WARMSTART_GENAI_BATCH", "0"), ("WARMSTART_GENAI_BATCH", "x"), ("WARMSTART_GENAI_QUEUE", "-1")):
        with pytest.raises(ConfigError, match=key):
            GenaiSettings.from_environ({key: value})


def pruned_copy(pack: Path, out: Path) -> Path:
    """The pack with its head pruned as the builder's prune_lm_head writes it (infra.pack.lm_pack sets it):
    Gather(-1) + Unsqueeze over the hidden states before the head, logits [batch, 1, vocab]."""
    import onnx  # pack-time library, available to the tests

    shutil.copytree(pack, out)
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    graph = model.graph
    head = next(n for n in graph.node if list(n.output) == ["logits"])
    gather, unsqueeze = "/lm_head/prune/Gather", "/lm_head/prune/Unsqueeze"
    graph.initializer.extend(
        [
            onnx.helper.make_tensor("prune/-1", onnx.TensorProto.INT64, [], [-1]),
            onnx.helper.make_tensor("prune/[1]", onnx.TensorProto.INT64, [1], [1]),
        ]
    )
    at = list(graph.node).index(head)
    graph.node.insert(
        at, onnx.helper.make_node("Gather", [head.input[0], "prune/-1"], [f"{gather}/output_0"], gather, axis=1)
    )
    graph.node.insert(
        at + 1,
        onnx.helper.make_node("Unsqueeze", [f"{gather}/output_0", "prune/[1]"], [f"{unsqueeze}/output_0"], unsqueeze),
    )
    head.input[0] = f"{unsqueeze}/output_0"
    logits = next(o for o in graph.output if o.name == "logits")
    logits.type.tensor_type.shape.dim[1].ClearField("dim_param")
    logits.type.tensor_type.shape.dim[1].dim_value = 1
    onnx.save(model, str(out / "model.onnx"))
    manifest = json.loads((out / "manifest.json").read_text())
    data = (out / "model.onnx").read_bytes()
    manifest["files"]["model.onnx"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


def test_a_pruned_head_still_gives_each_row_its_own_last_token(pack: Path, tmp_path: Path) -> None:
    # Rows of different lengths in one prefill: the pruned graph's Gather(-1) is the padded batch's last
    # position; the batch engine must read each row's own (before the fix: an out-of-range GatherND).
    expected = [greedy(start(pack), p) for p in PROMPTS]
    runtime = start(pruned_copy(pack, tmp_path / "pruned"), WARMSTART_GENAI_BATCH="4")
    assert engine(runtime).last_only
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = list(pool.map(lambda p: greedy(runtime, p), PROMPTS))
    assert together == expected


def test_greedy_and_sampled_rows_sharing_steps_each_keep_their_own_tokens(batched: Runtime) -> None:
    # A step's greedy tokens come from one argmax over every row's logits: a sampled row between greedy ones
    # must still sample from its own row, and each greedy row get its own argmax.
    sampled = {"prompt": "the sea", "temperature": 1.0, "top_p": 1.0, "top_k": 0, "seed": 3, "max_tokens": 24}
    alone = [greedy(batched, p) for p in PROMPTS[:3]]
    sampled_alone = batched.handle(sampled, None)["text"]
    asks: list[Any] = [PROMPTS[0], sampled, PROMPTS[1], PROMPTS[2]]

    def run(ask: Any) -> Any:
        return greedy(batched, ask) if isinstance(ask, str) else batched.handle(ask, None)["text"]

    with ThreadPoolExecutor(len(asks)) as pool:
        together = list(pool.map(run, asks))
    assert [together[0], together[2], together[3]] == alone
    assert together[1] == sampled_alone


def test_decode_steps_reuse_their_binding_and_one_logits_buffer(batched: Runtime) -> None:
    # The KV arrays and the logits output are bound once per slot range, not rebound every step; every run
    # writes its logits into one buffer (no fresh pages a step).
    batch = engine(batched)
    greedy(batched, "hello", 4)
    buffer = batch._logits[False]
    steps, kept = batch.steps, dict(batch._bindings)
    assert greedy(batched, "hello", 16)
    assert batch.steps - steps >= 16  # the prefill and 16 decode steps ...
    assert batch._bindings == kept and batch._logits[False] is buffer  # ... on the bindings the first request made
    assert buffer.shape == (batch.max_rows, batch.vocab)


class Runs:
    """The engine's session, each model run noted: rows and width of its ids, and how many runs were in flight
    when it started (a step's prompt run and decode run overlap)."""

    def __init__(self, batch: Any) -> None:
        self.batch, self.session = batch, batch.session
        self.lock = threading.Lock()
        self.flying = 0
        self.runs: list[tuple[int, int, int]] = []  # (rows, width, runs in flight at its start, itself counted)
        self.ids: dict[int, Any] = {}

    def io_binding(self) -> Any:
        binding = self.session.io_binding()
        noted = self
        bind = binding.bind_cpu_input

        def bind_cpu_input(name: str, value: Any) -> None:
            if name == "input_ids":
                noted.ids[id(binding)] = value.shape
            bind(name, value)

        binding.bind_cpu_input = bind_cpu_input
        return binding

    def run_with_iobinding(self, binding: Any) -> None:
        with self.lock:
            self.flying += 1
            rows, width = self.ids[id(binding)]
            self.runs.append((rows, width, self.flying))
        try:
            time.sleep(0.02)  # each run 20 ms longer: two that overlap are seen to
            self.session.run_with_iobinding(binding)
        finally:
            with self.lock:
                self.flying -= 1

    def __enter__(self) -> Runs:
        self.batch.session = self
        self.batch._bindings.clear()  # bindings made from the noted session's io_binding
        return self

    def __exit__(self, *exc: object) -> None:
        self.batch.session = self.session
        self.batch._bindings.clear()


def held_admission(batch: Any) -> tuple[threading.Event, Callable[[], None]]:
    """Requests wait (none joins) until the event is set, so a test has them all waiting at one admission; the
    second callable puts the engine back."""
    admit = threading.Event()
    real = batch._admit_locked

    def held() -> None:
        if admit.is_set():
            real()
        else:
            time.sleep(0.001)  # the scheduler's loop comes straight back: not a busy spin

    batch._admit_locked = held
    return admit, lambda: setattr(batch, "_admit_locked", real)


def test_waiting_prompts_join_one_prompt_run_while_rows_decode_and_it_overlaps_the_decode_run(
    batched: Runtime,
) -> None:
    # Before: while a row decoded, a step took 32 padded prompt tokens (two of these 4-16 token prompts, the
    # third a step later), and the prompt run ended before the decode run started.
    batch = engine(batched)
    prompts = [PROMPTS[1], "the sea", "a short poem about the deep blue sea"]  # + the long one: the 4 rows
    alone = [greedy(batched, p, 8) for p in prompts]
    long_alone = greedy(batched, "hello", 60)
    with Runs(batch) as runs:  # every run 20 ms longer: the long row outlasts the three's arrival
        long: Iterator[dict[str, Any]] = batched.task.stream(  # type: ignore[attr-defined]
            {"prompt": "hello", "temperature": 0, "max_tokens": 60}
        )
        long_tokens = list(next(long)["token_ids"])  # it decodes
        admit, put_back = held_admission(batch)
        try:
            with ThreadPoolExecutor(len(prompts)) as pool:
                answers = pool.map(lambda p: greedy(batched, p, 8), prompts)
                assert wait_for(lambda: len(batch._waiting) == len(prompts))
                admit.set()
                together = list(answers)
        finally:
            put_back()
        long_tokens += [t for piece in long for t in piece["token_ids"]]
    assert together == alone and long_tokens == long_alone  # each row its own tokens, overlapped or not
    prompt_runs = [r for r in runs.runs if r[1] > 1]
    assert prompt_runs[1][0] == len(prompts)  # after the long one's prompt, the three in one run ...
    assert max(r[2] for r in runs.runs) == 2  # ... beside the long row's decode run


def test_a_burst_of_prompts_with_no_row_decoding_runs_as_one(pack: Path) -> None:
    # Before: 128 padded tokens with no row decoding (five of these eight ~25-token prompts in the first run).
    runtime = start(pack, WARMSTART_GENAI_BATCH="8")
    batch = engine(runtime)
    prompts = [f"{i} a short poem about the deep blue sea and the wide sky" for i in range(8)]
    alone = [greedy(runtime, p, 4) for p in prompts]
    admit, put_back = held_admission(batch)
    try:
        with Runs(batch) as runs, ThreadPoolExecutor(len(prompts)) as pool:
            answers = pool.map(lambda p: greedy(runtime, p, 4), prompts)
            assert wait_for(lambda: len(batch._waiting) == len(prompts))
            admit.set()
            together = list(answers)
    finally:
        put_back()
    assert together == alone
    assert runs.runs[0][0] == len(prompts)  # the first run: every prompt
