"""The vLLM engine (backend "vllm", needs "request"): the pack's `hf/` copy of the source directory served by
vLLM's AsyncLLMEngine on a CUDA GPU, with continuous batching and a paged KV cache across the host's streams.

`submit(request)` takes what the `generate` task built (prompt ids, max tokens, sampling, the seed, eos ids, an
optional JSON constraint) and returns an iterator of `{"token_id"}` ending with `{"finish_reason"}`, the same
contract as onnxruntime-genai's engine (handler.backends.genai): the task detokenizes, cuts stop strings and
counts usage, so the answers' shapes are the same whichever engine runs. vLLM is told exactly what the manifest
says: the eos ids are its stop token ids (`ignore_eos`: not the tokenizer's own eos), the generation config is
not read (`generation_config="vllm"`), and it does not detokenize.

The engine runs on its own event loop in one thread; a request's outputs cross to the caller's thread through a
queue. Closing the iterator cancels the request's task, which aborts it in vLLM (its KV blocks freed at once).

Init captures the CUDA graphs (unless WARMSTART_VLLM_ENFORCE_EAGER) inside vLLM's engine construction, and the
task's warm-up runs two tokens through it: both off the first request's path. With sleep mode enabled (the host's
warm standby is set: handler.http_host.standby), `sleep()` puts the engine at level 1 (weights copied to CPU
memory, the KV cache freed) and the next request wakes it first.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import time
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

from handler.backends.contract import BackendSettings
from handler.backends.vllm_spec import HF_DIR, NAME, VllmSettings
from handler.core.errors import InvalidInputError, ModelLoadError, ModelRunError
from handler.core.manifest import Manifest
from handler.core.types import JSON
from handler.observability.report import PhaseTimer

T = TypeVar("T")
SEED_RANGE = 1 << 63  # torch's generator takes a 64-bit seed; vLLM reads -1 as "none": ours are made non-negative
SLEEP_LEVEL = 1  # weights kept in CPU memory (a wake copies them back), the KV cache dropped
FINISHED = {"stop": "stop", "length": "length"}  # vLLM's finish reasons the task has; "abort", "error": a fault
_END = object()  # the pump's last item


class _Failed:
    """An exception raised on the engine's loop, carried to the caller's thread."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class VllmEngine:
    name = NAME

    def __init__(self) -> None:
        self.engine: Any = None
        self.vllm: Any = None
        self.own = VllmSettings(0.9, None, False, False)
        self.threads = 1
        self.device_reason = ""
        self.max_total_tokens: int | None = None  # vLLM pages its KV cache: the context length is the limit
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ids = itertools.count()
        self._state = threading.Lock()  # sleep, wake and the count of requests running change under it
        self._active = 0
        self.last_used = time.monotonic()  # a request's start or end: the host's standby counts idle time from it
        self.sleeping = False
        self.standby: dict[str, Any] = {"sleeps": 0, "wakes": 0, "last_sleep_ms": None, "last_wake_ms": None}

    def initialize(self, manifest: Manifest, settings: BackendSettings[Any], timer: PhaseTimer) -> None:
        entry = manifest.backends[NAME]
        if entry.get("dir", HF_DIR) != HF_DIR:
            raise ModelLoadError(f"{manifest.root}: backends.vllm.dir must be {HF_DIR!r}")
        if f"{HF_DIR}/config.json" not in entry.get("files", []):
            raise ModelLoadError(f"{manifest.root}: backends.vllm lists no {HF_DIR}/config.json: pack it again")
        if not settings.cuda.usable:
            raise ModelLoadError(
                f"backend vllm runs on a CUDA GPU and none is usable here ({settings.cuda.reason}): on a CPU "
                "choose WARMSTART_BACKEND=genai"
            )
        self.own = settings.own if isinstance(settings.own, VllmSettings) else self.own
        self.threads = settings.threads
        self.device_reason = f"vLLM on {', '.join(settings.cuda.devices) or settings.cuda.reason}"
        with timer.phase("vllm_import"):
            # Deferred to here: vLLM imports torch, transformers and its kernels (seconds); only a start that chose
            # this backend pays, and a bad setting or a missing GPU is refused before it.
            import vllm  # type: ignore[import-not-found,unused-ignore]  # the GPU image's extra only
            from vllm.exceptions import VLLMClientError  # type: ignore[import-not-found,unused-ignore]
            from vllm.sampling_params import (  # type: ignore[import-not-found,unused-ignore]
                RequestOutputKind,
                StructuredOutputsParams,
            )

            self.vllm = vllm
            # vLLM's request errors (a validation error, an admission refusal): the request's fault, a 400.
            self._client_error: type[BaseException] = VLLMClientError
            self._delta, self._structured_params = RequestOutputKind.DELTA, StructuredOutputsParams
        root = manifest.root / HF_DIR
        args = vllm.AsyncEngineArgs(
            model=str(root),
            tokenizer=str(root),
            dtype="auto",  # the checkpoint's dtype; a float32 one runs in the GPU's preferred half type (vLLM's rule)
            seed=0,
            max_model_len=int(manifest.options["context_length"]),
            gpu_memory_utilization=self.own.gpu_memory_utilization,
            max_num_seqs=self.own.max_num_seqs,
            enforce_eager=self.own.enforce_eager,  # False: CUDA graphs captured now, not at the first request
            enable_sleep_mode=self.own.sleep_mode,
            generation_config="vllm",  # the request carries every sampling option; nothing from the checkpoint
            disable_log_stats=True,
        )
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=_run_loop, args=(self._loop,), name="warmstart-vllm", daemon=True).start()
        with timer.phase("load"):  # weights to the GPU, the KV cache sized, the CUDA graphs captured
            try:
                # Made on the loop every request runs on: vLLM then starts its output handlers there at once (made
                # outside a running loop, they start at the first request, and an engine failure before it is missed).
                self.engine = self._call(_construct(vllm.AsyncLLMEngine, args))
            except Exception as e:  # vLLM's own refusal (an architecture it lacks, too little GPU memory)
                self.close()
                raise ModelLoadError(f"{root}: vLLM cannot load the model: {type(e).__name__}: {e}") from None

    def warm_device(self) -> dict[str, Any]:
        # The context, the weights and the CUDA graphs were made by the engine's construction; the task's warm-up
        # (two tokens) then runs a real step.
        return {"cuda": True, "reason": self.device_reason, "cuda_graphs": not self.own.enforce_eager}

    def set_threads(self, threads: int) -> int:
        # vLLM's work is on the GPU; its CPU threads are its own.
        return self.threads

    def describe(self) -> dict[str, Any]:
        return {
            "backend": NAME,
            "providers": ["cuda"],
            "device": "cuda",
            "device_reason": self.device_reason,
            "threads": self.threads,
            "vllm": getattr(self.vllm, "__version__", None),
            "cuda_graphs": not self.own.enforce_eager,
            "sleep_mode": self.own.sleep_mode,
            "sleeping": self.sleeping,
            "standby": dict(self.standby),
        }

    # -- the engine's loop --

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        assert self._loop is not None, "initialize() first"
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    # -- sleep mode (the host's warm standby) --

    def sleep(self) -> bool:
        """Level 1 sleep when idle: False (nothing done) while a request runs, when asleep, or without sleep mode."""
        with self._state:
            if not self.own.sleep_mode or self.sleeping or self._active:
                return False
            t0 = time.perf_counter()
            self._call(self.engine.sleep(level=SLEEP_LEVEL))
            self.sleeping = True
            self.standby["sleeps"] += 1
            self.standby["last_sleep_ms"] = round((time.perf_counter() - t0) * 1000, 3)
            return True

    def wake_up(self) -> bool:
        """Weights back on the GPU and the KV cache made again; False when it was awake."""
        with self._state:
            return self._wake_locked()

    def _wake_locked(self) -> bool:
        if not self.sleeping:
            return False
        t0 = time.perf_counter()
        self._call(self.engine.wake_up())
        self.sleeping = False
        self.standby["wakes"] += 1
        self.standby["last_wake_ms"] = round((time.perf_counter() - t0) * 1000, 3)
        return True

    # -- a request --

    def sampling_params(self, request: dict[str, Any]) -> Any:
        """The task's request → vLLM's SamplingParams (a value vLLM refuses: InvalidInputError)."""
        temperature = float(request["temperature"])
        sampled = temperature > 0
        try:
            return self.vllm.SamplingParams(
                max_tokens=int(request["max_tokens"]),
                temperature=temperature,
                top_p=float(request["top_p"]) if sampled else 1.0,
                top_k=int(request["top_k"]) if sampled else 0,  # 0: no top-k cut (vLLM's and ours)
                seed=int(request["seed"]) % SEED_RANGE if sampled else None,
                stop_token_ids=list(request["eos_token_ids"]),
                ignore_eos=True,  # only the manifest's eos ids stop (above), as on every engine
                detokenize=False,  # the task detokenizes
                output_kind=self._delta,  # each output holds the tokens made since the last
                structured_outputs=_structured(self._structured_params, request.get("response_format")),
            )
        except (self._client_error, ValueError) as e:  # SamplingParams checks its values when made
            raise InvalidInputError(f"vLLM refuses the request: {e}") from None

    def submit(self, request: JSON) -> Iterator[JSON]:
        if not isinstance(request, dict):
            raise TypeError("the vllm engine takes the generate task's request (a dict)")
        params = self.sampling_params(request)
        with self._state:
            try:
                self._wake_locked()  # the host's standby woke it already where it could; this makes sure
            except Exception as e:
                raise ModelRunError(f"vLLM could not wake from sleep: {type(e).__name__}: {e}") from None
            self._active += 1
            self.last_used = time.monotonic()
        try:
            outputs: queue.SimpleQueue[Any] = queue.SimpleQueue()
            prompt = {"prompt_token_ids": list(request["prompt_ids"])}  # vLLM's TokensPrompt
            rid = f"warmstart-{next(self._ids)}"
            assert self._loop is not None, "initialize() first"
            task = asyncio.run_coroutine_threadsafe(self._pump(prompt, params, rid, outputs), self._loop)
            # The first output (or vLLM's refusal: a schema it cannot compile) before the stream starts, so a
            # bad request is the request's error, not a broken stream.
            first = self._checked(outputs.get())
        except BaseException:
            self._done()
            raise
        return _Stream(self, first, outputs, task, set(request["eos_token_ids"]))

    async def _pump(self, prompt: dict[str, Any], params: Any, rid: str, outputs: queue.SimpleQueue[Any]) -> None:
        try:
            async for out in self.engine.generate(prompt, params, rid):
                outputs.put(out)
        except asyncio.CancelledError:  # the caller closed the stream: vLLM's generate aborted the request
            raise
        except BaseException as e:
            outputs.put(_Failed(e))
        finally:
            outputs.put(_END)

    def _checked(self, item: Any) -> Any:
        """An output from the pump; an error raised there, typed: vLLM's refusal of the request is the request's
        (400), anything else the engine's (500; the instance keeps serving the next request)."""
        if not isinstance(item, _Failed):
            return item
        error = item.error
        if isinstance(error, self._client_error):
            raise InvalidInputError(f"vLLM refuses the request: {error}") from None
        raise ModelRunError(f"vLLM failed the request: {type(error).__name__}: {error}") from None

    def _done(self) -> None:
        with self._state:
            self._active -= 1
            self.last_used = time.monotonic()

    def close(self) -> None:
        """Shut vLLM's engine down and stop the loop (a process that ends does it by exiting)."""
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop = None


async def _construct(engine_class: Any, args: Any) -> Any:
    return engine_class.from_engine_args(args)


def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
    try:
        loop.run_forever()
    finally:
        loop.close()


class _Stream:
    """One request's tokens, as the task reads them: `{"token_id"}`s then `{"finish_reason"}`. `close()` (the task
    calls it when it stops reading, at the end or not) cancels the request's task on the engine's loop, where
    vLLM aborts the request and frees its KV blocks; a finished request's cancel is a no-op."""

    def __init__(self, engine: VllmEngine, first: Any, outputs: queue.SimpleQueue[Any], task: Any, eos: set[int]):
        self.engine, self.outputs, self.task, self.eos = engine, outputs, task, eos
        self.pending: list[JSON] = []
        self.next_output: Any = first
        self.closed = False

    def __iter__(self) -> _Stream:
        return self

    def __next__(self) -> JSON:
        while not self.pending:
            if self.closed:
                raise StopIteration
            try:
                self._take()
            except BaseException:
                self.close()
                raise
        return self.pending.pop(0)

    def _take(self) -> None:
        out = self.next_output if self.next_output is not None else self.engine._checked(self.outputs.get())
        self.next_output = None
        if out is _END:
            raise ModelRunError("vLLM ended the request without finishing it")
        completion = out.outputs[0]
        ids = [int(t) for t in completion.token_ids]
        finish = completion.finish_reason
        if finish == "stop" and ids and (ids[-1] in self.eos or ids[-1] == completion.stop_reason):
            ids.pop()  # the eos token that stopped it: not text (the task's contract)
        self.pending.extend({"token_id": t} for t in ids)
        if finish is not None or out.finished:
            if finish not in FINISHED:
                raise ModelRunError(f"vLLM finished the request with {finish!r}")
            self.pending.append({"finish_reason": FINISHED[finish]})
            self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.task.cancel()
            self.engine._done()


def _structured(params: Any, response_format: dict[str, Any] | None) -> Any:
    """`response_format` (checked by the task) → vLLM's structured outputs; compact JSON, as the genai engine's."""
    if not response_format:
        return None
    if response_format["type"] == "json_schema":
        return params(json=response_format["schema"], disable_any_whitespace=True)
    return params(json_object=True, disable_any_whitespace=True)


def create() -> VllmEngine:
    return VllmEngine()
