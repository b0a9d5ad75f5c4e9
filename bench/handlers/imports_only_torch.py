"""Baseline memory: the same imports as warmstart's torch path, no model."""

from typing import Any

import numpy  # noqa: F401
import tokenizers  # noqa: F401
import torch  # noqa: F401

import handler.backends.pytorch
import handler.runtime.invocation  # noqa: F401


def lambda_handler(event: Any, context: Any) -> Any:
    return {"ok": True}
