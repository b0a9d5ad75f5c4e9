"""infra.pack.lm_int4's arithmetic against onnxruntime's own int4 quantizer (the one onnxruntime-genai's builder
calls): the same byte layout, round-to-nearest recognised as the builder's, searched scales of less error."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from infra.pack import lm_int4


def _ort_blocks(weight: Any, block: int = 32) -> lm_int4.Blocks:
    """onnxruntime's symmetric int4 blocks of `weight` [N, K] (MatMulNBits' B and scales), as the builder writes
    them: its quantizer takes the MatMul's [K, N] weight."""
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        DefaultWeightOnlyQuantizer,
    )

    config = DefaultWeightOnlyQuantConfig(block_size=block, is_symmetric=True, accuracy_level=4)
    packed, scales, _ = DefaultWeightOnlyQuantizer(config).qbits_block_quant(np.ascontiguousarray(weight.T))
    n = weight.shape[0]
    return lm_int4.Blocks(packed.reshape(n, -1, block // 2), scales.reshape(n, -1), block, weight.shape[1])


def _weight(n: int = 48, k: int = 96, seed: int = 0) -> Any:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, k)) * rng.uniform(0.01, 0.2, size=(n, 1))).astype(np.float32)


@pytest.mark.parametrize("k", [96, 80])  # 80: the last block padded with zeros
def test_round_to_nearest_is_onnxruntimes_byte_for_byte(k: int) -> None:
    w = _weight(k=k)
    w[0, :32] = np.linspace(0.5, -0.5, 32)  # both ends one magnitude (a dequantized GGUF's grid): MLAS takes the min
    ort, ours = _ort_blocks(w), lm_int4.quantize(w, 32, "rtn")
    assert np.array_equal(ours.scales, ort.scales)
    assert np.array_equal(ours.codes, ort.codes)
    assert np.allclose(lm_int4.dequantize(ours), lm_int4.dequantize(ort))


@pytest.mark.parametrize("k", [96, 80])
def test_the_builders_blocks_are_recognised_and_other_sources_are_not(k: int) -> None:
    w = _weight(k=k)
    built = _ort_blocks(w)
    assert lm_int4.is_rtn_of(built, w)
    assert not lm_int4.is_rtn_of(built, _weight(seed=1))  # another tensor of the same shape
    assert not lm_int4.is_rtn_of(built, w[::-1])  # the rows in another order
    assert not lm_int4.is_rtn_of(built, w[:, :64])  # another shape
    nudged = w.copy()
    small = int(np.abs(w[3, :32]).argmin())  # one weight a whole step up: the block's scale unchanged, one code off
    nudged[3, small] += abs(float(built.scales[3, 0]))
    assert not lm_int4.is_rtn_of(built, nudged)


def test_searched_scales_never_lose_to_round_to_nearest_and_win_overall() -> None:
    w = _weight(n=256, k=256)
    x = lm_int4.blocks_of(w, 32)
    rq, rd = lm_int4.rtn_blocks(x)
    mq, md = lm_int4.mse_blocks(x)
    rtn_err = ((x - rq * rd[:, None]) ** 2).sum(1)
    mse_err = ((x - mq * md[:, None]) ** 2).sum(1)
    assert np.all(mse_err <= rtn_err * (1 + 1e-12))
    assert mse_err.sum() < 0.92 * rtn_err.sum()  # Gaussian blocks: ~12% less squared error
    assert mq.min() >= -8 and mq.max() <= 7 and np.array_equal(mq, np.round(mq))
    ours = lm_int4.quantize(w, 32, "mse")  # packed: what MatMulNBits computes with is the searched blocks
    assert np.allclose(lm_int4.dequantize(ours), (mq * md[:, None]).reshape(w.shape), atol=1e-6)
    with pytest.raises(ValueError, match="valid: rtn, mse"):
        lm_int4.quantize(w, 32, "absmax")


def test_node_names_map_to_the_checkpoints_tensors() -> None:
    qkv = lm_int4.candidates("/model/layers.3/attn/qkv_proj/MatMul_Q4")
    assert qkv[0] == [f"model.layers.3.self_attn.{p}_proj.weight" for p in "qkv"]
    assert qkv[1] == ["model.layers.3.self_attn.qkv_proj.weight"]
    assert lm_int4.candidates("/model/layers.0/mlp/down_proj/MatMul_Q4") == [["model.layers.0.mlp.down_proj.weight"]]
    assert lm_int4.candidates("/lm_head/MatMul_Q4") == [["lm_head.weight"], ["model.embed_tokens.weight"]]
    assert lm_int4.candidates("/model/layers.0/mlp/up_proj/MatMul_Q4") == [
        ["model.layers.0.mlp.up_proj.weight"],
        ["model.layers.0.mlp.gate_up_proj.weight#1/2"],  # Phi-3's fused rows, split by the builder
    ]
    assert lm_int4.candidates("/model/layers.0/mlp/unknown/MatMul_Q4") == []


@pytest.mark.parametrize("k", [96, 80])
def test_eight_bit_blocks_of_onnxruntime_are_recognised_and_others_are_not(k: int) -> None:
    """The 8-bit LM head's proof (infra.pack.lm_head): onnxruntime's symmetric 8-bit blocks (the builder's
    `last_matmul:int8` head) are round-to-nearest of their source at half 128, one code a byte."""
    from onnxruntime.capi._pybind_state import quantize_matmul_8bits

    w = _weight(k=k)
    n, blocks = w.shape[0], -(-k // 32)
    padded = np.pad(w.T, ((0, blocks * 32 - k), (0, 0)))
    codes = np.zeros((n, blocks, 32), dtype=np.uint8)
    scales = np.zeros((n, blocks), dtype=np.float32)
    zero = np.zeros((n, blocks), dtype=np.uint8)
    quantize_matmul_8bits(codes, np.ascontiguousarray(padded), scales, zero, 32, n, k, True)
    built = lm_int4.Blocks(codes, scales, 32, k, 8)
    assert built.half == 128 and lm_int4.is_rtn_of(built, w)
    assert np.abs(lm_int4.dequantize(built) - w).max() <= np.abs(scales).max()  # within a step of 8 bits
    assert not lm_int4.is_rtn_of(built, _weight(k=k, seed=1))
    as_four = lm_int4.Blocks(codes, scales, 32, k)  # the same bytes read as 4-bit blocks: not the source's
    assert not lm_int4.is_rtn_of(as_four, w)
    nudged = w.copy()
    nudged[3, int(np.abs(w[3, :32]).argmin())] += abs(float(scales[3, 0]))
    assert not lm_int4.is_rtn_of(built, nudged)
