"""The few types shared across the shim."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    from typing import Protocol as Protocol

    import numpy.typing as npt
else:
    # A protocol is a plain base class at run time: nothing checks one then (no isinstance, no runtime_checkable),
    # and typing.Protocol's class machinery cost ~0.14 M instructions a class, nine of them on a Lambda start's
    # path (callgrind, docs/benchmarks.md). mypy sees typing.Protocol: the structural checks are all its own.
    Protocol = object

JSON: TypeAlias = Any
Event: TypeAlias = Any  # what the runtime client hands us: a decoded JSON value, or raw bytes when not JSON
LambdaResponse: TypeAlias = dict[str, Any]
Arrays: TypeAlias = dict[str, "npt.NDArray[Any]"]
