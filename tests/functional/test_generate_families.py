"""Every family `pack --from` packs as task generate, served through `Runtime.handle` (a direct invoke) after the
init's warm-up: the greedy answer's text is transformers' `generate()` decoded. Seen failing before the fixes:
the warm-up's two tokens on a sliding-window family (mistral, gemma3_text: the engine's cache must hold the whole
window), and an answer that ends inside a character (a random model's byte-level tokens: the last bytes decoded as
transformers decodes them, qwen3 here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from handler.core.config import Config
from handler.runtime.invocation import Runtime
from tests.fixtures.lm_pack import pack_tiny_lm, source_dir
from tests.lm_models import LM_FAMILIES

HELLO = [{"role": "user", "content": "what is the capital of france ?"}]


def transformers_text(src: Path, messages: list[dict[str, Any]], n: int) -> str:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(src)
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=True, return_tensors="pt")
    model = AutoModelForCausalLM.from_pretrained(src)
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=n, do_sample=False)
    text: str = tok.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
    return text


@pytest.mark.parametrize("family", LM_FAMILIES)
def test_each_family_answers_as_transformers_decodes(family: str, tmp_path: Path) -> None:
    pack = pack_tiny_lm(tmp_path, family)
    runtime = Runtime.start(Config(model_dir=pack, backend=None, warmup=True), environ={}, emit=None)
    answer = runtime.handle({"messages": HELLO, "max_tokens": 20, "temperature": 0})
    assert answer["text"] == transformers_text(source_dir(family), HELLO, 20)
    assert answer["usage"]["completion_tokens"] <= 20
