"""The torch program interpreter's allowlist (handler/backends/program_ops.py) against what packs contain: every
family the project packs, as an embedder (mean, max with a Dense module and Normalize, last-token, CLS pooling),
a reranker and a classifier (single- and multi-label), float32, plus reduced dtypes, packed with `pack_from`
(torch only) from tests/tiny_models.py. A family that starts emitting an operator outside the table fails here,
naming the operator, not at a user's init (and its pack refuses it: infra/pack/torch_program.py).

Regenerate the table's candidates (then review each new operator before it goes in):
    PYTHONPATH=. .venv/bin/python -m tests.functional.test_program_ops [family ...]
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from handler.backends import program_ops
from tests.tiny_models import ALL_FAMILIES, make_model_dir

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning", "ignore::UserWarning")

TANH = "torch.nn.modules.activation.Tanh"
# (kind, make_model_dir options, pack dtype): the heads and poolings that put different operators in a program.
VARIANTS: tuple[tuple[str, dict[str, Any], str], ...] = (
    ("sentence-transformers", {"pooling": "mean"}, "float32"),
    ("sentence-transformers", {"pooling": "max", "normalize": True, "dense": [(24, TANH)]}, "float32"),
    ("sentence-transformers", {"pooling": "lasttoken"}, "float32"),
    ("sentence-transformers", {"pooling": "cls"}, "float32"),
    ("cross-encoder", {}, "float32"),
    ("classifier", {}, "float32"),
    ("classifier", {"problem_type": "multi_label_classification"}, "float32"),
)
REDUCED: tuple[tuple[str, dict[str, Any], str], ...] = (
    ("sentence-transformers", {"pooling": "mean"}, "float16"),
    ("classifier", {}, "bfloat16"),
)


def program_targets(root: Path, family: str, kind: str, options: dict[str, Any], dtype: str) -> set[str]:
    """The call targets of the program `pack_from` writes for this tiny model (torch only)."""
    from infra.pack.hf_pack import pack_from
    from infra.pack.precision import Precision

    src = make_model_dir(root, family, kind, max_seq_length=18, **options)
    precision = Precision(dtype=dtype, min_quality=0.0) if dtype != "float32" else None
    out = pack_from(src, root / "packed", backends=["torch"], precision=precision)
    raw = json.loads((out / "program.json").read_text())
    return {node["target"] for node in raw["graph_module"]["graph"]["nodes"]}


def survey(
    families: tuple[str, ...] = ALL_FAMILIES,
    *,
    variants: tuple[tuple[str, dict[str, Any], str], ...] = VARIANTS,
    reduced: bool = True,
) -> dict[str, set[str]]:
    """Target → the packs (family/kind/options/dtype) whose program holds it."""
    found: dict[str, set[str]] = {}
    for family in families:
        for kind, options, dtype in variants + (REDUCED if reduced else ()):
            with tempfile.TemporaryDirectory() as tmp:
                targets = program_targets(Path(tmp), family, kind, options, dtype)
            for target in targets:
                found.setdefault(target, set()).add(f"{family}/{kind}/{options}/{dtype}")
    return found


# Every variant for one encoder and one decoder family; the others with one embedder and their own heads
# (pooling, Dense and Normalize are sentence-transformers modules, the same operators whatever the family;
# a head is the family's own code). The full survey (the regeneration command above) runs every variant.
FULL = ("bert", "qwen3")
HEADS = tuple(v for v in VARIANTS if v[0] != "sentence-transformers" and not v[1]) + VARIANTS[:1]


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_every_operator_a_family_packs_is_in_the_table(family: str) -> None:
    """pack_from refuses a program with an operator outside the table, so a new one shows as a pack error here."""
    full = family in FULL
    found = survey((family,), variants=VARIANTS if full else HEADS, reduced=full)
    assert set(found) <= program_ops.ALLOWED | set(program_ops.INT_OPS)


def test_the_default_models_program_is_in_the_table(model_dir: Path) -> None:
    raw = json.loads((model_dir / "program.json").read_text())
    assert {n["target"] for n in raw["graph_module"]["graph"]["nodes"]} <= program_ops.ALLOWED


if __name__ == "__main__":
    chosen = tuple(sys.argv[1:]) or ALL_FAMILIES
    table = survey(chosen)
    for target in sorted(table):
        new = "" if target in program_ops.ALLOWED or target in program_ops.INT_OPS else "  # NEW: review"
        print(f"{target!r},  # {len(table[target])} packs{new}")
