"""The genai engine's init gives back the pages of the weights file that the load read and its runs do not
(handler.core.pages): an int4 decoder's MatMulNBits packs each weight and its scales into a copy of its own, so
the scales' pages, read once while the session was built, would stay in the RSS for the instance's life.

The tiny pack: tests/fixtures/genai_pack.py's qwen3, int4 (the builder's MatMulNBits)."""

from __future__ import annotations

from pathlib import Path

import pytest

from handler.core import pages
from handler.core.config import Config
from handler.runtime.invocation import Runtime
from tests.fixtures.genai_pack import cached_genai_pack

REQUEST = {"prompt": "hello world the quick brown fox", "max_tokens": 8, "temperature": 0}


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cached_genai_pack(tmp_path_factory.mktemp("genai"), "qwen3", "int4")


def answer(runtime: Runtime) -> list[int]:
    return [t for piece in runtime.task.stream(dict(REQUEST)) for t in piece["token_ids"]]  # type: ignore[attr-defined]


def resident(files: list[Path]) -> int:
    return sum(rss for *_, rss in pages.file_mappings(files))


def test_init_gives_back_what_the_load_read_and_the_answer_is_the_same(pack: Path) -> None:
    runtime = Runtime.start(Config(model_dir=pack, backend=None, warmup=False), environ={}, emit=None)
    engine = runtime.backend
    released = engine.released  # type: ignore[attr-defined]
    # the weights file's mappings and the libraries' code (their written data pages are skipped)
    assert released.mappings > 0 and released.resident_bytes > 0 and released.skipped > 0, released
    assert engine.describe()["released_after_load"]["mappings"] == released.mappings  # type: ignore[attr-defined]
    data = [pack / "model.onnx.data"]
    mappings = pages.file_mappings(data, writable=data)  # ORT maps it private and writable; nothing writes it
    assert mappings and all(droppable for _, _, droppable, _ in mappings)
    assert resident(data) == 0
    first = answer(runtime)
    assert resident(data) > 0  # what the runs read is mapped back
    pages.release_file_pages(data, writable=data)  # and again: the same answer, read from the file
    assert first and answer(runtime) == first


def test_the_batch_engine_gives_back_what_its_load_read_and_answers_the_same(pack: Path) -> None:
    # WARMSTART_GENAI_BATCH > 1: ONNX Runtime's own session (handler.backends.genai_batch), loaded the same way
    single = Runtime.start(Config(model_dir=pack, backend=None, warmup=False), environ={}, emit=None)
    expected = answer(single)
    runtime = Runtime.start(
        Config(model_dir=pack, backend=None, warmup=False), environ={"WARMSTART_GENAI_BATCH": "2"}, emit=None
    )
    engine = runtime.backend
    released = engine.released  # type: ignore[attr-defined]
    assert released is not None and released.mappings > 0 and released.resident_bytes > 0, released
    assert engine.describe()["released_after_load"]["mappings"] == released.mappings  # type: ignore[attr-defined]
    data = [pack / "model.onnx.data"]
    assert resident(data) == 0  # the session's mappings of the weights file: none of its pages left in the RSS
    assert answer(runtime) == expected
