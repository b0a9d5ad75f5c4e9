"""`warmstart pack --from DIR` for causal LMs (task generate): every family's tiny chat model packed through
onnxruntime-genai's builder decodes token-exact against transformers, the manifest's `generation` is what
transformers reads, int4 records its gate's figures, and each refusal is one typed line before anything is
written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from infra.pack.bpe_merges import compact_merges, same_tokenizer
from tests.fixtures.lm_pack import SLIDING, pack_tiny_lm, source_dir
from tests.lm_models import LM_FAMILIES

LONG_TEXT = (
    "the quick brown fox jumps over the lazy dog . what is the capital of france ? paris is the capital of "
    "france . write a short poem about the sea . the sea is blue and deep and wide ."
)
NEW = 24


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("lm-packs")
    return {family: pack_tiny_lm(out, family) for family in LM_FAMILIES}


def _transformers(family: str) -> tuple[Any, Any]:
    import transformers

    src = source_dir(family)
    tok = transformers.AutoTokenizer.from_pretrained(str(src))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(src))
    model.eval()
    return tok, model


def _og_greedy(pack: Path, ids: list[int], new: int) -> list[int]:
    import onnxruntime_genai as og

    from infra.pack.lm_quality import graph_greedy

    return graph_greedy(og, og.Model(str(pack)), ids, new)


def _hf_greedy(model: Any, ids: list[int], new: int) -> list[int]:
    import torch

    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=new)
    return [int(t) for t in out[0, len(ids) :]]


@pytest.mark.parametrize("family", LM_FAMILIES)
def test_greedy_is_token_exact(packs: dict[str, Path], family: str) -> None:
    from tokenizers import Tokenizer

    pack = packs[family]
    tok, model = _transformers(family)
    packed_tok = Tokenizer.from_file(str(pack / "tokenizer.json"))
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": "what is the capital of france ?"}], tokenize=False, add_generation_prompt=True
    )
    chat_ids = packed_tok.encode(rendered, add_special_tokens=False).ids
    assert chat_ids == tok(rendered, add_special_tokens=False)["input_ids"]
    raw_ids = packed_tok.encode(LONG_TEXT).ids  # a raw prompt, the tokenizer's own bos where it adds one
    assert raw_ids == tok(LONG_TEXT)["input_ids"]
    if family in SLIDING:
        assert len(raw_ids) > 16 + 8  # past the window of 16, decoding further still
    for ids in (chat_ids, raw_ids):
        want = _hf_greedy(model, ids, NEW)
        assert len(want) >= 8
        assert _og_greedy(pack, ids, NEW) == want
    # Greedy tokens can agree on a model that repeats itself (the tiny gemma3 does): the logits at every position
    # of the long prompt, fed a token at a time past the window, must be transformers' too.
    assert _og_logits_diff(pack, model, raw_ids) < 1e-3


def _og_logits_diff(pack: Path, model: Any, ids: list[int]) -> float:
    import numpy as np
    import onnxruntime_genai as og
    import torch

    with torch.no_grad():
        want = model(torch.tensor([ids])).logits[0].numpy()
    graph = og.Model(str(pack))
    params = og.GeneratorParams(graph)
    params.set_search_options(do_sample=False, max_length=len(ids) + 1)
    generator = og.Generator(graph, params)
    generator.append_tokens(ids[:4])
    worst = float(np.abs(np.asarray(generator.get_logits())[0, -1] - want[3]).max())
    for i in range(4, len(ids)):
        generator.append_tokens([ids[i]])
        worst = max(worst, float(np.abs(np.asarray(generator.get_logits())[0, -1] - want[i]).max()))
    return worst


@pytest.mark.parametrize("family", LM_FAMILIES)
def test_generation_fields_are_what_transformers_reads(packs: dict[str, Path], family: str) -> None:
    from handler.core.manifest import load_manifest, verify_sha256

    pack = packs[family]
    tok, model = _transformers(family)
    manifest = load_manifest(pack)
    verify_sha256(manifest)
    raw = manifest.raw
    assert raw["task"] == "generate" and raw["family"] == family and raw["default_backend"] == "genai"
    layout = raw["backends"]["genai"].pop("layout")  # the weights at page offsets (infra/pack/lm_layout.py)
    # float32: no int4 MatMulNBits for our Q4MatMul (infra/pack/lm_q4.py), and the manifest says so.
    assert raw["backends"]["genai"].pop("q4_skipped").startswith("float32 pack: the op computes 4-bit blocks only")
    assert raw["backends"]["genai"] == {
        "config": "genai_config.json",
        "model": "model.onnx",
        "files": ["genai_config.json", "model.onnx", "model.onnx.data"],
    }
    assert layout["page"] == 4096 and layout["ranges"]["model.onnx.data"][0][0] % 4096 == 0
    assert sorted(p.name for p in pack.iterdir()) == sorted([*raw["files"], "manifest.json"])
    # The user's tokenizer, its BPE merges as strings (parsed faster at init) where provably the same tokenizer.
    packed, given = (pack / "tokenizer.json").read_text(), (source_dir(family) / "tokenizer.json").read_text()
    assert packed == given or (packed == compact_merges(given) and same_tokenizer(packed, given))
    gen = raw["generation"]
    assert gen["chat_template"] == tok.chat_template
    want_eos = model.generation_config.eos_token_id
    want_eos = want_eos if isinstance(want_eos, list) else [want_eos]
    assert gen["eos_token_ids"][: len(want_eos)] == want_eos
    assert set(gen["eos_token_ids"]) == set(want_eos) | {model.config.eos_token_id}
    assert gen["bos_token_id"] == tok.bos_token_id
    assert gen["pad_token_id"] == tok.pad_token_id
    assert gen["special_tokens"] == {
        "bos_token": tok.bos_token,
        "eos_token": tok.eos_token,
        "pad_token": tok.pad_token,
        "unk_token": tok.unk_token,
    }
    assert gen["add_bos_token"] == (tok.bos_token_id is not None and tok("hi")["input_ids"][0] == tok.bos_token_id)
    assert gen["add_bos_token"] == (family in ("llama", "gemma3_text", "phi3", "mistral"))
    assert gen["context_length"] == model.config.max_position_embeddings
    assert gen["vocab_size"] == model.config.vocab_size
    assert gen["defaults"] == {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "do_sample": True}
    assert gen["kv"] == {
        "layers": model.config.num_hidden_layers,
        "kv_heads": model.config.num_key_value_heads,
        "head_dim": model.config.head_dim if hasattr(model.config, "head_dim") else 16,
        "dtype": "float32",
    }
    genai = json.loads((pack / "genai_config.json").read_text())
    assert genai["model"]["eos_token_id"] == gen["eos_token_ids"]
    assert genai["search"]["top_k"] == 20 and genai["search"]["do_sample"] is True
    quality = raw["precision"]["quality"]
    assert quality["figure"] == 1.0 and quality["top1_agreement"] == 1.0 and quality["items"] == 8


def test_chat_template_file_and_named_list(tmp_path: Path) -> None:
    from infra.pack.lm_source import read_lm_source
    from tests.lm_models import QWEN3_TEMPLATE, make_lm_dir

    src = make_lm_dir(tmp_path / "a", "qwen3", chat_template_file=True)
    assert "chat_template" not in json.loads((src / "tokenizer_config.json").read_text())
    assert read_lm_source(src).chat_template == QWEN3_TEMPLATE
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    cfg["chat_template"] = [{"name": "tool_use", "template": "x"}, {"name": "default", "template": "y"}]
    (src / "tokenizer_config.json").write_text(json.dumps(cfg))
    assert read_lm_source(src).chat_template == "y"


def test_int4_records_its_quality(tmp_path: Path) -> None:
    from handler.core.manifest import load_manifest

    pack = pack_tiny_lm(tmp_path, "qwen3", quantize="int4")
    manifest = load_manifest(pack)
    precision = manifest.raw["precision"]
    assert precision["quantization"] == "int4" and precision["backend"] == "genai"
    float_pack = load_manifest(pack_tiny_lm(tmp_path, "qwen3"))  # one model, two precisions: two id@versions
    assert manifest.id == float_pack.id and manifest.version.endswith("-int4") and manifest.key != float_pack.key
    quality = precision["quality"]
    assert 0.0 <= quality["figure"] < 1.0  # the tiny random model quantizes badly (infra.pack.lm_quality)
    assert quality["figure"] == quality["greedy_agreement"]
    assert 0.0 < quality["top1_agreement"] <= 1.0
    assert quality["min_quality"] == 0.0 and quality["items"] == 8
    assert (pack / "model.onnx.data").stat().st_size < (source_dir("qwen3") / "model.safetensors").stat().st_size
    scheme = precision["scheme"]
    assert {k: scheme[k] for k in ("block_size", "accuracy_level", "symmetric", "scales")} == {
        "block_size": 32,
        "accuracy_level": 4,
        "symmetric": True,
        "scales": "rtn",
    }
    assert "blocks" not in scheme  # the builder's blocks as written (tests/functional/test_pack_lm_int4.py: mse)
    assert "scales" not in precision["builder_options"]  # ours, applied after the builder: never passed to it
    assert scheme["head_bits"] == 8  # the LM head at 8 bits on the int4 body (tests/functional/test_pack_lm_head.py)
    assert scheme["head_block"] == 64  # in blocks of 128 or the largest that divides the hidden size (64 here)
    assert _matmuls(pack) == {(4, 32, 4, False), (8, 64, 4, False)} and _logits_positions(pack) == 1


def _matmuls(pack: Path) -> set[tuple[int, int, int, bool]]:
    """The graph's MatMulNBits nodes as (bits, block_size, accuracy_level, has zero points)."""
    import onnx

    out = set()
    for node in onnx.load(str(pack / "model.onnx"), load_external_data=False).graph.node:
        if node.op_type == "MatMulNBits":
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            zero_points = len(node.input) > 3 and bool(node.input[3])
            out.add((attrs["bits"], attrs["block_size"], attrs.get("accuracy_level", 0), zero_points))
    return out


def _logits_positions(pack: Path) -> int | str:
    """The logits output's sequence dimension: 1 when the LM head runs on the last position only."""
    import onnx

    graph = onnx.load(str(pack / "model.onnx"), load_external_data=False).graph
    dim = next(o for o in graph.output if o.name == "logits").type.tensor_type.shape.dim[1]
    return dim.dim_value or dim.dim_param


def test_each_precision_records_and_builds_its_scheme(tmp_path: Path) -> None:
    """float32 and int8 (int4: above): the builder's options in the manifest, the graph built with them (the LM
    head on the last prompt position only, int8 in blocks of 128), and the options in the version."""
    from handler.core.manifest import load_manifest
    from infra.pack.lm_pack import BUILDER_OPTIONS
    from infra.pack.publish import default_version

    float_pack = pack_tiny_lm(tmp_path, "qwen3")  # the session's cached packs (the `packs` fixture's qwen3)
    float32 = load_manifest(float_pack).raw
    assert float32["precision"]["builder_options"] == {"prune_lm_head": True} and "scheme" not in float32["precision"]
    assert _logits_positions(float_pack) == 1 and _matmuls(float_pack) == set()
    sha = float32["source"]["content_sha256"]
    scheme = json.dumps(BUILDER_OPTIONS["fp32"], sort_keys=True)
    assert float32["version"] == default_version(sha, "generate", "float32", scheme) != default_version(sha, "generate")
    int8 = pack_tiny_lm(tmp_path, "qwen3", quantize="int8")
    precision = load_manifest(int8).raw["precision"]
    assert precision["scheme"] == {
        "block_size": 128,
        "accuracy_level": 4,
        "symmetric": True,
        "scales": "rtn",
        "head_bits": 8,
        "head_block": 128,  # int8's head is the body's: no re-blocking (infra.pack.lm_head.check_block)
    }
    assert precision["builder_options"] == {
        "accuracy_level": 4,
        "block_size": 128,
        "is_symmetric": True,
        "prune_lm_head": True,
    }
    assert _matmuls(int8) == {(8, 128, 4, False)} and _logits_positions(int8) == 1


def test_quantized_below_the_gate_is_refused_and_nothing_written(tmp_path: Path) -> None:
    from infra.pack.hf_pack import pack_from
    from infra.pack.precision import Precision
    from infra.pack.quality import QualityError

    with pytest.raises(QualityError, match=r"--quantize int4: quality .* is below --min-quality 0\.99"):
        pack_from(source_dir("qwen3"), tmp_path / "out", precision=Precision(quantize="int4", min_quality=0.99))
    assert list(tmp_path.iterdir()) == []


def test_float32_must_be_exact() -> None:
    from infra.pack.lm_quality import check
    from infra.pack.quality import QualityError

    figures = {"metric": "m", "figure": 0.9375, "top1_agreement": 1.0, "items": 8}
    with pytest.raises(QualityError, match="cannot be proved equal to the source"):
        check(figures, "float32", None)
    assert check({**figures, "figure": 1.0}, "float32", 0.0)["min_quality"] == 1.0


def test_cli_packs_generate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from infra.cli import main

    out = tmp_path / "cli"
    assert main(["pack", "--from", str(source_dir("llama")), "--task", "generate", "--out", str(out), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["task"] == "generate" and printed["backends"] == ["genai"]
    from handler.core.manifest import load_manifest
    from infra.pack.publish import default_version

    sha = load_manifest(out).raw["source"]["content_sha256"]  # the version: the weights, task and precision hashed
    from infra.pack.lm_pack import BUILDER_OPTIONS

    scheme = json.dumps(BUILDER_OPTIONS["fp32"], sort_keys=True)
    assert printed["model"].split("@")[1] == default_version(sha, "generate", "float32", scheme)
    assert main(["pack", "--from", str(source_dir("llama")), "--out", str(out)]) == 1  # exists, no --force
    assert "exists" in capsys.readouterr().err
    assert main(["pack", "--from", str(source_dir("llama")), "--out", str(out), "--force"]) == 0


def test_bench_qwen3_chat_model_packs(tmp_path: Path) -> None:
    """bench/pack/models.py's Qwen3-0.6B-shaped chat model (here its tiny override) packs as task generate."""
    from bench.pack.models import CHATML_TEMPLATE, qwen3_chat
    from handler.core.manifest import load_manifest
    from infra.pack.hf_pack import pack_from

    tiny = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    src = qwen3_chat(tmp_path / "src", intermediate_size=128, vocab_size=1024, max_position_embeddings=512, **tiny)
    gen = load_manifest(pack_from(src, tmp_path / "out")).raw["generation"]
    assert gen["chat_template"] == CHATML_TEMPLATE and gen["add_bos_token"] is False
    assert gen["eos_token_ids"] == [1000, 998]  # <|im_end|>, <|endoftext|>: 26 special ids end the 1,024
    assert gen["vocab_size"] == 1024 and gen["context_length"] == 512
    assert gen["defaults"] == {"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20}


def test_calibration_prompts_replace_the_builtin_ones(tmp_path: Path) -> None:
    from handler.core.manifest import load_manifest
    from infra.pack.hf_pack import pack_from
    from infra.pack.precision import Precision

    precision = Precision(calibration=("hello there", "write json"))
    quality = load_manifest(pack_from(source_dir("mistral"), tmp_path / "out", precision=precision)).raw["precision"]
    assert quality["quality"]["items"] == 2 and quality["quality"]["calibration"] == "file"
    assert quality["quality"]["figure"] == 1.0


def test_the_gate_runs_torch_on_one_thread_and_gives_the_callers_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch's OpenMP team of 2 hung a SmolLM2 pack's gate (infra.pack.lm_quality.measure): the reference runs on
    one thread, and the caller's thread count is restored after, also when the gate raises."""
    import torch

    from infra.pack import lm_quality
    from infra.pack.lm_source import read_lm_source

    pack = pack_tiny_lm(tmp_path, "qwen3")
    source = read_lm_source(source_dir("qwen3"))
    seen: list[int] = []
    reference = lm_quality.reference_greedy

    def recording(*args: Any) -> list[int]:
        seen.append(torch.get_num_threads())
        return reference(*args)

    monkeypatch.setattr(lm_quality, "reference_greedy", recording)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        figures = lm_quality.measure(source, pack, ["hello world", "the sea"], 4, [0])
        assert seen == [1, 1] and torch.get_num_threads() == 2 and figures["figure"] == 1.0

        def failing(*args: Any) -> list[int]:
            raise RuntimeError("reference failed")

        monkeypatch.setattr(lm_quality, "reference_greedy", failing)
        with pytest.raises(RuntimeError, match="reference failed"):
            lm_quality.measure(source, pack, ["hello world"], 4, [0])
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
