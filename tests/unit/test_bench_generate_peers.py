"""bench/generate/peers.py's harness logic and the driver's peer kinds, offline: no llama.cpp build, no model, no
engine is started here (the bench itself is never required by the suite)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from bench.generate import driver
from bench.generate import peers as gp


def test_speed_arguments_and_their_refusals() -> None:
    args = gp.build_parser().parse_args(["speed", "--rounds", "2", "--vcpus", "1.7,2", "--pairs", "int4"])
    assert (args.rounds, args.pairs, args.prompt_tokens, args.max_tokens) == (2, "int4", 512, 64)
    assert gp.parse_vcpus(args.vcpus) == [1.7, 2.0]
    for bad in ("", "0", "1.7,-2", "two"):
        with pytest.raises(SystemExit, match="--vcpus"):
            gp.parse_vcpus(bad)
    with pytest.raises(SystemExit, match="valid: int4, int8"):
        gp.csv("int4,int3", gp.PAIRS, "pairs")
    with pytest.raises(SystemExit):  # a model outside the closed set: argparse lists the choices
        gp.build_parser().parse_args(["prepare", "--model", "gpt2"])
    assert gp.build_parser().parse_args(["quality"]).model == "smollm2"


def test_variants_pair_each_precision_with_llama_cpps_same_bits() -> None:
    assert gp.variants(["int4", "int8"]) == ["ours-int4", "llama-Q4_0", "genai-int4", "ours-int8", "llama-Q8_0"]
    assert gp.variants(["int8"], genai=False) == ["ours-int8", "llama-Q8_0"]
    assert [gp.baseline(v) for v in ("ours-int4", "genai-int4", "ours-int8")] == ["llama-Q4_0"] * 2 + ["llama-Q8_0"]
    p = gp.paths("smollm2", Path("/w"))
    assert p["source"] == Path("/w/smollm2/source")
    assert p["llama-Q4_0"] == Path("/w/smollm2/gguf/Q4_0.gguf")
    assert gp.paths("qwen3-0.6b", Path("/w"))["source"].parts[-2:] == ("bench-models", "qwen3-0.6b")


def test_child_commands_run_llama_in_its_own_venv_with_our_thread_count() -> None:
    p = gp.paths("qwen3-0.6b", Path("/w"))
    argv, env = gp.child_command("llama-Q4_0", p, 1, 1.7)
    assert argv[0] == str(gp.LLAMA_VENV / "bin" / "python")
    assert argv[2:] == ["serve", "llama", "--model", "/w/qwen3-0.6b/gguf/Q4_0.gguf", "--threads", "1"]
    assert "WARMSTART_MODEL" not in env
    argv, env = gp.child_command("genai-int4", p, 2, 2.0)
    assert argv[3:] == ["genai", "--model", "/w/qwen3-0.6b/ours-int4", "--threads", "2"]
    argv, env = gp.child_command("ours-int8", p, 1, 1.7)
    assert argv[3:5] == ["ours", "--model"]
    assert env["WARMSTART_MODEL"] == "/w/qwen3-0.6b/ours-int8"
    assert env["AWS_LAMBDA_FUNCTION_MEMORY_SIZE"] == "3008"  # 1.7 vCPU is a 3,008 MB Lambda
    # Started as Lambda starts it on demand: no warm-up generation at init (the first request pays the first run).
    assert env["AWS_LAMBDA_INITIALIZATION_TYPE"] == "on-demand" and env["AWS_LAMBDA_FUNCTION_NAME"]
    assert gp.child_command("ours-int4", p, 2, 2.0)[1]["AWS_LAMBDA_FUNCTION_MEMORY_SIZE"] == "3538"


def _row(variant: str, rnd: int, cold: float, ttft: float, tps: float, rss: float) -> dict[str, Any]:
    return {
        "variant": variant,
        "round": rnd,
        "vcpus": 1.7,
        "threads": 1,
        "load": 4.0 + rnd,
        "cold_first_token_ms": cold,
        "ttft_ms": ttft,
        "decode_tps": tps,
        "peak_rss_mb": rss,
    }


def test_the_table_quotes_ratios_taken_within_each_round() -> None:
    rows = [
        _row("ours-int4", 0, 2000, 5000, 20, 1200),
        _row("llama-Q4_0", 0, 1000, 2500, 25, 800),
        _row("ours-int4", 1, 3000, 5000, 22, 1200),
        _row("llama-Q4_0", 1, 1000, 5000, 22, 800),
        _row("ours-int4", 2, 1500, 6000, 18, 1300),
        _row("llama-Q4_0", 2, 1500, 4000, 20, 800),
    ]
    md = gp.speed_markdown(rows, SimpleNamespace(prompt_tokens=512, max_tokens=64))
    assert "**1.7 vCPU** (3,008 MB Lambda), 1 thread(s) each" in md
    own = gp.speed_markdown(rows, SimpleNamespace(prompt_tokens=512, max_tokens=64, own_cpus=True))
    assert "**1.7 vCPU** (3,008 MB Lambda; each quota its own: cpu.shares raised), 1 thread(s) each" in own
    assert "3 rounds, 1-min load average 5.0 (4.0-6.0)" in md
    # cold: 2.0, 3.0, 1.0 -> median 2.00 (1.00-3.00); TTFT 2.0, 1.0, 1.5; decode 0.8, 1.0, 0.9; RSS 1.5, 1.5, 1.625
    want = "| ours-int4 / llama-Q4_0 | 2.00x (1.00-3.00) | 1.50x (1.00-2.00) | 0.90x (0.80-1.00) | 1.50x (1.50-1.62) |"
    assert want in md
    assert "| llama-Q4_0 | 1,000 ms (1,000-1,500) |" in md
    target = {"weights_mb": 400.0, "kv_mb": 126.0, "target_mb": 676.0}
    md = gp.speed_markdown(rows, SimpleNamespace(prompt_tokens=512, max_tokens=64), {"ours-int4": target})
    assert "- ours-int4 peak RSS 1,200 MB against its target 676 MB (400 MB weights + 126 MB KV + 150 MB)" in md


def test_the_rss_target_is_the_weights_file_the_kv_of_the_tokens_and_150_mb(tmp_path: Path) -> None:
    decoder = {"num_hidden_layers": 28, "num_key_value_heads": 8, "head_size": 128}
    (tmp_path / "genai_config.json").write_text(json.dumps({"model": {"decoder": decoder}}))
    (tmp_path / "model.onnx.data").write_bytes(b"\0" * 2**20)
    got = gp.rss_target_mb(tmp_path, 576)
    # Qwen3-0.6B: 28 x 2 x 8 x 128 x 4 = 229,376 bytes a position
    assert got == {"weights_mb": 1.0, "kv_mb": 576 * 229_376 / 2**20, "target_mb": 1.0 + 576 * 229_376 / 2**20 + 150}


def test_gguf_tensor_names_map_to_hugging_faces_and_unknown_ones_are_refused() -> None:
    assert gp.hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert gp.hf_name("output.weight") == "lm_head.weight"
    assert gp.hf_name("blk.12.attn_output.weight") == "model.layers.12.self_attn.o_proj.weight"
    assert gp.hf_name("blk.0.ffn_norm.weight") == "model.layers.0.post_attention_layernorm.weight"
    assert gp.hf_name("blk.3.ffn_gate.weight") == "model.layers.3.mlp.gate_proj.weight"
    for bad in ("blk.x.attn_q.weight", "blk.1.attn_qkv.weight", "rope_freqs.weight"):
        with pytest.raises(ValueError, match="no Hugging Face name"):
            gp.hf_name(bad)


def test_unpermute_undoes_llama_cpps_rotary_row_permutation() -> None:
    heads, head_dim, hidden = 3, 8, 5
    w = np.arange(heads * head_dim * hidden, dtype=np.float32).reshape(heads * head_dim, hidden)
    permuted = gp.permute(w, heads)
    assert not np.array_equal(permuted, w)
    # The converter interleaves each head's two rotary halves: row 1 of a head is its half's first row.
    assert np.array_equal(permuted[1], w[head_dim // 2])
    assert np.array_equal(gp.unpermute(permuted, heads), w)


def test_negative_log_likelihood_and_perplexity() -> None:
    logits = np.log(np.array([0.5, 0.25, 0.25]))
    assert driver.log_softmax_at(logits + 100.0, 1) == pytest.approx(math.log(4))  # shift-invariant, stable
    assert gp.perplexity([math.log(4), math.log(4)]) == pytest.approx(4.0)
    assert math.isnan(gp.perplexity([]))


class _Engine:
    tokenizer = SimpleNamespace(encode=lambda text, add_special_tokens=False: SimpleNamespace(ids=text.split()))

    def greedy(self, ids: list[int], new_tokens: int) -> list[int]:
        return [ids[-1]] * new_tokens

    def nll(self, ids: list[int]) -> list[float]:
        return [0.5] * (len(ids) - 1)

    def generate(self, text: str, max_tokens: int) -> dict[str, Any]:
        return {"words": len(text.split()), "max_tokens": max_tokens}


def test_driver_answers_generation_and_quality_ops_and_refuses_others() -> None:
    engine = _Engine()
    assert driver.answer(engine, {"op": "greedy", "ids": [1, 2], "new_tokens": 3}) == {"ids": [2, 2, 2]}
    assert driver.answer(engine, {"op": "nll", "ids": [1, 2, 3]}) == {"nll": [0.5, 0.5]}
    assert driver.answer(engine, {"prompt_tokens": 7, "max_tokens": 4}) == {"words": 7, "max_tokens": 4}
    with pytest.raises(ValueError, match="valid: generate, greedy, nll"):
        driver.answer(engine, {"op": "score"})
    assert set(driver.ENGINES) == set(driver.KINDS)


def test_quantize_uses_the_binary_or_the_same_library_call(tmp_path: Path) -> None:
    binary = tmp_path / "llama-quantize"
    src, dst = tmp_path / "f32.gguf", tmp_path / "Q4_0.gguf"
    assert gp.quantize_command(src, dst, "Q8_0", binary)[0] == str(gp.LLAMA_VENV / "bin" / "python")
    code = gp.quantize_command(src, dst, "Q4_0", binary)[2]
    assert "params.ftype = 2" in code and f"{str(dst)!r}.encode()" in code
    compile(code, "quantize", "exec")  # the child's code is valid Python
    binary.write_text("")
    assert gp.quantize_command(src, dst, "Q4_0", binary) == [str(binary), str(src), str(dst), "Q4_0"]


def test_cold_variants_start_as_a_host_as_lambda_and_as_the_before_ref() -> None:
    from bench.generate import cold

    pack, before = Path("/w/pack"), Path("/w/ref-main")
    argv, env = cold.child("ours", pack, 1.7, 1, None)
    assert argv[3:] == ["ours", "--model", "/w/pack"] and "AWS_LAMBDA_INITIALIZATION_TYPE" not in env  # warms up
    env = cold.child("ours-lambda", pack, 1.7, 1, None)[1]
    assert env["AWS_LAMBDA_INITIALIZATION_TYPE"] == "on-demand" and env["AWS_LAMBDA_FUNCTION_MEMORY_SIZE"] == "3008"
    env = cold.child("before-ours-lambda", pack, 1.7, 1, before)[1]
    assert env["PYTHONPATH"].split(":")[0] == "/w/ref-main" and env["AWS_LAMBDA_INITIALIZATION_TYPE"] == "on-demand"
    assert cold.child("genai", pack, 1.7, 2, None)[0][3:] == ["genai", "--model", "/w/pack", "--threads", "2"]
    rows = [
        {"variant": v, "round": r, "load": 3.0, "cold_first_token_ms": ms, "peak_rss_mb": 700, "init": None}
        for r, (a, b) in enumerate([(1200, 1000), (900, 1000)])
        for v, ms in (("ours-lambda", a), ("genai", b))
    ]
    text = cold.markdown(rows, SimpleNamespace(vcpus=1.7, own_cpus=False, cache="warm"), ["ours-lambda", "genai"])
    assert "| ours-lambda / genai | 1.05x (0.90-1.20) |" in text and "its own" not in text
    own = cold.markdown(rows, SimpleNamespace(vcpus=1.7, own_cpus=True, cache="cold"), ["ours-lambda", "genai"])
    assert own.startswith("**1.7 vCPU** (each quota its own: cpu.shares raised), page cache cold, 2 rounds")


def test_quality_schemes_parse_to_typed_builder_options_and_refuse_others() -> None:
    args = gp.build_parser().parse_args(["quality", "--schemes", "block_size=64,block_size=128+is_symmetric=false"])
    schemes = gp.parse_schemes(args.schemes)
    assert schemes == [{"block_size": 64}, {"block_size": 128, "is_symmetric": False}]
    assert gp.scheme_name(schemes[1]) == "ours-int4 (block_size=128, is_symmetric=False)"
    assert gp.parse_schemes(gp.build_parser().parse_args(["quality"]).schemes) == []
    for bad, why in (("bits=3", "keys block_size"), ("block_size", "keys block_size"), ("block_size=big", "integer")):
        with pytest.raises(SystemExit, match=why):
            gp.parse_schemes(bad)
    with pytest.raises(SystemExit, match="true or false"):
        gp.parse_schemes("is_symmetric=yes")
    assert gp.parse_schemes("scales=mse,block_size=64+scales=rtn") == [
        {"scales": "mse"},
        {"block_size": 64, "scales": "rtn"},
    ]  # a bad value is the packer's to refuse (infra.pack.lm_pack.check_scales), before it builds anything
    with pytest.raises(
        SystemExit, match="keys block_size, accuracy_level, is_symmetric, scales, head_bits, head_block"
    ):
        gp.parse_schemes("scale=mse")
    assert gp.parse_schemes("head_bits=8+scales=mse") == [{"head_bits": 8, "scales": "mse"}]
    assert gp.parse_schemes("head_block=32") == [{"head_block": 32}]
    assert gp.scheme_name({"head_bits": 8}) == "ours-int4 (head_bits=8)"


def test_decode_matmuls_hold_every_product_of_a_qwen3_step_and_refuse_bad_schemes() -> None:
    from bench.generate import matmul

    assert matmul.parse_schemes("32/4,128/8,64/4/asym") == [(32, 4, False), (128, 8, False), (64, 4, True)]
    for bad in ("", "48/4", "32/3", "32", "64/4/zp"):
        with pytest.raises(SystemExit, match="--schemes"):
            matmul.parse_schemes(bad)
    specs = matmul.specs(head_bits=8)
    assert len(specs) == 28 * 5 + 1 and specs[-1] == ("lm_head", 1024, 151_936, 8)
    # Qwen3-0.6B's 28 layers (q/k/v fused: 2,048 + 2 x 1,024 rows) and the tied 151,936 x 1,024 LM head
    assert (
        sum(k * n for _, k, n, _ in specs)
        == 28 * (1024 * 4096 + 2048 * 1024 + 2 * 1024 * 3072 + 3072 * 1024) + 1024 * 151_936
    )
    model = matmul.graph(64, 4, layers=1, vocab=256)
    nodes = model.graph.node
    assert [n.op_type for n in nodes] == ["MatMulNBits"] * 6 and all(len(n.input) == 3 for n in nodes)
    asym = matmul.graph(64, 4, layers=1, vocab=256, asym=True)
    points = {i.name: i for i in asym.graph.initializer}["lm_head_Z"]
    assert all(len(n.input) == 4 for n in asym.graph.node) and points.dims == [256 * 8]  # 16 blocks x 4 bits
    attrs = {a.name: a.i for a in nodes[-1].attribute}
    assert attrs == {"K": 1024, "N": 256, "bits": 4, "block_size": 64, "accuracy_level": 4}


def test_decode_profile_sizes_the_shared_kv_buffer_and_sums_kernel_time_per_op() -> None:
    from bench.generate import decode_profile as profile

    assert profile.kv_shape(["batch_size", 8, "past_sequence_length", "kv_cache_dim"], 544, 128) == [1, 8, 544, 128]
    with pytest.raises(SystemExit, match="'heads'"):
        profile.kv_shape(["batch_size", "heads", "past_sequence_length", 128], 544, 128)
    events = [
        {"cat": "Node", "name": "/lm_head/MatMul_Q4_kernel_time", "dur": 30, "args": {"op_name": "MatMulNBits"}},
        {"cat": "Node", "name": "/l0/up/MatMul_Q4_kernel_time", "dur": 10, "args": {"op_name": "MatMulNBits"}},
        {"cat": "Node", "name": "/l0/attn/GQA_kernel_time", "dur": 5, "args": {"op_name": "GroupQueryAttention"}},
        {"cat": "Node", "name": "/l0/attn/GQA_fence_before", "dur": 99, "args": {"op_name": "GroupQueryAttention"}},
        {"cat": "Session", "name": "model_run", "dur": 1000},
    ]
    by_op, by_node = profile.op_totals(events)
    assert by_op == {"MatMulNBits": 40, "GroupQueryAttention": 5}
    assert by_node.most_common(1) == [("/lm_head/MatMul_Q4", 30)]


def test_optimized_runs_take_ours_from_the_packs_optimize_copy() -> None:
    args = gp.build_parser().parse_args(["speed", "--optimized", "--pairs", "int4"])
    assert args.optimized and not gp.build_parser().parse_args(["speed"]).optimized
    assert gp.build_parser().parse_args(["prepare", "--optimized"]).optimized
    assert gp.optimized_copy(Path("/w/qwen3-0.6b/ours-int4")) == Path("/w/qwen3-0.6b/ours-int4-opt")


def test_no_bench_script_shadows_a_standard_library_module() -> None:
    # A script run as `python bench/X/y.py` puts bench/X first on sys.path: a `profile.py` there replaced the
    # stdlib's `profile` under torch's imports and peers.py quality died in transformers' lazy import.
    import sys

    bench = Path(__file__).resolve().parents[2] / "bench"
    shadows = [str(p.relative_to(bench)) for p in bench.rglob("*.py") if p.stem in sys.stdlib_module_names]
    assert shadows == []
