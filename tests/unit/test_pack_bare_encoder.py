"""`warmstart pack --from DIR --task embedding --pooling mean|cls|lasttoken` on a bare Hugging Face encoder directory
(config.json + weights + tokenizer, no modules.json; issue 37 item 12): the packed graph equals transformers'
AutoModel + that pooling + L2 normalization, and the refusals say how to fix the command."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from infra.pack.hf_checks import SourceError
from infra.pack.hf_pack import pack_from
from infra.pack.hf_source import UnsupportedModelError, read_source
from tests.conftest import ROOT
from tests.tiny_models import make_model_dir
from tests.unit.test_pack_from import TEXTS, Packed

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")
FIX = "add --task embedding --pooling mean (or cls)"


def bare_bert(tmp_path: Path) -> Path:
    """A plain BertModel directory as `BertModel.save_pretrained` + the tokenizer's save leave it."""
    src = make_model_dir(tmp_path, "bert", "sentence-transformers", max_seq_length=24)
    for name in ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json"):
        (src / name).unlink(missing_ok=True)
    for folder in src.glob("[0-9]_*"):
        shutil.rmtree(folder)
    return src


def reference(src: Path, mode: str) -> npt.NDArray[np.float32]:
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(src), local_files_only=True)
    model = transformers.AutoModel.from_pretrained(str(src), local_files_only=True).eval()
    batch = tokenizer(TEXTS, padding=True, truncation=True, max_length=24, return_tensors="pt")
    with torch.no_grad():
        tokens = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    if mode == "mean":
        pooled = (tokens * mask).sum(1) / mask.sum(1)
    elif mode == "cls":
        pooled = tokens[:, 0]
    else:  # lasttoken: right padding, the last real token
        pooled = tokens[torch.arange(len(TEXTS)), batch["attention_mask"].sum(1) - 1]
    out: npt.NDArray[np.float32] = torch.nn.functional.normalize(pooled, dim=-1).numpy()
    return out


@pytest.mark.parametrize("mode", ["mean", "cls", "lasttoken"])
def test_bare_encoder_packs_with_pooling_equal_to_automodel(tmp_path: Path, mode: str) -> None:
    src = bare_bert(tmp_path / "src")
    out = pack_from(src, tmp_path / "packed", task="embedding", pooling=mode, backends=["onnx"], fuse=False)
    got, want = Packed(out).run(TEXTS), reference(src, mode)
    assert got.shape == want.shape == (len(TEXTS), 32)
    assert np.abs(got - want).max() <= 1e-4
    assert Packed(out).manifest["pooling"] == {"mode": mode, "normalize": True, "in_graph": True}


def test_the_pooling_is_part_of_the_version(tmp_path: Path) -> None:
    src = bare_bert(tmp_path)
    mean, cls = (read_source(src, "embedding", m).content_sha256 for m in ("mean", "cls"))
    assert mean != cls


def test_a_bare_encoder_without_pooling_is_refused_with_the_fix(tmp_path: Path) -> None:
    src = bare_bert(tmp_path)
    for task in ("auto", "embedding"):
        with pytest.raises(UnsupportedModelError, match=re.escape(FIX)):
            read_source(src, task)


def test_pooling_outside_its_set_or_its_use_is_refused(tmp_path: Path) -> None:
    src = bare_bert(tmp_path / "bare")
    with pytest.raises(SourceError, match=r"pooling 'splade'; valid: mean, cls, lasttoken"):
        read_source(src, "embedding", "splade")
    with pytest.raises(SourceError, match=r"--pooling mean is for --task embedding"):
        read_source(src, "auto", "mean")
    st = make_model_dir(tmp_path / "st", "bert", "sentence-transformers")
    with pytest.raises(UnsupportedModelError, match=r"sets its pooling in modules.json: leave --pooling out"):
        read_source(st, "embedding", "cls")


def test_cli_as_a_user_reads_it(tmp_path: Path) -> None:
    src = bare_bert(tmp_path / "src")

    def pack(*extra: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "infra.cli", "pack", "--from", str(src), "--out", str(tmp_path / "out"), *extra]
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)

    for extra in ((), ("--task", "embedding")):
        done = pack(*extra)
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
        first = done.stderr.splitlines()[0]
        assert first.startswith("warmstart pack: ") and FIX in first, first
    done = pack("--task", "embedding", "--pooling", "max")
    assert done.returncode == 2 and re.search(r"--pooling: invalid choice: 'max' \(choose from '?mean'?, ", done.stderr)
    done = pack("--pooling", "mean")
    assert done.returncode == 2 and "use it with --from DIR --task embedding" in done.stderr.splitlines()[0]
    assert not (tmp_path / "out").exists()
