"""Baseline memory: the same imports as warmstart's onnx path, no model. Peak RSS minus this = model cost."""

from typing import Any

import numpy  # noqa: F401
import onnxruntime  # noqa: F401
import tokenizers  # noqa: F401

import handler.runtime.invocation  # noqa: F401


def lambda_handler(event: Any, context: Any) -> Any:
    return {"ok": True}
