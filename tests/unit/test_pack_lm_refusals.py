"""`pack --from` refuses a causal-LM directory it cannot serve faithfully: one typed line, before the builder
runs and before anything is written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from infra.pack.hf_checks import SourceError
from infra.pack.hf_source import MissingFileError, UnsupportedModelError
from infra.pack.precision import Precision, PrecisionError


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.lm_models import make_lm_dir

    return make_lm_dir(tmp_path_factory.mktemp("lm"), "qwen3")


@pytest.fixture
def src(base: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(base, tmp_path / "model"))


def _pack(src: Path, out: Path, **kwargs: Any) -> Path:
    from infra.pack.hf_pack import pack_from

    return pack_from(src, out, **kwargs)


def _edit(path: Path, **changes: Any) -> None:
    raw = json.loads(path.read_text())
    raw.update(changes)
    path.write_text(json.dumps(raw))


def _refused(src: Path, tmp_path: Path, error: type[Exception], match: str, **kwargs: Any) -> str:
    out = tmp_path / "out"
    with pytest.raises(error, match=match) as info:
        _pack(src, out, **kwargs)
    assert not out.exists()
    message = str(info.value)
    assert "\n" not in message
    return message


def test_custom_code_is_refused(src: Path, tmp_path: Path) -> None:
    _edit(src / "config.json", auto_map={"AutoModelForCausalLM": "modeling_x.XForCausalLM"})
    _refused(src, tmp_path, UnsupportedModelError, "auto_map names the model's own code")


def test_trust_remote_code_is_refused(src: Path, tmp_path: Path) -> None:
    _edit(src / "config.json", trust_remote_code=True)
    _refused(src, tmp_path, UnsupportedModelError, "trust_remote_code")


def test_custom_tokenizer_code_is_refused(src: Path, tmp_path: Path) -> None:
    _edit(src / "tokenizer_config.json", auto_map={"AutoTokenizer": ["tok.MyTokenizer", None]})
    _refused(src, tmp_path, UnsupportedModelError, "tokenizer_config.json: auto_map")


def _rewrite_weights(src: Path, change: Any) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(src / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(src / "model.safetensors"))


def test_missing_tensor_is_refused(src: Path, tmp_path: Path) -> None:
    _rewrite_weights(src, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    _refused(src, tmp_path, SourceError, "missing tensors for Qwen3ForCausalLM: model.layers.1.mlp.up_proj.weight")


def test_extra_tensor_is_refused(src: Path, tmp_path: Path) -> None:
    import torch

    _rewrite_weights(src, lambda t: t.update({"model.layers.1.self_attn.extra.weight": torch.zeros(2, 2)}))
    _refused(src, tmp_path, SourceError, "tensors Qwen3ForCausalLM does not have: model.layers.1.self_attn.extra")


def test_config_the_checkpoint_cannot_match_is_refused(src: Path, tmp_path: Path) -> None:
    _edit(src / "config.json", intermediate_size=96)
    _refused(src, tmp_path, SourceError, r"config.json: model.layers.0.mlp.down_proj.weight is \[64, 96\]")


def test_more_layers_than_the_checkpoint_is_refused(src: Path, tmp_path: Path) -> None:
    _edit(src / "config.json", num_hidden_layers=3, layer_types=["full_attention"] * 3)
    _refused(src, tmp_path, SourceError, "missing tensors for Qwen3ForCausalLM: model.layers.2")


def test_unsupported_causal_lm_lists_the_valid_ones(src: Path, tmp_path: Path) -> None:
    _edit(src / "config.json", architectures=["GPT2LMHeadModel"], model_type="gpt2")
    message = _refused(src, tmp_path, UnsupportedModelError, "GPT2LMHeadModel is not a supported causal LM")
    for name in ("Qwen3ForCausalLM", "LlamaForCausalLM", "Gemma3ForCausalLM", "Phi3ForCausalLM", "MistralForCausalLM"):
        assert name in message


def test_generate_asked_of_an_encoder_is_refused(src: Path, tmp_path: Path) -> None:
    _edit(src / "config.json", architectures=["BertModel"], model_type="bert")
    _refused(src, tmp_path, UnsupportedModelError, "BertModel is not a supported causal LM", task="generate")


def test_model_type_disagreeing_with_the_architecture_is_refused(src: Path, tmp_path: Path) -> None:
    _edit(src / "config.json", model_type="llama")
    _refused(src, tmp_path, UnsupportedModelError, "Qwen3ForCausalLM is model_type 'qwen3'")


def test_no_tokenizer_json_is_refused(src: Path, tmp_path: Path) -> None:
    (src / "tokenizer.json").unlink()
    _refused(src, tmp_path, MissingFileError, "tokenizer.json: missing")


def test_pickled_weights_are_refused(src: Path, tmp_path: Path) -> None:
    (src / "model.safetensors").rename(src / "pytorch_model.bin")
    _refused(src, tmp_path, MissingFileError, "safetensors only")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_names_what_cpu_packs(src: Path, tmp_path: Path, dtype: str) -> None:
    message = _refused(src, tmp_path, PrecisionError, f"--dtype {dtype}", precision=Precision(dtype=dtype))
    assert "valid on CPU: --dtype float32, --quantize int8, --quantize int4" in message


def test_int8_block_is_an_encoder_quantization(src: Path, tmp_path: Path) -> None:
    _refused(src, tmp_path, PrecisionError, "--quantize int8-block", precision=Precision(quantize="int8-block"))


def test_other_backends_are_refused(src: Path, tmp_path: Path) -> None:
    _refused(
        src, tmp_path, UnsupportedModelError, r"task generate packs genai, vllm \(one or both\)", backends=["onnx"]
    )


def test_int4_is_refused_for_encoders() -> None:
    with pytest.raises(PrecisionError, match="--quantize int4 is for causal LMs"):
        Precision(quantize="int4").backends(("onnx", "torch"), {}, None)


def test_causal_lm_is_detected(src: Path) -> None:
    from infra.pack.lm_source import is_causal_lm

    assert is_causal_lm(src)
    (src / "modules.json").write_text("[]")  # a sentence-transformers directory (a decoder reranker): not here
    assert not is_causal_lm(src)
    (src / "modules.json").unlink()
    _edit(src / "config.json", architectures=["Qwen3Model"])
    assert not is_causal_lm(src)


def test_phi3_longrope_is_refused(tmp_path: Path) -> None:
    from tests.lm_models import make_lm_dir

    src = make_lm_dir(tmp_path / "m", "phi3")
    raw = json.loads((src / "config.json").read_text())
    raw["rope_parameters"] = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 8}
    (src / "config.json").write_text(json.dumps(raw))
    _refused(src, tmp_path, UnsupportedModelError, "phi3 with longrope scaling")
