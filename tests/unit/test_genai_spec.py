"""The genai backend's spec: an engine (needs "request"), found by name, light to import (the prefetch reads it
before numpy), its libraries found on disk for the prefetch, and refused for a task that gives arrays."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from handler.backends.contract import IncompatibleBackendError, check_pairing
from handler.backends.registry import spec
from handler.runtime.prefetch import _libraries, numpy_at_start
from tests.conftest import ROOT


def test_genai_is_an_engine_found_by_name() -> None:
    genai = spec("genai")
    assert genai.needs == "request" and genai.module == "handler.backends.genai"
    check_pairing("generate", ("request",), genai)
    with pytest.raises(IncompatibleBackendError, match="backend 'genai' needs request"):
        check_pairing("embedding", ("arrays",), genai)


def test_its_spec_imports_nothing_heavy() -> None:
    code = (
        "import json, sys\nfrom handler.backends.registry import spec\nspec('genai')\n"
        "heavy = ('onnxruntime_genai', 'onnxruntime', 'numpy', 'llguidance')\n"
        "print(json.dumps([m for m in heavy if m in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_a_genai_start_leaves_numpy_out_and_any_other_or_unknown_backend_imports_it() -> None:
    assert spec("genai").numpy is False and numpy_at_start("genai") is False
    assert numpy_at_start("onnx") is True and numpy_at_start("torch") is True
    assert numpy_at_start("no-such-backend") is True  # init reports the name; the start imports as before


def test_the_prefetch_finds_its_libraries() -> None:
    names = [p.name for p in _libraries("genai")]
    assert not any(n.startswith("_multiarray_umath") for n in names), names  # no numpy to read ahead
    assert any(n.startswith("onnxruntime_genai.") and n.endswith(".so") for n in names), names
    assert "libonnxruntime-genai.so" in names
    assert any(n.startswith("libonnxruntime.so") for n in names), names
