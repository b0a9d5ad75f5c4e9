"""Nothing of the `generate` task's warm-up survives into a request (issue 34, item 4): the warm-up's greedy
generation runs in init, before a snapshot, so whatever it left behind would be copied into every restored
instance. A runtime that warmed up answers exactly as one started without the warm-up, greedy and seeded
sampling alike, and an earlier request (sampled without a seed) changes no later one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from handler.core.config import Config
from handler.runtime.invocation import Runtime
from tests.fixtures.lm_pack import pack_tiny_lm

CHAT = [{"role": "user", "content": "tell me a story"}]
GREEDY = {"messages": CHAT, "max_tokens": 16, "temperature": 0}
SEEDED = {"messages": CHAT, "max_tokens": 16, "temperature": 1.0, "seed": 1234}
UNSEEDED = {"messages": CHAT, "max_tokens": 16, "temperature": 1.0}
PROMPT_SEEDED = {"prompt": "once upon a time", "max_tokens": 16, "temperature": 0.8, "top_k": 50, "seed": 7}


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pack_tiny_lm(tmp_path_factory.mktemp("lm"), "qwen3")


def start(pack: Path, warmup: bool) -> Runtime:
    return Runtime.start(Config(model_dir=pack, backend=None, warmup=warmup), environ={}, emit=None)


def answers(runtime: Runtime, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [runtime.handle(dict(event)) for event in events]


def test_a_warmed_up_runtime_answers_as_one_that_never_warmed_up(pack: Path) -> None:
    warmed, cold = start(pack, warmup=True), start(pack, warmup=False)
    assert "warmup" in warmed.init_report["phases_ms"] and "warmup" not in cold.init_report["phases_ms"]
    events = [GREEDY, SEEDED, PROMPT_SEEDED]
    first = answers(warmed, events)
    assert first == answers(cold, events)
    assert first[1]["text"] != first[0]["text"]  # the seeded request did sample
    # Requests between (sampled without a seed, which draws from os.urandom) leave nothing behind either.
    answers(warmed, [UNSEEDED, UNSEEDED])
    assert answers(warmed, list(reversed(events))) == list(reversed(first))
