"""handler.backends.genai.keep_freed_memory: after it, a request's buffers freed and allocated again (a KV cache:
one buffer a layer's keys or values, written, freed at the request's end) cost no new page faults; before it,
glibc returns them to the OS and every request faults its whole cache in again. Each side in a child process of
its own (mallopt is process-wide)."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT

CHILD = """
import ctypes, sys
from pathlib import Path

if sys.argv[1] == "keep":
    from handler.backends import genai

    assert genai.keep_freed_memory() is True and genai.keep_freed_memory() is True  # once, then the same answer
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]


def faults():
    return int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[7])


def request():
    before = faults()
    buffers = [libc.malloc(1 << 20) for _ in range(40)]
    for b in buffers:
        ctypes.memset(b, 0, 1 << 20)
    for b in buffers:
        libc.free(b)
    return faults() - before


request(), request()
print(request())
"""
PAGES = 40 * (1 << 20) // 4096  # the pages one request writes


def third_request_faults(mode: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, mode], cwd=ROOT, capture_output=True, text=True, check=True, timeout=60
    )
    return int(out.stdout.split()[-1])


def test_freed_buffers_are_reused_without_page_faults() -> None:
    assert third_request_faults("default") > PAGES // 2  # glibc's defaults: the pattern faults every time
    assert third_request_faults("keep") < PAGES // 20


TRIM_CHILD = """
import ctypes, threading
from pathlib import Path

from handler.backends import genai

genai.keep_freed_memory()  # what the engine sets after its load: freed memory is kept, never trimmed by itself
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]


def rss_mb():
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096 / 2**20


def load():  # in a thread: its own malloc arena, as the engine's load thread
    buffers = [libc.malloc(256 << 10) for _ in range(320)]
    for b in buffers:
        ctypes.memset(b, 1, 256 << 10)
    # The first and the last kept: the freed run lies between two live blocks, in the arena's bins (what a
    # parse leaves behind it: its result still held), not merged into the heap's top, which malloc_trim leaves
    # alone in a thread's arena.
    for b in buffers[1:-1]:
        libc.free(b)


thread = threading.Thread(target=load)
thread.start()
thread.join()
before = rss_mb()
assert genai.trim_freed_memory() is True
print(before - rss_mb())
"""


def test_trimming_returns_a_threads_freed_arena_pages() -> None:
    out = subprocess.run(
        [sys.executable, "-c", TRIM_CHILD], cwd=ROOT, capture_output=True, text=True, check=True, timeout=60
    )
    assert float(out.stdout.split()[-1]) > 40  # of the 80 MB written and freed (79.7 MB measured; none untrimmed)


def test_the_decoder_session_plans_no_memory_pattern() -> None:
    # ORT's memory pattern caches one block plan per input shape and, on a shape seen before, takes the whole plan's
    # block from its arena at once: a warm request's prompt steps asked the arena for blocks the first request's
    # freed chunks could not hold (+7-10 MB RSS on the 0.6B int4 pack's second request). Off for either decoder.
    import json

    from handler.backends.genai import overlay

    for decoder in (None, "model.opt.onnx"):
        session = json.loads(overlay(2, decoder))["model"]["decoder"]["session_options"]
        assert session["enable_mem_pattern"] is False, session
        assert session["intra_op_num_threads"] == 2
