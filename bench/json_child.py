"""A bench child process spoken to in JSON lines: one request a line on its stdin, one answer a line on its stdout
(lines before the answer that lack `mark` are the child's own output, passed over)."""

from __future__ import annotations

import json
import subprocess
from typing import Any


class JsonChild:
    def __init__(self, argv: list[str], env: dict[str, str], mark: str = "") -> None:
        self.mark = mark
        self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def read(self) -> Any:
        assert self.proc.stdout is not None
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"bench child exited ({self.proc.wait()})")
            if line.startswith(self.mark):
                return json.loads(line[len(self.mark) :])

    def ask(self, request: dict[str, Any]) -> Any:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return self.read()

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(30)
