"""`make gpu-check` (infra/cli/gpu_check.py): without a GPU it says so and exits 0; its rows run the real init,
inference and snapshot-restore re-check (here on the CPU, as `--device cpu` does); its table says why a row did not
run."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODULE = "infra.cli.gpu_check"  # `make gpu-check` runs `python -m infra.cli.gpu_check`


@pytest.fixture(scope="module")
def gpu_check() -> ModuleType:
    return importlib.import_module(MODULE)


def test_without_a_gpu_it_says_why_and_exits_0() -> None:
    from handler.backends.device import probe_cuda

    probe = probe_cuda("auto")
    if probe.usable:  # on a GPU machine the script runs the table instead; the no-GPU answer is the CPU machines'
        pytest.fail("this test describes machines without a GPU; run `make gpu-check` here instead")
    done = subprocess.run([sys.executable, "-m", MODULE], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    assert "no usable NVIDIA GPU here" in done.stdout and probe.reason in done.stdout


@pytest.mark.parametrize("backend", ["onnx", "torch"])
def test_a_row_runs_init_inference_and_the_restore_recheck(gpu_check: ModuleType, backend: str) -> None:
    row = gpu_check.run_row(backend, ROOT / "models" / "default", "cpu", 2)
    assert row["device"] == "cpu" and row["reason"] == "WARMSTART_DEVICE=cpu"
    for key in ("b1_first_ms", "b1_steady_ms", "b32_first_ms", "b32_steady_ms"):
        assert row[key] > 0
    assert row["restore_device"] == {"cuda": False, "reason": "WARMSTART_DEVICE=cpu"}
    assert row["after_restore_ok"] is True
    assert len(row["answers"]) == len(gpu_check.TEXTS) and len(row["answers"][0]) == 384


def test_the_table_says_why_a_row_did_not_run(gpu_check: ModuleType) -> None:
    rows = [
        {"backend": "onnx", "dtype": "float32", "device": "cuda", "init_ms": 900.0, "cosine": 0.9999991,
         "restore_device": {"cuda": True, "reason": "1 CUDA device(s)"}, "after_restore_ok": True},
        {"backend": "torch", "dtype": "float32", "device": "cpu",
         "reason": "1 CUDA device(s), but this torch build has no CUDA",
         "restore_device": {"refused": "the snapshot used CUDA but after restore: no device"}},
        {"backend": "onnx", "dtype": "float16", "error": "pack --dtype float16 refused: no float16 kernels"},
    ]  # fmt: skip
    lines = gpu_check.table(rows).splitlines()
    assert "| 0.999999 | cuda=True, serves |" in lines[2]
    assert "refused: the snapshot used CUDA but after restore: no device" in lines[3]
    assert "not run: pack --dtype float16 refused: no float16 kernels" in lines[4]
    assert "- not on the GPU: torch: 1 CUDA device(s), but this torch build has no CUDA" in lines


def test_min_cosine_finds_the_worst_answer(gpu_check: ModuleType) -> None:
    ref = [[1.0, 0.0], [0.0, 1.0]]
    assert gpu_check.min_cosine(ref, ref) == pytest.approx(1.0)
    assert gpu_check.min_cosine([[1.0, 0.0], [1.0, 1.0]], ref) == pytest.approx(2**-0.5)


def test_the_generation_rows_say_why_they_did_not_run(gpu_check: ModuleType, tmp_path: Path) -> None:
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.fail("this test describes machines without vllm; run `make gpu-check` with a vllm pack instead")
    assert "vllm is not installed (the GPU image's vllm stage" in gpu_check.lm_unavailable(tmp_path)
    cell = gpu_check.lm_table({"model": "m", "error": "vllm is not installed"}).splitlines()[2]
    assert cell.startswith("| m | not run: vllm is not installed |")


def test_a_generation_row_runs_first_token_tokens_per_s_and_a_restore(
    gpu_check: ModuleType, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The row's own code on the vllm backend over the fake vllm (tests/fixtures/fake_vllm.py): what it measures
    and the sleep / wake it drives; on a GPU the same code runs on vLLM itself."""
    from handler.backends.device import CudaProbe
    from tests.fixtures import fake_vllm

    pack = fake_vllm.vllm_pack(tmp_path_factory.mktemp("vllm"))
    fake_vllm.install(monkeypatch)
    monkeypatch.setattr("handler.models.loader.probe_cuda", lambda mode="auto": CudaProbe(True, "fake", ["Fake"]))
    assert gpu_check.lm_unavailable(pack) == ""  # vllm importable, the pack has the backend
    row = gpu_check.run_lm_row(pack, 2)
    llm = fake_vllm.ENGINES[-1]
    assert llm.args.enable_sleep_mode and llm.calls[:2] == ["sleep(1)", "wake_up"]
    assert row["restored"] is True and row["sleep_ms"] >= 0 and row["wake_ms"] >= 0
    for key in ("first_token_ms", "steady_first_token_ms", "after_wake_first_token_ms", "tokens_per_s"):
        assert row[key] > 0, key
    assert row[f"tokens_per_s_{gpu_check.LM_STREAMS}"] > 0 and row["load_ms"] is not None
    assert row["device"] == "cuda" and 0 < row["prompt_tokens"] <= gpu_check.LM_PROMPT_TOKENS
    assert len(llm.requests) >= 3 + gpu_check.LM_STREAMS + 3  # warm-up, first tokens, decodes, after the wake
    assert "| cuda |" in gpu_check.lm_table(row)
    assert row["greedy_vs_genai"] == "no genai backend in the pack to compare with"


def test_prefix_share_counts_until_the_first_difference(gpu_check: ModuleType) -> None:
    assert gpu_check.prefix_share([1, 2, 3, 4], [1, 2, 3, 4]) == 1.0
    assert gpu_check.prefix_share([1, 2, 9, 4], [1, 2, 3, 4]) == 0.5  # the same 4th token after a miss: no credit
    assert gpu_check.prefix_share([1, 2], [1, 2, 3, 4]) == 0.5  # an answer that stopped early: over the longer
    assert gpu_check.prefix_share([], []) == 1.0 and gpu_check.prefix_share([], [5]) == 0.0
