"""The operators a torch program may call (handler.backends.program): an allowlist, the one table both the pack
(infra/pack/torch_program.py, which never writes a program outside it) and the interpreter (which refuses one
at load, `ProgramError` naming the operator) read.

Derived from what torch.export (torch 2.13) emits for every family and task the project packs: the tiny models
of tests/tiny_models.py for all 13 families as embedders (mean, max + Dense + Normalize, last-token, CLS),
rerankers and single/multi-label classifiers, float16/bfloat16 packs, the default model (MiniLM), and the
image-text towers of tests/image_models.py (CLIP, SigLIP, SigLIP2's NaFlex vision tower: its position-embedding
resize and masked attention-pooling head; tests/functional/test_image_text.py packs them);
tests/functional/test_program_ops.py packs them again and fails naming any operator outside the table
(`python -m tests.functional.test_program_ops` lists them). Each entry was reviewed:

- every one is functional: it returns a new tensor, or a view of / the same tensor as its input (ALIASING),
  and writes to no argument. No in-place operator (`*_`), no `out=` overload, no `*_unsafe`, no sparse
  constructor or `_to_dense`, nothing that reads a file. The exporter emits two in-place operators (MPNet and
  DeBERTa: `add_` on a fresh sum, `detach_` on a fresh copy); the pack rewrites each to its functional twin
  where that is exact (`functional_twin`), so no program runs an in-place operator: the mapped weights and the
  request's input buffers, aliased by the views, are only ever read.
- SIZED operators allocate a size the program computes: their result's element count is bounded at run time
  (program.size_limit) before they run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

# Integer arithmetic on sizes (`sym_size` results): Python's operators, results bounded by program.MAX_INT.
INT_OPS = ("_operator.add", "_operator.sub", "_operator.mul", "_operator.floordiv", "_operator.mod", "_operator.neg")

# May return its input, or a view of it (no new memory): fine to read, never written (nothing here writes).
ALIASING = frozenset(
    "torch.ops.aten." + name
    for name in (
        "_assert_tensor_metadata.default",  # returns None: a check the pack's shapes held
        "alias.default",
        "chunk.default",
        "contiguous.default",
        "detach.default",
        "dropout.default",  # train=False in an inference program: its input
        "expand.default",
        "expand_as.default",
        "flatten.using_ints",  # the vision towers' patch grid to a sequence (a view where it can be)
        "permute.default",
        "reshape.default",
        "select.int",
        "slice.Tensor",
        "split_with_sizes.default",  # SigLIP's attention-pooling head (nn.MultiheadAttention's in-projection)
        "squeeze.dim",
        "sym_size.int",  # a Python int
        "to.device",
        "to.dtype",
        "to.dtype_layout",  # layouts: strided only (program.LAYOUTS)
        "transpose.int",
        "type_as.default",
        "unbind.int",
        "unflatten.int",  # SigLIP's attention-pooling head (a view)
        "unsqueeze.default",
        "view.default",
    )
)

# Always a new tensor. Shape from their inputs, except the SIZED ones.
FRESH = frozenset(
    "torch.ops.aten." + name
    for name in (
        "__and__.Tensor",
        "abs.default",
        "add.Tensor",
        "amax.default",
        "arange.default",
        "argmax.default",
        "baddbmm.default",  # SigLIP2's pooling head: nn.MultiheadAttention's scores plus its key padding mask
        "bitwise_not.default",
        "bmm.default",
        "cat.default",
        "ceil.default",
        "clamp.default",
        "clamp_min.default",
        "conv2d.default",  # CLIP's patch embedding (a strided Conv2d): output bounded by input x weight
        "conv2d.padding",  # SigLIP's (padding="valid", a string)
        "cos.default",
        "cumsum.default",
        "div.Tensor",
        "div.Tensor_mode",  # SigLIP2's position-embedding resize: each patch's row (floor division) in its grid
        "embedding.default",
        "eq.Scalar",
        "full_like.default",
        "gather.default",
        "ge.Scalar",
        "gelu.default",
        "gt.Scalar",
        "index.Tensor",
        "layer_norm.default",
        "le.Scalar",
        "le.Tensor",
        "lift_fresh_copy.default",
        "linalg_vector_norm.default",
        "linear.default",
        "log.default",
        "log1p.default",
        "lt.Scalar",
        "lt.Tensor",  # SigLIP2's resize: which positions are inside each image's grid
        "masked_fill.Scalar",
        "matmul.default",
        "max.dim",
        "mean.dim",
        "min.other",
        "mul.Tensor",
        "ne.Scalar",
        "neg.default",
        "ones_like.default",
        "new_ones.default",
        "pow.Tensor_Scalar",
        "prod.dim_int",  # SigLIP2's resize: each image's patch count (rows x cols)
        "reciprocal.default",  # SigLIP2's resize: the scale of each grid (positions / rows, positions / cols)
        "relu.default",
        "repeat.default",
        "rsqrt.default",
        "rsub.Scalar",
        "scaled_dot_product_attention.default",
        "sigmoid.default",
        "sign.default",
        "silu.default",
        "sin.default",
        "softmax.int",
        "sqrt.default",
        "sub.Tensor",
        "sum.dim_IntList",
        "tanh.default",
        "where.ScalarOther",
        "where.self",
        "zeros.default",
        "zeros_like.default",
    )
)

ALLOWED = ALIASING | FRESH


def _prod(sizes: Sequence[Any]) -> int:
    return math.prod(max(0, int(s)) for s in sizes)


def _expanded(args: Sequence[Any]) -> int:
    self, size = args[0], list(args[1])
    offset = len(size) - self.dim()
    # -1 keeps the input's own size in that dimension
    return _prod([self.shape[i - offset] if s == -1 and i >= offset else s for i, s in enumerate(size)])


# Operator → the element count its result will have, from its arguments (positional, as the program passes
# them): checked against the run's bound before it runs. A size-from-arguments operator not listed here is
# not in ALLOWED (tests/unit/test_program.py checks every ALLOWED schema with a SymInt[] or Scalar end is).
SIZED: Mapping[str, Callable[[Sequence[Any]], int]] = {
    "torch.ops.aten.arange.default": lambda a: max(0, math.ceil(float(a[0]))),
    "torch.ops.aten.zeros.default": lambda a: _prod(a[0]),
    "torch.ops.aten.new_ones.default": lambda a: _prod(a[1]),
    "torch.ops.aten.expand.default": _expanded,
    "torch.ops.aten.repeat.default": lambda a: int(a[0].numel()) * _prod(a[1]),
}


def functional_twin(target: str) -> str | None:
    """The allowed functional operator an in-place `target` (`aten.add_.Tensor`) computes the value of, or None
    (not in-place, or no allowed twin)."""
    prefix = "torch.ops.aten."
    if not target.startswith(prefix):
        return None
    name, _, overload = target[len(prefix) :].partition(".")
    if not name.endswith("_") or name.startswith("__"):
        return None
    twin = f"{prefix}{name[:-1]}.{overload}"
    return twin if twin in ALLOWED else None
