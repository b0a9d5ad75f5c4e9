"""Pack-time phases, told to whoever listens (the CLI's progress display) and never printed here: the packers
also run inside tests and benches, which want no output."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

Listener = Callable[[str], None]
_listeners: list[Listener] = []


def phase(text: str) -> None:
    """A phase starts: `text` is a short phrase ("exporting the ONNX graph")."""
    for listener in _listeners:
        listener(text)


@contextmanager
def listening(listener: Listener) -> Iterator[None]:
    _listeners.append(listener)
    try:
        yield
    finally:
        _listeners.remove(listener)
