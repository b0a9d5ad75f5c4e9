"""A model whose answers are NaN or infinite is refused by `pack --from` in one line, never packed and never a
traceback (found by test_pack_fuzz: a corrupted model.safetensors): the eager model on the probes, the exported
program's check, and the golden requests each refuse it."""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from handler.core.errors import ModelOutputError
from infra.cli import main
from infra.pack import golden
from infra.pack.hf_export import ExportError
from infra.pack.torch_program import ProgramExportError, _check
from tests.tiny_models import make_model_dir


def test_weights_that_give_nan_are_refused_in_one_line(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    src = make_model_dir(tmp_path / "src", "bert", "sentence-transformers", normalize=True)
    weights = next(src.rglob("model.safetensors"))
    tensors = load_file(weights)
    name = next(k for k in tensors if k.endswith("LayerNorm.weight"))
    tensors[name] = torch.full_like(tensors[name], float("nan"))
    save_file(tensors, weights)
    out = tmp_path / "models" / "packed"
    out.parent.mkdir()
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(["pack", "--from", str(src), "--out", str(out), "--backends", "torch"])
    lines = err.getvalue().splitlines()
    assert rc == 1 and len(lines) == 1, err.getvalue()
    assert lines[0].startswith("warmstart pack: ") and "not finite" in lines[0], lines[0]
    assert not out.exists() and os.listdir(out.parent) == []


def test_the_program_check_refuses_nan_on_any_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """NaN on the second probe only: `max(0.0, nan)` is 0.0, which passed the check before."""
    want = [torch.ones(2, 3), torch.ones(2, 3)]
    answers = iter([torch.ones(2, 3), torch.full((2, 3), float("nan"))])
    monkeypatch.setattr("handler.backends.program.load", lambda path, tensors: lambda *feed: [next(answers)])
    with pytest.raises(ProgramExportError, match="differs from the model by nan"):
        _check(b"{}", {}, [(torch.zeros(1),), (torch.zeros(1),)], want)


def test_a_golden_request_the_packed_model_cannot_answer_refuses_the_pack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from handler.runtime.invocation import Runtime

    class NaNAnswers:
        def serve(self, request: Any) -> Any:
            raise ModelOutputError("the model's vectors: 3 of 6 values are NaN or infinite")

    monkeypatch.setattr(Runtime, "start", staticmethod(lambda *args, **kwargs: NaNAnswers()))
    with pytest.raises(ExportError, match=r"cannot answer golden request 1 of 2: the model's vectors: 3 of 6"):
        golden.record(tmp_path, {"task": "embedding"})
