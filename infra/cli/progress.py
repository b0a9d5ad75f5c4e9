"""What a waiting user sees while pack, optimize and quantize run: on a terminal one tqdm line on stderr that
names the phase and ticks its elapsed time, cleared at the end; otherwise (a log, CI, a pipe) one plain line
per phase on stdout as it ends, with its seconds. The summary a command ends with is its own (`summary_lines`)."""

from __future__ import annotations

import sys
import threading
import time
from types import TracebackType
from typing import Any, TextIO

from infra.pack.progress import listening


class Progress:
    """A listener for infra.pack.progress: `with Progress("warmstart pack"): ...`."""

    def __init__(self, command: str, stream: TextIO | None = None, plain: bool = True) -> None:
        """On a terminal (`stream`, default stderr): the tqdm line there. Otherwise, unless `plain` is false
        (--json: stdout is the one object), plain lines on stdout, before the summary: a refusal's message stays
        the only line on stderr."""
        self.command = command
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.plain = plain
        self.start = time.monotonic()
        self._bar: Any = None
        self._stop = threading.Event()
        self._listening = listening(self)
        self._phase: tuple[str, float] | None = None

    def _ended(self) -> None:
        """A plain line for the phase that just ended, printed at its end: a refusal during the checks (the first
        phase) is then the only line a user reads."""
        if self._phase is not None and self.plain:
            text, began = self._phase
            try:
                print(f"{self.command}: {text}: {time.monotonic() - began:.1f} s", flush=True)
            except BrokenPipeError:  # `warmstart pack ... | head -1`: nobody reads on; the work itself goes on
                self.plain = False

    def __call__(self, text: str) -> None:
        if not self.tty:
            self._ended()
            self._phase = (text, time.monotonic())
            return
        if self._bar is None:
            # tqdm: already installed with the pack tools (transformers requires it); loaded only on a terminal.
            from tqdm import tqdm  # type: ignore[import-untyped]

            self._bar = tqdm(total=None, bar_format="{desc} [{elapsed}]", file=self.stream, leave=False)
            threading.Thread(target=self._tick, daemon=True).start()  # elapsed time moves inside a long phase
        self._bar.set_description_str(f"{self.command}: {text}")

    def failed(self) -> None:
        """The command refused: its message is what the user reads, with no line for the phase it ended."""
        self._phase = None

    def _tick(self) -> None:
        while not self._stop.wait(0.5):
            self._bar.refresh()

    def __enter__(self) -> Progress:
        self._listening.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self._listening.__exit__(kind, error, tb)
        if error is None:
            self._ended()
        self._stop.set()
        if self._bar is not None:
            self._bar.close()

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.start


def human_size(size: int) -> str:
    value = float(size)
    for unit in ("B", "KB", "MB"):
        if value < 1000:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.2f} GB"
