"""The `generate` task's checks: each refusal of a native request names its field and valid range; the manifest's
`generation` facts; stop strings held back; and the chat template rendered exactly as transformers renders it,
for every family of tests/lm_models.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from handler.core.errors import InvalidInputError
from handler.tasks import chat
from handler.tasks.generate import held_prefix
from handler.tasks.generation import check_request, fields, max_tokens_setting
from tests.fixtures.genai_pack import generation_facts
from tests.lm_models import LM_FAMILIES, make_lm_dir

CHAT = [{"role": "user", "content": "hello"}]


@pytest.mark.parametrize(
    ("payload", "names"),
    [
        ({"messages": CHAT, "prompt": "x"}, ['exactly one of "messages"']),
        ({}, ['exactly one of "messages"']),
        ({"prompt": ""}, ['"prompt" must be a non-empty string']),
        ({"prompt": 3}, ['"prompt" must be a non-empty string']),
        ({"prompt": "x", "max_tokens": 0}, ['"max_tokens"', "from 1 to 4096"]),
        ({"prompt": "x", "max_tokens": 5000}, ['"max_tokens"', "from 1 to 4096", "5000"]),
        ({"prompt": "x", "max_tokens": 2.5}, ['"max_tokens" must be an integer']),
        ({"prompt": "x", "temperature": 2.5}, ['"temperature"', ">= 0 and <= 2", "2.5"]),
        ({"prompt": "x", "temperature": -0.1}, ['"temperature"', ">= 0 and <= 2"]),
        ({"prompt": "x", "temperature": True}, ['"temperature" must be a number']),
        ({"prompt": "x", "top_p": 0}, ['"top_p"', "> 0 and <= 1"]),
        ({"prompt": "x", "top_p": 1.5}, ['"top_p"', "> 0 and <= 1"]),
        ({"prompt": "x", "top_k": -1}, ['"top_k"', "from 0 to"]),
        ({"prompt": "x", "seed": "7"}, ['"seed" must be an integer']),
        ({"prompt": "x", "stop": ""}, ['"stop"', "1 to 4 non-empty strings"]),
        ({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, ['"stop"', "1 to 4"]),
        ({"prompt": "x", "stop": ["a", 1]}, ['"stop"']),
        ({"prompt": "x", "response_format": {"type": "xml"}}, ['"response_format.type"', "text, json_object"]),
        ({"prompt": "x", "response_format": {"type": "json_schema"}}, ['"response_format.json_schema.schema"']),
        ({"messages": CHAT, "chat_template_kwargs": [1]}, ['"chat_template_kwargs" must be an object']),
        ({"prompt": "x", "chat_template_kwargs": {"a": 1}}, ['"chat_template_kwargs" is for "messages"']),
        ({"prompt": "x", "stream": "yes"}, ['"stream" must be true or false']),
        ({"messages": []}, ['"messages" must be a non-empty list']),
        ({"messages": [{"role": "tool", "content": "x"}]}, ["role 'tool'", "valid: system, user, assistant"]),
        ({"messages": [{"role": "user"}]}, ['"messages"[0] has no content']),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, ['"messages"[0].content[0]']),
        ({"messages": [{"role": "user", "content": 5}]}, ['"messages"[0].content must be a string']),
    ],
)
def test_a_bad_request_is_refused_naming_the_field(payload: dict[str, Any], names: list[str]) -> None:
    with pytest.raises(InvalidInputError) as caught:
        check_request(payload, 4096)
    for name in names:
        assert name in str(caught.value)


def test_a_good_request_is_read_with_its_defaults_unset() -> None:
    got = check_request(
        {
            "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
            "stop": "x",
            "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}}},
            "chat_template_kwargs": {"enable_thinking": False},
        },
        4096,
    )
    assert got["messages"] == [{"role": "user", "content": "a\nb"}]  # text parts joined as vLLM joins them
    assert got["stop"] == ["x"] and got["max_tokens"] is None and got["temperature"] is None
    assert got["response_format"] == {"type": "json_schema", "schema": {"type": "object"}}
    assert check_request({"prompt": "x", "response_format": {"type": "text"}}, 8)["response_format"] is None


def test_the_max_tokens_setting() -> None:
    assert max_tokens_setting({}) == 4096
    assert max_tokens_setting({"WARMSTART_MAX_TOKENS": "64"}) == 64
    with pytest.raises(ValueError, match="WARMSTART_MAX_TOKENS"):
        max_tokens_setting({"WARMSTART_MAX_TOKENS": "0"})


def _generation(**changes: Any) -> dict[str, Any]:
    gen = {
        "chat_template": None,
        "special_tokens": {"eos_token": "</s>"},
        "eos_token_ids": [2],
        "add_bos_token": False,
        "context_length": 512,
        "vocab_size": 400,
        "defaults": {"temperature": 0.7, "do_sample": True, "typical_p": 0.5},
        "kv": {"layers": 2, "kv_heads": 2, "head_dim": 16, "dtype": "float32"},
    }
    return {"generation": gen | changes}


def test_the_manifest_generation_facts_are_checked() -> None:
    options = fields(_generation())
    assert options["defaults"] == {"temperature": 0.7, "do_sample": True}  # keys it does not use are left out
    assert options["special_tokens"]["bos_token"] is None and options["eos_token_ids"] == [2]
    for bad, name in [
        ({"eos_token_ids": 2}, "eos_token_ids"),
        ({"context_length": 0}, "context_length"),
        ({"vocab_size": None}, "vocab_size"),
        ({"add_bos_token": "yes"}, "add_bos_token"),
        ({"chat_template": 3}, "chat_template"),
        ({"defaults": {"temperature": "hot"}}, "defaults.temperature"),
        ({"kv": {"layers": 2, "dtype": "int8"}}, "generation.kv"),
    ]:
        with pytest.raises(ValueError, match=name):
            fields(_generation(**bad))
    with pytest.raises(ValueError, match="needs 'generation'"):
        fields({})


def test_a_possible_stop_string_start_is_held_back() -> None:
    assert held_prefix("hello wor", ["world"]) == 3
    assert held_prefix("hello", ["world"]) == 0
    assert held_prefix("abc", ["c!", "bc?"]) == 2  # the longest of the candidates
    assert held_prefix("ab", ["abc"]) == 2


# -- the chat template, as transformers renders it ----------------------------------------------------------

CONVERSATION = [
    {"role": "system", "content": "you are terse"},
    {"role": "user", "content": "what is the capital of france ?"},
    {"role": "assistant", "content": "paris"},
    {"role": "user", "content": "  and the sea ?  "},
]
NO_SYSTEM = CONVERSATION[1:]


@pytest.fixture(scope="module")
def lm_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lm")
    return {family: make_lm_dir(root, family) for family in LM_FAMILIES}


def _ours(src: Path, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    facts = generation_facts(src)
    return chat.render(facts["chat_template"], chat.check_messages(messages), facts["special_tokens"], kwargs)


@pytest.mark.parametrize("family", LM_FAMILIES)
def test_the_chat_template_renders_as_transformers_does(family: str, lm_dirs: dict[str, Path]) -> None:
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    src = lm_dirs[family]
    hf = AutoTokenizer.from_pretrained(src)
    # Gemma and Mistral refuse a system turn in the alternation check's position: they get the conversation
    # without it (Gemma folds a system message into the first turn, tested below).
    messages = NO_SYSTEM if family == "mistral" else CONVERSATION
    want = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    got = _ours(src, messages)
    assert got == want
    # The template's own special tokens are encoded as specials (one id each), nothing added in front.
    ids = Tokenizer.from_file(str(src / "tokenizer.json")).encode(got, add_special_tokens=False).ids
    assert ids == hf(want, add_special_tokens=False)["input_ids"]
    specials = {v for v in generation_facts(src)["special_tokens"].values() if v} | set(hf.all_special_tokens)
    in_text = [t for t in specials if t in got]
    assert in_text, "each family's template writes special tokens"
    for token in in_text:
        assert hf.convert_tokens_to_ids(token) in ids


def test_qwen3_without_thinking(lm_dirs: dict[str, Path]) -> None:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(lm_dirs["qwen3"])
    want = hf.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    got = _ours(lm_dirs["qwen3"], CHAT, enable_thinking=False)
    assert got == want and got.endswith("<think>\n\n</think>\n\n")
    assert _ours(lm_dirs["qwen3"], CHAT) != got  # the kwarg reached the template


def test_llama_dates_its_prompt_with_strftime_now(lm_dirs: dict[str, Path]) -> None:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(lm_dirs["llama"])
    assert _ours(lm_dirs["llama"], CHAT) == hf.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    # A date_string given by the request wins over today's (the template's `is defined` check).
    assert _ours(lm_dirs["llama"], CHAT, date_string="1 Jan 2000") == hf.apply_chat_template(
        CHAT, tokenize=False, add_generation_prompt=True, date_string="1 Jan 2000"
    )


def test_gemma_folds_the_system_turn_and_refuses_roles_that_do_not_alternate(lm_dirs: dict[str, Path]) -> None:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(lm_dirs["gemma3_text"])
    assert _ours(lm_dirs["gemma3_text"], CONVERSATION) == hf.apply_chat_template(
        CONVERSATION, tokenize=False, add_generation_prompt=True
    )
    two_users = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(InvalidInputError, match="Conversation roles must alternate user/assistant"):
        _ours(lm_dirs["gemma3_text"], two_users)


def test_a_template_cannot_reach_python_internals() -> None:
    evil = "{{ messages.__class__.__mro__ }}"
    with pytest.raises(InvalidInputError, match="refused"):
        chat.render(evil, [{"role": "user", "content": "x"}], {})
    with pytest.raises(ValueError, match="does not compile"):
        chat.render("{% for %}", [{"role": "user", "content": "x"}], {})


def test_the_first_token_keeps_its_leading_space_after_the_prompt() -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from handler.tasks.generate import _Decoder

    tok = Tokenizer(models.WordLevel({"<unk>": 0, "▁hello": 1, "▁world": 2, "é": 3}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    assert tok.decode([2]) == "world"  # alone, a SentencePiece decoder drops the leading space
    decoder = _Decoder(tok, [1])  # after the prompt "hello"
    assert decoder.step(2) == " world"
