"""The genai engine gives a prompt to the decoder in steps of WARMSTART_GENAI_PREFILL_CHUNK tokens (the attention's
score matrix, heads x step x length, is what a long prompt's peak memory is made of): the answers are the
whole-prompt step's, token for token, and describe() shows the setting. The tiny pack is tests/fixtures/genai_pack.py's
cached qwen3 (shared with test_lm_layout and test_generate)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from handler.backends import genai_capi  # the module the engine's generators come from
from handler.backends.genai_spec import PREFILL_CHUNK, GenaiSettings
from handler.core.config import Config
from handler.core.errors import ConfigError
from handler.runtime.invocation import Runtime
from tests.fixtures.genai_pack import cached_genai_pack

PROMPT = "hello world the quick brown fox jumps over the lazy dog and runs far away into the night"


def start(model: Path, **environ: str) -> Runtime:
    return Runtime.start(Config(model_dir=model, backend=None, warmup=False), environ=environ, emit=None)


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cached_genai_pack(tmp_path_factory.mktemp("genai"), "qwen3")


def run(runtime: Runtime, monkeypatch: pytest.MonkeyPatch, **request: Any) -> tuple[list[int], list[int]]:
    """The streamed token ids, and the sizes of the prompt steps the generator was given."""
    steps: list[int] = []
    real = genai_capi.Generator

    class Counting:  # the library's generator, its prompt steps counted
        def __init__(self, model: Any, search: Any) -> None:
            self._g = real(model, search)

        def append_tokens(self, ids: list[int]) -> None:
            steps.append(len(ids))
            self._g.append_tokens(ids)

        def __getattr__(self, name: str) -> Any:
            return getattr(self._g, name)

    with monkeypatch.context() as m:
        m.setattr(genai_capi, "Generator", Counting)
        body = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, **request}
        ids = [t for piece in runtime.task.stream(body) for t in piece["token_ids"]]  # type: ignore[attr-defined]
    return ids, steps


def test_a_prompt_in_steps_answers_as_in_one(pack: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    whole = start(pack, WARMSTART_GENAI_PREFILL_CHUNK="0")
    assert whole.backend.describe()["prefill_chunk"] == 0  # type: ignore[attr-defined]
    reference, one = run(whole, monkeypatch)
    assert len(one) == 1 and one[0] > 8, one
    chunked = start(pack, WARMSTART_GENAI_PREFILL_CHUNK="4")
    assert chunked.backend.describe()["prefill_chunk"] == 4  # type: ignore[attr-defined]
    got, steps = run(chunked, monkeypatch)
    assert steps == [4] * (one[0] // 4) + ([one[0] % 4] if one[0] % 4 else []), steps
    assert got == reference and len(reference) > 1
    # sampled, the same seed: the same draw whichever steps the prompt took
    sampled = {"temperature": 0.9, "seed": 7}
    assert run(chunked, monkeypatch, **sampled)[0] == run(whole, monkeypatch, **sampled)[0]


def test_the_default_and_a_bad_value() -> None:
    assert GenaiSettings.from_environ({}).prefill_chunk == PREFILL_CHUNK == 64
    with pytest.raises(ConfigError, match=r"WARMSTART_GENAI_PREFILL_CHUNK=-1 is outside \[0, "):
        GenaiSettings.from_environ({"WARMSTART_GENAI_PREFILL_CHUNK": "-1"})
