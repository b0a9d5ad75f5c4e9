"""Many streams sharing the decode steps (continuous batching) for the genai backend: `BatchEngine` runs the
pack's `model.onnx` (the model builder's graph: GroupQueryAttention with past/present KV, its `seqlens_k` and
`total_sequence_length` derived from `attention_mask`) with ONNX Runtime directly, one step for every row.

Why our own loop: onnxruntime-genai 0.18's Engine batches dynamically only over a paged-KV graph (its
PagedAttention builds for CUDA and WebGPU); on our CPU GQA graph it refuses (`Paged cache input must have rank
four ...`), and its Generator is one request's static batch. WARMSTART_GENAI_BATCH > 1 selects this engine
(handler.backends.genai delegates to it); 1 keeps the one-generator-per-request engine.

- Rows: a request joins between steps and leaves when done; no request waits for another's whole answer. Each
  step runs the joining rows' prompts together (right-padded to the longest, at most PREFILL_TOKENS padded
  tokens, PREFILL_TOKENS_DECODING while rows decode; a longer prompt runs alone in chunks) and, at the same time
  in a second thread, one decode token for every decoding row.
- The KV cache: per layer one [rows, kv_heads, capacity, head_dim] array for keys and one for values, bound as
  both the past input and the present output (GQA writes the new tokens in place: no copy per step). Rows run
  as one contiguous slot range, so a row that leaves is replaced by the last one (its tokens copied).
  The arrays are one anonymous mapping with MAP_NORESERVE: a page costs memory only once a token is written,
  and a leaving row's pages are given back (MADV_DONTNEED). The pool's budget is counted in BLOCK-token
  blocks: a request is admitted when the blocks for its prompt + max_tokens are free (else it waits its turn),
  so the memory written never passes the budget.
- Padding: a row's padded positions are written past its length as if real (GQA takes every row's
  `sequence_length` new tokens); causal attention keeps them out of its real tokens, and its next tokens
  overwrite them. Greedy answers are the same alone or batched (tests/functional/test_genai_batch.py).
- Sampling per row (temperature, top_p, top_k, its own seeded generator) and JSON constraints per row
  (llguidance, as the single-stream engine); a full queue is ServiceBusyError (503 + Retry-After).

About one thing (one scheduler: its rows, its KV pool and its step share one lock and one loop's state),
hence one module.
"""

from __future__ import annotations

import mmap
import queue
import threading
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from handler.backends.contract import BackendSettings
from handler.backends.genai_load import Q4, choose_q4
from handler.backends.lastlogits import ROWS, last_logits_model
from handler.core.cpu import cpu_budget
from handler.core.errors import InvalidInputError, ModelLoadError, ServiceBusyError
from handler.core.manifest import Manifest
from handler.core.pages import release_after_load
from handler.core.types import JSON
from handler.observability.report import PhaseTimer

BLOCK = 64  # tokens per KV block: the pool's unit of admission
# Padded prompt tokens of one step's prompt run with no row decoding, and with rows decoding. A prompt token
# costs about the same CPU in a run of 32 tokens or of 128 (8-10 ms on the 0.6B int4 pack under a 2-vCPU quota:
# bench/generate/step_runs.py), so a larger group saves only each run's fixed part; what it buys is a burst's
# rows decoding together sooner. While rows decode, the prompt run goes beside their decode run (_overlapped) and
# the step lasts as long as the longer of the two: 64 tokens (two 30-token prompts) gave the aggregate tokens/s
# of 128 with a lower p99 time between tokens (docs/benchmarks.md, "A step's prompt run beside its decode run").
PREFILL_TOKENS = 512
PREFILL_TOKENS_DECODING = 64
# A graph whose head the rewrite did not take writes every position's logits (4 x vocab bytes a padded token:
# 311 MB for 512 tokens of Qwen3's vocabulary): its steps take a quarter of those.
FULL_LOGITS_SHARE = 4
EXTERNAL_DATA_DIR = "session.model_external_initializers_file_folder_path"  # a model from bytes: its .data
MAP_NORESERVE = 0x4000  # Linux (x86-64, arm64); Python's mmap module does not name it
IDLE_S = 10.0  # the scheduler thread ends after this long with nothing to run
BINDINGS = 256  # IO bindings kept by slot range (the decode rows' is reused step after step)
CANDIDATES = 1024  # tokens a top_p cut looks among first
DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


class _Row:
    """One request in the batch: its prompt still to feed, its KV length, its sampling and its outbox."""

    def __init__(self, request: dict[str, Any], matcher: Any, blocks: int) -> None:
        self.pending: list[int] = list(request["prompt_ids"])
        self.length = 0  # tokens in its KV cache
        self.max_tokens = int(request["max_tokens"])
        self.made = 0
        self.eos = set(request["eos_token_ids"])
        self.temperature = float(request["temperature"])
        self.top_p = float(request["top_p"])
        self.top_k = int(request["top_k"])
        self.rng = np.random.default_rng(int(request["seed"]))
        self.matcher = matcher
        self.blocks = blocks
        self.next_token = -1  # the token the next decode step feeds
        self.out: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.gone = False  # its reader closed: leave at the next step
        self.done = False


class _Tokens:
    """The reader's side of a row: `{"token_id"}` items, then `{"finish_reason"}`; `close()` leaves the batch
    (a class, not a generator: one closed before its first `next` must still leave)."""

    def __init__(self, engine: BatchEngine, row: _Row) -> None:
        self.engine, self.row = engine, row

    def __iter__(self) -> _Tokens:
        return self

    def __next__(self) -> JSON:
        if self.row.done and self.row.out.empty():
            raise StopIteration
        item = self.row.out.get()
        if isinstance(item, BaseException):
            self.row.done = True
            raise item
        if "finish_reason" in item:
            self.row.done = True
        return item

    def close(self) -> None:
        if not self.row.gone:
            self.row.gone = True
            self.engine._wake()


class BatchEngine:
    """See the module docstring. Built by handler.backends.genai's engine (`outer`), whose JSON constraint
    (`_matcher`) and KV budget (`_kv_budget`) it uses."""

    def __init__(self, outer: Any, rows: int, kv_tokens: int, queue_limit: int) -> None:
        self.outer = outer
        self.max_rows = rows
        self.queue_limit = queue_limit
        self.kv_setting = kv_tokens
        self.max_total_tokens: int | None = None
        self._lock = threading.Condition()
        self._waiting: deque[_Row] = deque()
        self._rows: list[_Row] = []  # by slot: [0, decoding) decode, the rest one prefill group
        self._decoding = 0
        self._free_blocks = 0
        self._closed = False
        self._running = False  # the scheduler thread
        self.steps = 0
        self.largest = 0
        # by (first slot, rows, prompt run): see _binding; its lock as a step's two runs look it up at once
        self._bindings: dict[tuple[int, int, bool], tuple[Any, Any]] = {}
        self._bindings_lock = threading.Lock()
        self._logits: dict[bool, Any] = {}  # a buffer for the prompt runs and one for the decode runs

    # -- init --

    def initialize(self, manifest: Manifest, settings: BackendSettings[Any], timer: PhaseTimer) -> None:
        entry = manifest.backends["genai"]
        own = settings.own
        # The Q4MatMul decoder where its library loads (genai_load.choose_q4; no prepack at load), as the
        # single-stream engine opens it; a session that cannot open it falls back to the portable graph.
        q4, self.outer.q4 = choose_q4(entry, getattr(own, "q4", "auto"), getattr(own, "q4_library", ""))
        if q4 is not None:
            try:
                self._initialize(manifest, settings, timer, manifest.path(q4.model), q4)
                return
            except ModelLoadError as e:
                self.outer.q4 = {"used": False, "reason": f"load failed: {e}"}
        self._initialize(manifest, settings, timer, manifest.path(entry.get("model", "model.onnx")), None)

    def _initialize(
        self, manifest: Manifest, settings: BackendSettings[Any], timer: PhaseTimer, model: Path, q4: Q4 | None
    ) -> None:
        # One run at a time owns every CPU (the rows share it), not a worker's share of them.
        self.threads = max(settings.threads, cpu_budget().cpus)
        with timer.phase("load"):
            options = ort.SessionOptions()
            options.intra_op_num_threads = self.threads
            options.inter_op_num_threads = 1
            options.add_session_config_entry("session.intra_op.allow_spinning", "1" if settings.spin else "0")
            if q4 is not None:
                try:
                    options.register_custom_ops_library(q4.library)
                except Exception as e:  # the library's own error (not loadable here)
                    raise ModelLoadError(f"{q4.library}: ONNX Runtime cannot load the Q4MatMul library: {e}") from None
                if q4.graph_optimization_level == "ORT_DISABLE_ALL":
                    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            # ORT's memory pattern stays on here (off for the single-stream decoder: genai.overlay): a batch's shapes
            # repeat step after step, and without it 32 streams took 12% more CPU a token and a 20 MB higher peak
            # (bench/generate/streams.py against the pattern on, docs/benchmarks.md).
            # The head over each row's last token only (handler.backends.lastlogits); the graph as packed if the
            # rewrite does not apply (then every position's logits are computed, and the last ones read).
            source: str | bytes = str(model)
            try:
                source = last_logits_model(model.read_bytes())
                options.add_session_config_entry(
                    "session.model_external_initializers_file_folder_path", str(model.parent)
                )
            except ValueError:
                pass
            try:
                self.session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
            except Exception as e:  # the library's own error: the model's fault
                raise ModelLoadError(f"{manifest.root}: ONNX Runtime cannot load the model: {e}") from None
        self.last_only = not isinstance(source, str)
        del source  # the graph's bytes (the head rewrite's copy): not held while the RSS is counted
        self.outer.released = release_after_load(manifest.root)  # as the single-stream engine, before the KV budget
        logits_shape = next(o for o in self.session.get_outputs() if o.name == "logits").shape
        if not self.last_only and len(logits_shape) == 3 and logits_shape[1] == 1:
            # A pruned head the rewrite did not take: its one position is the padded batch's last, a wrong
            # answer for every shorter row; refused rather than served.
            raise ModelLoadError(f"{manifest.root}: the graph's logits are one position a batch, not one a row")
        inputs = {i.name: i for i in self.session.get_inputs()}
        self.layers = sum(1 for n in inputs if n.startswith("past_key_values.") and n.endswith(".key"))
        if not self.layers or "attention_mask" not in inputs:
            raise ModelLoadError(f"{manifest.root}: model.onnx is not the builder's KV-cache graph")
        past, kv = inputs["past_key_values.0.key"], self.outer.kv
        if not kv:
            raise ModelLoadError(f"{manifest.root}: the manifest's generation.kv (the KV shape) is needed to batch")
        self.kv_heads, self.head_dim = int(kv["kv_heads"]), int(kv["head_dim"])
        self.dtype = DTYPES[past.type]
        self.vocab = int(next(o for o in self.session.get_outputs() if o.name == "logits").shape[-1])
        context = int(manifest.options.get("context_length") or 0)
        per_token = 2 * self.layers * self.kv_heads * self.head_dim * np.dtype(self.dtype).itemsize
        budget = self.kv_setting or self.outer._kv_budget(0)  # None: the memory is not known
        one = min(context, budget) if budget else context
        if one < 1:
            raise ModelLoadError(f"{manifest.root}: the KV pool holds no token (WARMSTART_GENAI_KV_TOKENS)")
        self.capacity = -(-one // BLOCK) * BLOCK  # one row's tokens
        total_blocks = (budget // BLOCK) if budget else self.max_rows * self.capacity // BLOCK
        self.max_total_tokens = min(one, total_blocks * BLOCK)
        self._free_blocks = self.pool_blocks = total_blocks
        self.kv_bytes_per_token = per_token
        self._map_pool()

    def _map_pool(self) -> None:
        shape = (self.max_rows, self.kv_heads, self.capacity, self.head_dim)
        self.slot_bytes = int(np.prod(shape[1:])) * np.dtype(self.dtype).itemsize
        self.array_bytes = self.slot_bytes * self.max_rows
        size = self.array_bytes * 2 * self.layers
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_NORESERVE
        self._map = mmap.mmap(-1, size, flags=flags)
        self.keys: list[Any] = []
        self.values: list[Any] = []
        for layer in range(self.layers):
            for kind, out in ((0, self.keys), (1, self.values)):
                offset = (2 * layer + kind) * self.array_bytes
                out.append(np.frombuffer(self._map, self.dtype, int(np.prod(shape)), offset).reshape(shape))

    def describe(self) -> dict[str, Any]:
        return {
            "rows": self.max_rows,
            "queue": self.queue_limit,
            "threads": self.threads,
            "kv_pool_tokens": self.pool_blocks * BLOCK,
            "kv_block_tokens": BLOCK,
            "row_capacity_tokens": self.capacity,
            "onnxruntime": ort.__version__,
        }

    @property
    def concurrent_streams(self) -> int:
        """Streams that may be in the engine at once (running or waiting for a row): the host keeps a worker
        for each."""
        return self.max_rows + self.queue_limit

    # -- a request --

    def submit(self, request: dict[str, Any], matcher: Any) -> Iterator[JSON]:
        total = len(request["prompt_ids"]) + int(request["max_tokens"])
        if self.max_total_tokens is not None and total > self.max_total_tokens:
            raise InvalidInputError(
                f"the prompt's {len(request['prompt_ids'])} tokens + max_tokens {request['max_tokens']} = {total} "
                f"exceeds the {self.max_total_tokens} tokens one request may hold in this instance's memory"
            )
        row = _Row(request, matcher, -(-total // BLOCK))
        with self._lock:
            if len(self._waiting) >= self.queue_limit and not self._room_locked(row):
                raise ServiceBusyError(
                    f"{len(self._rows)} streams generating and {len(self._waiting)} waiting (WARMSTART_GENAI_BATCH"
                    f"={self.max_rows}, WARMSTART_GENAI_QUEUE={self.queue_limit}); retry shortly"
                )
            self._waiting.append(row)
            self._lock.notify()
            if not self._running:  # started on demand; it ends when idle, so a replaced model is freed
                self._running = True
                threading.Thread(target=self._loop, name="warmstart-genai-batch", daemon=True).start()
        return _Tokens(self, row)

    def _room_locked(self, row: _Row) -> bool:
        """Could `row` join at the next step (a free row, its blocks free, nobody ahead of it)?"""
        pending = len(self._rows) + len(self._waiting)
        return pending < self.max_rows and row.blocks <= self._free_blocks - sum(r.blocks for r in self._waiting)

    def _wake(self) -> None:
        with self._lock:
            self._lock.notify()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify()

    # -- the scheduler --

    def _loop(self) -> None:
        while True:
            with self._lock:
                if not self._rows and not self._waiting:
                    self._lock.wait(IDLE_S)
                if self._closed or (not self._rows and not self._waiting):
                    self._running = False
                    return
                self._drop_gone_locked()
                self._admit_locked()
            group = self._rows[self._decoding :]
            decoding = self._rows[: self._decoding]
            if group and decoding:
                self._overlapped(group, decoding)
            elif group:
                self._step(group, self._decoding, prefill=True)
            elif decoding:
                self._step(decoding, 0, prefill=False)
            with self._lock:
                self._drop_gone_locked()
                if group and not any(r.pending for r in group):
                    self._decoding = len(self._rows)  # the group's prompts are in: from now on it decodes

    def _admit_locked(self) -> None:
        """Waiting requests join as one prefill group when none is running: first come first, while a row and
        their blocks are free and the group's padded prompt fits PREFILL_TOKENS (the first always joins)."""
        if len(self._rows) > self._decoding:
            return
        while self._waiting:
            row = self._waiting[0]
            if row.gone:
                self._waiting.popleft()
                row.out.put({"finish_reason": "stop"})
                continue
            group = self._rows[self._decoding :]
            longest = max([len(r.pending) for r in group] + [len(row.pending)])
            if len(self._rows) >= self.max_rows or row.blocks > self._free_blocks:
                return
            if group and longest * (len(group) + 1) > self._prefill_budget():
                return
            self._waiting.popleft()
            self._free_blocks -= row.blocks
            self._rows.append(row)
            self.largest = max(self.largest, len(self._rows))

    def _prefill_budget(self) -> int:
        budget = PREFILL_TOKENS_DECODING if self._decoding else PREFILL_TOKENS
        return budget if self.last_only else budget // FULL_LOGITS_SHARE

    def _drop_gone_locked(self) -> None:
        for row in [r for r in self._rows if r.gone or r.done]:
            self._remove_locked(row)
        if self._waiting and any(r.gone for r in self._waiting):
            self._waiting = deque(r for r in self._waiting if not r.gone)

    def _remove_locked(self, row: _Row) -> None:
        """Take `row` out; the last row of its part (decode or prefill) takes its slot, so both stay contiguous."""
        slot, last = self._rows.index(row), len(self._rows) - 1
        if slot < self._decoding:
            tail = self._decoding - 1
            if slot != tail:
                self._move(tail, slot)
            if last != tail:  # a prefill group follows: its last row fills the decode part's end
                self._move(last, tail)
            self._decoding -= 1
        elif slot != last:
            self._move(last, slot)
        self._rows.pop()
        self._release(last)
        self._free_blocks += row.blocks

    def _move(self, src: int, dst: int) -> None:
        n = self._rows[src].length  # its tokens; past them nothing is read before it is written again
        for array in (*self.keys, *self.values):
            array[dst, :, :n] = array[src, :, :n]
        self._rows[dst] = self._rows[src]

    def _release(self, slot: int) -> None:
        """The slot's pages back to the system (read again as zeros; nothing reads past a row's length)."""
        page = mmap.PAGESIZE
        for index in range(2 * self.layers):
            start = index * self.array_bytes + slot * self.slot_bytes
            lo, hi = -(-start // page) * page, (start + self.slot_bytes) // page * page
            if hi > lo:
                self._map.madvise(mmap.MADV_DONTNEED, lo, hi - lo)

    def _overlapped(self, group: list[_Row], decoding: list[_Row]) -> None:
        """The prompt run and the decode run of one step at the same time (the prompt's in a thread of its own;
        ONNX Runtime runs a session's runs concurrently, and the two write disjoint slots, bindings and logits
        buffers): one 2-thread run keeps ~1.7 of 2 CPUs busy, two side by side more, and the decoding rows'
        next token no longer waits for the whole prompt run."""
        failed: list[BaseException] = []

        def prompt() -> None:
            try:
                self._step(group, len(decoding), prefill=True)
            except BaseException as e:  # handed to the scheduler's thread: a fault of the loop, not of a row
                failed.append(e)

        helper = threading.Thread(target=prompt, name="warmstart-genai-prompt", daemon=True)
        helper.start()
        try:
            self._step(decoding, 0, prefill=False)
        finally:
            helper.join()
        if failed:
            raise failed[0]

    def _step(self, rows: list[_Row], first: int, prefill: bool) -> None:
        """One model run over slots [first, first + len(rows)): each prefill row's next prompt chunk, or each
        decode row's last token; then the next token of every row whose prompt is in."""
        if prefill:
            width = min(max(len(r.pending) for r in rows), self._prefill_budget())
            feeds = [r.pending[:width] for r in rows]
        else:
            width = 1
            feeds = [[r.next_token] for r in rows]
        count = len(rows)
        ids = np.zeros((count, width), np.int64)
        for i, feed in enumerate(feeds):
            ids[i, : len(feed)] = feed
        total = max(r.length for r in rows) + width
        mask = np.zeros((count, total), np.int64)
        for i, row in enumerate(rows):
            mask[i, : row.length + width] = 1  # padded positions count: GQA writes them, later tokens overwrite
        binding, logits = self._binding(first, count, width, prefill)
        binding.bind_cpu_input("input_ids", ids)
        binding.bind_cpu_input("attention_mask", mask)
        if self.last_only:  # one row of logits each: its last real token's
            last = np.array([[len(feed) - 1] for feed in feeds], np.int64)  # held until the run: bound by address
            binding.bind_cpu_input(ROWS, last)
        try:
            self.session.run_with_iobinding(binding)
        except Exception as e:  # the run's rows end with the error; the engine and the other rows go on
            for row in rows:
                row.out.put(RuntimeError(f"the model run failed: {e}"))
                row.done = True
            return
        with self._lock:  # the step's two runs may end at once
            self.steps += 1
        # Each row's logits, and the greedy rows' tokens in one pass over them (one argmax a step, not one a row).
        picked = logits if self.last_only else logits[np.arange(count), [len(feed) - 1 for feed in feeds]]
        greedy = picked.argmax(axis=1) if any(r.temperature == 0 and r.matcher is None for r in rows) else None
        for i, (row, feed) in enumerate(zip(rows, feeds, strict=True)):
            row.length += len(feed)
            if prefill:
                del row.pending[: len(feed)]
                if row.pending:
                    continue
            if not row.gone:
                try:
                    self._emit(row, picked[i], None if greedy is None else int(greedy[i]))
                except Exception as e:  # this row's own failure (its constraint): it ends, the others go on
                    row.out.put(e)
                    row.done = True

    def _binding(self, first: int, count: int, width: int, prefill: bool = False) -> tuple[Any, Any]:
        """The IO binding of a run over slots [first, first + count) with its KV arrays and logits output bound
        (kept per slot range and kind of run: a step rebinds only its ids, mask and rows), and the logits it
        writes (the prompt runs' buffer or the decode runs': a step's two may run at once)."""
        key = (first, count, prefill)
        with self._bindings_lock:
            kept = self._bindings.get(key) if self.last_only else None
        if kept is not None:
            return kept
        binding = self.session.io_binding()
        shape = [count, self.kv_heads, self.capacity, self.head_dim]
        for layer in range(self.layers):
            for name, arrays in (("key", self.keys), ("value", self.values)):
                ptr = arrays[layer][first : first + count].ctypes.data
                binding.bind_input(f"past_key_values.{layer}.{name}", "cpu", 0, self.dtype, shape, ptr)
                binding.bind_output(f"present.{layer}.{name}", "cpu", 0, self.dtype, shape, ptr)
        if not self.last_only:  # every position's logits: a buffer of the step's width (no binding kept)
            logits = np.empty((count, width, self.vocab), np.float32)
            binding.bind_output("logits", "cpu", 0, np.float32, list(logits.shape), logits.ctypes.data)
            return binding, logits
        if prefill not in self._logits:  # one buffer for every run of its kind: no fresh pages a step
            self._logits[prefill] = np.empty((self.max_rows, self.vocab), np.float32)
        logits = self._logits[prefill][:count]
        binding.bind_output("logits", "cpu", 0, np.float32, [count, self.vocab], logits.ctypes.data)
        with self._bindings_lock:
            if len(self._bindings) >= BINDINGS:
                self._bindings.clear()
            self._bindings[key] = (binding, logits)
        return binding, logits

    def _emit(self, row: _Row, logits: Any, greedy: int | None = None) -> None:
        """`greedy`: the row's argmax, already taken (a greedy row without a JSON constraint)."""
        if row.matcher is not None:
            self._mask(row.matcher, logits)
        token = greedy if greedy is not None and row.temperature == 0 and row.matcher is None else None
        token = self._sample(row, logits) if token is None else token
        row.made += 1
        if row.matcher is not None:
            row.matcher.consume_token(token)
        if token in row.eos:
            row.out.put({"finish_reason": "stop"})
            row.done = True
            return
        row.out.put({"token_id": token})
        row.next_token = token
        if row.matcher is not None and (row.matcher.is_stopped() or row.matcher.is_error()):
            row.out.put({"finish_reason": "stop"})
            row.done = True
        elif row.made >= row.max_tokens:
            row.out.put({"finish_reason": "length"})
            row.done = True

    @staticmethod
    def _mask(matcher: Any, logits: Any) -> None:
        import llguidance.numpy as llnp  # deferred: only a request asking for JSON needs it

        flat = logits.reshape(1, -1)
        mask = llnp.allocate_token_bitmask(1, flat.shape[1])
        llnp.fill_next_token_bitmask(matcher, mask)
        llnp.apply_token_bitmask_inplace(flat, mask)

    @staticmethod
    def _sample(row: _Row, logits: Any) -> int:
        if row.temperature == 0:
            return int(np.argmax(logits))
        scaled = logits.astype(np.float64) / row.temperature
        probs = np.exp(scaled - scaled.max())
        probs /= probs.sum()
        # The candidates: the top_k, else the smallest top set holding top_p (found among the CANDIDATES most
        # likely first: a full sort of a 150k vocabulary costs ~10 ms a row, a partition ~1 ms).
        k = row.top_k or len(probs)
        if k > CANDIDATES:
            part = np.argpartition(-probs, CANDIDATES)[:CANDIDATES]
            if probs[part].sum() >= row.top_p:
                k = CANDIDATES
        order = np.argsort(-probs, kind="stable") if k >= len(probs) else np.argpartition(-probs, k - 1)[:k]
        order = order[np.argsort(-probs[order], kind="stable")]
        top = probs[order] / probs[order].sum()
        if row.top_p < 1:
            keep = int(np.searchsorted(np.cumsum(top), row.top_p)) + 1
            top, order = top[:keep] / top[:keep].sum(), order[:keep]
        return int(order[row.rng.choice(len(top), p=top)])


def wait_idle(engine: BatchEngine, timeout_s: float = 5.0) -> bool:
    """Tests: True once no row runs and none waits."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        with engine._lock:
            if not engine._rows and not engine._waiting:
                return True
        time.sleep(0.005)
    return False
