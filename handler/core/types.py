"""The few types shared across the shim."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    import numpy.typing as npt

JSON: TypeAlias = Any
Event: TypeAlias = Any  # what the runtime client hands us: a decoded JSON value, or raw bytes when not JSON
LambdaResponse: TypeAlias = dict[str, Any]
Arrays: TypeAlias = dict[str, "npt.NDArray[Any]"]
