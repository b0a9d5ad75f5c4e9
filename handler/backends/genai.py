"""The onnxruntime-genai engine (backend "genai", needs "request"): a packed decoder (`model.onnx` and the builder's
`genai_config.json`) generating token ids for one request at a time, each with its own generator and KV cache.

`submit(request)` takes what the `generate` task built (prompt ids, max tokens, sampling, the seed, eos ids, an
optional JSON constraint) and returns an iterator of `{"token_id"}` ending with `{"finish_reason"}`; closing it
drops the generator (its KV cache with it). A `response_format` constraint is enforced with llguidance: before
each step the logits of tokens the grammar forbids are masked, and each chosen token is consumed by the matcher.

The KV budget: the builder's graph allocates each request's cache for its whole length (prompt + max tokens), so
the memory the instance has left after the model, over the model's KV bytes per token, is the most tokens one
request may hold (`max_total_tokens`, the `generate` task refuses more; the init report shows it).
"""

from __future__ import annotations

import ctypes
import json
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import onnxruntime_genai as og  # type: ignore[import-untyped]  # no stubs; imported only when chosen

from handler.backends import genai_capi
from handler.backends.contract import BackendSettings
from handler.backends.genai_load import Q4, open_first, overlay
from handler.core.cpu import cpu_budget
from handler.core.errors import InvalidInputError, ModelLoadError
from handler.core.manifest import Manifest, regular_path
from handler.core.memory import MARGIN, memory_limit, resident_bytes
from handler.core.pages import Released, release_after_load
from handler.core.types import JSON
from handler.observability.report import PhaseTimer

NAME = "genai"
CONFIG_FILE = "genai_config.json"  # the name onnxruntime-genai reads in the model directory
KV_ITEMSIZE = {"float32": 4, "float16": 2}
SEED_RANGE = (1 << 31) - 1  # onnxruntime-genai's random_seed is a 32-bit integer
# JSON constraints: compact (no free whitespace), so a sampled answer cannot spend its tokens on blanks.
JSON_OPTIONS = {"whitespace_flexible": False}


class GenaiEngine:
    name = NAME

    def __init__(self) -> None:
        self.model: genai_capi.Model | None = None
        self.threads = 1
        self.device = "cpu"
        self.device_reason = "onnxruntime-genai on the CPU"
        self.vocab_size = 0
        self.max_total_tokens: int | None = None
        self.kv: dict[str, Any] = {}
        # Whether the pre-optimized decoder was opened, or why not: describe() and the init report's "coldstart".
        self.optimized: dict[str, Any] = {"used": False, "reason": "not packed (warmstart optimize)"}
        # Whether the Q4MatMul decoder (no prepack at load: handler.backends.q4lib) was opened, or why not.
        self.q4: dict[str, Any] = {"used": False, "reason": "not packed (infra/pack/lm_q4.py)"}
        self._tokenizer_json: Path | None = None
        self._eos: list[int] = []
        self._ll_tokenizer: Any = None
        self._ll_lock = threading.Lock()
        self.batch: Any = None  # handler.backends.genai_batch.BatchEngine when requests share the steps
        self.prefill_chunk = 0  # prompt tokens per decoder step (genai_spec.PREFILL_CHUNK; 0: all at once)
        # The tokenizer parsed in a thread beside the model's load (handler.tasks.generate takes it), or why not.
        self._parsing: threading.Thread | None = None
        self._parsed: tuple[Path, Any] | None = None
        self.beside_load: dict[str, Any] = {}  # the init report's account of it (coldstart.genai_tokenizer)
        self.released: Released | None = None  # the file pages given back after the load

    def initialize(self, manifest: Manifest, settings: BackendSettings[Any], timer: PhaseTimer) -> None:
        entry = manifest.backends[NAME]
        if entry.get("config", CONFIG_FILE) != CONFIG_FILE:
            raise ModelLoadError(f"{manifest.root}: backends.genai.config must be {CONFIG_FILE!r}")
        config_path = manifest.path(CONFIG_FILE)  # listed in `files` (the loader checked its size)
        options = manifest.options
        self.context_length = int(options.get("context_length") or 0)
        self.window = _window(config_path)
        self.vocab_size = int(options.get("vocab_size") or 0)
        self._eos = list(options.get("eos_token_ids") or [])
        tokenizer = manifest.tokenizer.get("file")
        if tokenizer:  # for a JSON constraint's token table, built at the first constrained request: read then,
            # not held from init (Qwen3's tokenizer.json is 9.5 MB of text, ~19 MB as a str, read after the weights)
            self._tokenizer_json = manifest.root / tokenizer
        self.kv = dict(options.get("kv") or {})
        rows = getattr(settings.own, "batch", 1)
        self.prefill_chunk = int(getattr(settings.own, "prefill_chunk", 0))
        if rows > 1:  # many streams share each decode step (WARMSTART_GENAI_BATCH): our own loop, not a generator
            from handler.backends.genai_batch import BatchEngine  # deferred: only a batching host runs it

            self.batch = BatchEngine(self, rows, settings.own.kv_tokens, settings.own.queue)
            self.batch.initialize(manifest, settings, timer)
            self.threads, self.max_total_tokens = self.batch.threads, self.batch.max_total_tokens
            self.concurrent_streams = self.batch.concurrent_streams
            self.device_reason = "ONNX Runtime on the CPU, the rows of many requests in each step"
            return
        with timer.phase("load"):
            cuda = settings.cuda.usable and og.is_cuda_available()
            if cuda:
                self.device, self.device_reason = "cuda", "a CUDA device and onnxruntime-genai built for it"
            entered = threading.Event()
            if tokenizer and load_beside_init():
                # The task's tokenizer parse (~0.2 s of CPU for Qwen3's) in a thread beside the model's load: the
                # load's C calls leave the GIL free (genai_capi), the parse holds it from start to end. The
                # thread starts parsing once the load is inside its C call (`entered`): this thread still needs
                # the GIL up to there, and would wait out the whole parse. The load stays in this thread, so the
                # model's memory comes from the main malloc arena as before (loaded in a thread of its own: +20 MB
                # peak RSS on a 512-token request, warm TTFT ~5% longer, measured).
                self._parsing = threading.Thread(
                    target=self._parse,
                    args=(manifest.path(tokenizer), entered),
                    name="warmstart-tokenizer-parse",
                    daemon=True,
                )
                self._parsing.start()
            try:
                threads = settings.threads
                self.model, self.q4, self.optimized = open_first(
                    entry,
                    settings.own,
                    cuda,
                    lambda d, q4: _model(manifest, threads, cuda, d, entered, q4),
                    manifest.root,
                )
            finally:
                entered.set()  # a load that failed before its C call must not leave the parse waiting
        keep_freed_memory()  # after the load: what loading freed goes back to the OS, the KV budget counts the rest
        # The file pages the load read and the runs never read again (the originals of the weights the kernels
        # packed, the libraries' code that built the session): out of the RSS before the KV budget counts it.
        self.released = release_after_load(manifest.root)
        self.threads = settings.threads
        self.max_total_tokens = self._kv_budget(int(options.get("context_length") or 0))

    def _parse(self, path: Path, entered: threading.Event) -> None:
        entered.wait()
        t0 = time.perf_counter()
        try:
            from tokenizers import Tokenizer  # deferred: as the task's own parse

            with regular_path(path) as name:
                self._parsed = (path, Tokenizer.from_file(name))
            self.beside_load = {"parsed": True}
        except Exception as e:  # the task parses it itself, and raises its own error
            self.beside_load = {"parsed": False, "reason": f"{type(e).__name__}: {e}"}
        self.beside_load["parse_ms"] = round((time.perf_counter() - t0) * 1000, 3)

    def parsed_tokenizer(self, path: Path) -> Any:
        """The tokenizer of `path` parsed beside the model's load (the thread joined), once; None when it was not
        (one CPU, a failure: the caller parses it itself)."""
        parsing, self._parsing = self._parsing, None
        if parsing is None:
            return None
        t0 = time.perf_counter()
        parsing.join()
        self.beside_load["waited_ms"] = round((time.perf_counter() - t0) * 1000, 3)
        # The parse ran in a thread of its own malloc arena: its freed pages could serve nothing else, returned now.
        trim_freed_memory()
        parsed, self._parsed = self._parsed, None
        return parsed[1] if parsed is not None and parsed[0] == path else None

    def _kv_budget(self, context: int) -> int | None:
        """The most tokens one request may hold: the memory left after the model (less the margin) over the KV
        bytes a token takes, at most the context length. None when the manifest gives no KV shape, or when the
        instance's memory is not known (no Lambda setting, no cgroup limit: a laptop's fallback figure would
        refuse requests the machine can hold)."""
        if not self.kv:
            return None
        per_token = 2 * self.kv["layers"] * self.kv["kv_heads"] * self.kv["head_dim"]
        per_token *= KV_ITEMSIZE.get(self.kv.get("dtype", "float32"), 4)
        limit = memory_limit()
        self.kv_bytes_per_token, self.memory_from = per_token, limit.source
        if limit.source == "fallback":
            return None
        total = limit.mb * 2**20
        resident = resident_bytes()
        free = total - resident - total * MARGIN
        tokens = int(free // per_token) if free > 0 else 0
        if tokens < min(MIN_KV_TOKENS, context or MIN_KV_TOKENS):
            # An instance that could answer nothing fails its init with the figures, not every request after.
            raise ModelLoadError(
                f"the model leaves this instance too little memory: the process holds {resident / 2**20:,.0f} MB "
                f"of {limit.mb:,.0f} MB ({limit.source}) after loading it, and with {MARGIN:.0%} kept free the KV "
                f"cache has room for {tokens} tokens ({per_token:,} bytes each), fewer than {MIN_KV_TOKENS}: give "
                "the function more memory, or pack the model smaller (`warmstart pack --quantize int4`)"
            )
        return min(tokens, context) if context else tokens

    @property
    def coldstart(self) -> dict[str, Any]:
        """The init report's `coldstart` facts of this backend (handler.models.loader reads them)."""
        out: dict[str, Any] = {"genai_optimized": self.optimized, "genai_q4": self.q4}
        if self.beside_load:
            out["genai_tokenizer"] = self.beside_load
        return out

    def warm_device(self) -> dict[str, Any]:
        # The task's warm-up (two generated tokens) runs the model for real; nothing to do before it.
        return {"cuda": self.device == "cuda", "reason": self.device_reason}

    def set_threads(self, threads: int) -> int:
        # The sessions' intra-op pools are built with the model and cannot be resized; reloading the model
        # would unshare its pages from a snapshot's template. The model keeps what it was built with.
        return self.threads

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "backend": NAME,
            "providers": ["cuda" if self.device == "cuda" else "cpu"],
            "device": self.device,
            "device_reason": self.device_reason,
            "threads": self.threads,
            "onnxruntime_genai": og.__version__,
            "optimized": self.optimized,
            "q4": self.q4,
            "prefill_chunk": self.prefill_chunk,
        }
        if self.released is not None:
            out["released_after_load"] = {
                "mappings": self.released.mappings,
                "resident_mb": round(self.released.resident_bytes / 2**20, 1),
                "skipped": self.released.skipped,
            }
        if self.batch is not None:
            out["batch"] = self.batch.describe()
        if self.kv:  # the tokens one request may hold (None: the context length only, memory not known)
            out["kv_budget"] = {
                "max_total_tokens": self.max_total_tokens,
                "kv_bytes_per_token": getattr(self, "kv_bytes_per_token", None),
                "memory_from": getattr(self, "memory_from", None),
            }
        return out

    # -- a request --

    def submit(self, request: JSON) -> Iterator[JSON]:
        if not isinstance(request, dict):
            raise TypeError("the genai engine takes the generate task's request (a dict)")
        total = len(request["prompt_ids"]) + int(request["max_tokens"])
        if self.max_total_tokens is not None and total > self.max_total_tokens:
            raise InvalidInputError(
                f"the prompt's {len(request['prompt_ids'])} tokens + max_tokens {request['max_tokens']} = {total} "
                f"exceeds the {self.max_total_tokens} tokens one request may hold in this instance's memory"
            )
        matcher = self._matcher(request.get("response_format"))
        if self.batch is not None:
            return self.batch.submit(request, matcher)  # type: ignore[no-any-return]
        return self._run(request, matcher)

    def _search(self, request: dict[str, Any]) -> dict[str, float | bool]:
        """The generator's search options for `request` (onnxruntime-genai's names)."""
        length = len(request["prompt_ids"]) + int(request["max_tokens"])
        # A sliding-window model's cache holds at least the window: onnxruntime-genai refuses a shorter max_length
        # (GroupQueryAttention: "KV cache capacity must be at least local_window_size"). The loop itself stops
        # at max_tokens, so the longer length only sizes the cache.
        length = max(length, min(self.window, self.context_length or self.window))
        temperature = float(request["temperature"])
        if temperature == 0:
            return {"max_length": length, "do_sample": False}
        top_k = int(request["top_k"]) or self.vocab_size  # 0: no top-k cut
        return {
            "max_length": length,
            "do_sample": True,
            "temperature": temperature,
            "top_p": float(request["top_p"]),
            "top_k": top_k,
            "random_seed": int(request["seed"]) % SEED_RANGE,
        }

    def _run(self, request: dict[str, Any], matcher: Any) -> Iterator[JSON]:
        assert self.model is not None  # initialize() loaded it
        generator = genai_capi.Generator(self.model, self._search(request))
        eos = set(request["eos_token_ids"])
        try:
            prompt = list(request["prompt_ids"])
            # In steps of prefill_chunk tokens: the attention's score matrix (heads x step x length) is what a
            # long prompt's peak memory is made of; the cache and the tokens are the same either way.
            step = self.prefill_chunk or len(prompt) or 1
            for start in range(0, max(len(prompt), 1), step):
                generator.append_tokens(prompt[start : start + step])
            for made in range(1, int(request["max_tokens"]) + 1):
                if matcher is not None:
                    self._mask(generator, matcher)
                generator.generate_next_token()
                token = generator.next_token()
                if matcher is not None:
                    matcher.consume_token(token)
                if token in eos:
                    yield {"finish_reason": "stop"}
                    return
                yield {"token_id": token}
                if matcher is not None and (matcher.is_stopped() or matcher.is_error()):
                    yield {"finish_reason": "stop"}
                    return
                if generator.is_done() and made < int(request["max_tokens"]):
                    break  # the library's own stop (its config's eos, its max length)
            yield {"finish_reason": "length"}
        finally:
            generator.close()  # its KV cache freed now, not when the iterator is collected

    # -- the JSON constraint (llguidance) --

    def _matcher(self, response_format: Any) -> Any:
        if not response_format:
            return None
        # Deferred: llguidance is needed only by a request asking for JSON.
        import llguidance

        json_schema = response_format.get("type") == "json_schema"
        schema = response_format["schema"] if json_schema else {"type": "object"}
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)  # type: ignore[arg-type]
        except ValueError as e:
            raise InvalidInputError(f'"response_format": the schema cannot be used: {e}') from None
        matcher = llguidance.LLMatcher(self._lltokenizer(), grammar, log_level=0)
        if matcher.is_error():
            raise InvalidInputError(f'"response_format": the schema cannot be used: {matcher.get_error()}')
        return matcher

    def _lltokenizer(self) -> Any:
        """llguidance's token table, built once (it costs ~1 s for a large vocabulary) from the pack's
        tokenizer.json, sized to the model's logits."""
        import llguidance

        with self._ll_lock:
            if self._ll_tokenizer is None:
                if not self._tokenizer_json:
                    raise InvalidInputError('"response_format": this model has no tokenizer for a JSON constraint')
                self._ll_tokenizer = llguidance.LLTokenizer(
                    self._tokenizer_json.read_text(), n_vocab=self.vocab_size or None, eos_token=self._eos or None
                )
            return self._ll_tokenizer

    def _mask(self, generator: Any, matcher: Any) -> None:
        import llguidance.numpy as llnp

        logits = generator.get_logits()  # (1, 1, vocab): a copy we may write
        flat = logits.reshape(1, -1)
        mask = llnp.allocate_token_bitmask(1, flat.shape[1])
        llnp.fill_next_token_bitmask(matcher, mask)
        llnp.apply_token_bitmask_inplace(flat, mask)
        generator.set_logits(flat.reshape(logits.shape))


def _model(
    manifest: Manifest,
    threads: int,
    cuda: bool,
    decoder: str | None,
    entered: threading.Event | None = None,
    q4: Q4 | None = None,
) -> genai_capi.Model:
    """onnxruntime-genai's model over the pack (see overlay); the library's errors a ModelLoadError. `entered`:
    genai_capi.Model's."""
    try:
        config = overlay(threads, decoder, q4)
        return genai_capi.Model(str(manifest.root), config, ["cuda"] if cuda else [], entered)
    except genai_capi.GenaiError as e:  # the library's own error (a missing or bad file): the model's fault
        raise ModelLoadError(f"{manifest.root}: onnxruntime-genai cannot load the model: {e}") from None


def genai_config(root: Path, threads: int, cuda: bool, decoder: str | None, q4: Q4 | None = None) -> Any:
    """The pack's og.Config as the engine opens it (infra.pack.lm_layout's check, through the binding)."""
    config = og.Config(str(root))
    config.overlay(overlay(threads, decoder, q4))
    config.clear_providers()  # the CPU, unless a usable GPU and a CUDA build of the library
    if cuda:
        config.append_provider("cuda")
    return config


def create() -> GenaiEngine:
    return GenaiEngine()


# glibc's mallopt parameters (malloc.h) and the values keep_freed_memory sets.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 << 20  # glibc's most on 64-bit (HEAP_MAX_SIZE / 2): larger values are refused
TRIM_THRESHOLD = 2**31 - 1  # mallopt's int at its most: 2 GiB of free heap kept mapped for the next request
_kept: bool | None = None


def keep_freed_memory() -> bool:
    """Tell glibc's malloc to keep freed memory for reuse instead of returning it to the OS. Once per process
    (later calls return the first answer); False where the C library is not glibc (nothing set).

    Why: onnxruntime-genai allocates each request's KV cache afresh (one buffer per layer's keys and values,
    sized for prompt + max tokens: 56 of 2.3 MB for 576 tokens of Qwen3-0.6B). With glibc's defaults freed
    buffers are unmapped or trimmed off the heap (the dynamic trim threshold is twice the largest freed buffer),
    and the next request page-faults them in again: tests/unit/test_genai_memory.py's 40 x 1 MiB pattern faults
    10,208 pages a request, 0 with this. On the 0.6B int4 pack a warm request took 627 minor faults, 4-48 with
    this (bench/generate/levers.py; its CPU difference was inside a loaded host's noise). Buffers up to 32 MiB go
    on the heap, and the heap is not trimmed below 2 GiB free: the process keeps its peak (the KV budget counts
    it).
    """
    global _kept
    if _kept is None:
        try:
            libc = ctypes.CDLL("libc.so.6")
            mallopt = libc.mallopt
        except (OSError, AttributeError):  # musl, macOS: another allocator, nothing to tune
            _kept = False
            return _kept
        mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        _kept = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return _kept


def load_beside_init(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the tokenizer is parsed in a thread beside the model's load: only where the instance has more than
    one CPU's share (the smallest of its CPU affinity, cgroup quota and Lambda memory size's vCPUs). On one CPU the
    two threads take turns and the overlap costs CPU (~5% more, measured on the 0.6B int4 pack); with the 1.7 vCPU
    quota's CPUs its own, spawn to first token 0.87x of the parse after the load (bench/generate/cold.py
    --own-cpus)."""
    detail = cpu_budget(environ).detail
    share = min(float(v) for v in (detail["affinity"], detail["cgroup_quota"], detail["lambda_vcpus"]) if v)
    return share > 1.0


def trim_freed_memory() -> bool:
    """Return the freed pages of every malloc arena to the OS now (glibc's malloc_trim(0)); False where the C
    library is not glibc."""
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # musl, macOS: nothing to trim this way
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)
    return True


MIN_KV_TOKENS = 256  # the least KV room an instance must have to be worth starting: a short chat and its answer


def _window(config_path: Path) -> int:
    """The sliding window of the pack's genai_config.json (0: none)."""
    try:
        decoder = json.loads(config_path.read_text())["model"]["decoder"]
        return int((decoder.get("sliding_window") or {}).get("window_size") or 0)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ModelLoadError(f"{config_path}: not a readable onnxruntime-genai config ({e})") from None
