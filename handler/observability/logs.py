"""Structured JSON logs with Powertools' key names, and the facts of the invocation being served.

Every line warmstart writes is one JSON object with `level`, `timestamp` (RFC 3339, UTC) and `message`; inside
an invocation also `function_request_id`, `xray_trace_id`, `cold_start` and `model` (the keys Powertools for
AWS Lambda writes, so dashboards and Logs Insights queries built for it work unchanged).

Lambda's log-level filtering (`AWS_LAMBDA_LOG_LEVEL`, JSON log format) reads the `level` and `timestamp` of
each stdout line and treats a line without them as INFO: records that must never be filtered out (the init,
snapshot and restore reports, the EMF metric lines) are written at `keep_level()`: INFO, or the function's
threshold when that is higher. Ordinary log records (`logging.getLogger("warmstart")`) are filtered as usual.

Only the standard library: this module is on the init import chain.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

LOGGER = "warmstart"
# Lambda's level names (AWS_LAMBDA_LOG_LEVEL) and the Python level each maps to.
LEVELS = {"TRACE": 5, "DEBUG": 10, "INFO": 20, "WARN": 30, "ERROR": 40, "FATAL": 50}
_PYTHON_ALIASES = {"WARNING": "WARN", "CRITICAL": "FATAL"}
_NAMES = {10: "DEBUG", 20: "INFO", 30: "WARN", 40: "ERROR", 50: "FATAL"}


def threshold(environ: Mapping[str, str] | None = None) -> str:
    """The function's log level: WARMSTART_LOG_LEVEL, else Lambda's AWS_LAMBDA_LOG_LEVEL, else INFO."""
    env = os.environ if environ is None else environ
    raw = (env.get("WARMSTART_LOG_LEVEL") or env.get("AWS_LAMBDA_LOG_LEVEL") or "INFO").strip().upper()
    raw = _PYTHON_ALIASES.get(raw, raw)
    return raw if raw in LEVELS else "INFO"


def keep_level(environ: Mapping[str, str] | None = None) -> str:
    """The level of records that must survive filtering: INFO, or the threshold when it is above INFO."""
    level = threshold(environ)
    return level if LEVELS[level] > LEVELS["INFO"] else "INFO"


_second: tuple[int, str] = (-1, "")  # the last whole second formatted: (epoch second, its text)


def timestamp(now: float | None = None) -> str:
    """RFC 3339 with milliseconds, UTC (what Lambda's filter needs to keep a line's level)."""
    global _second
    t = time.time() if now is None else now
    second, text = _second
    if int(t) != second:  # formatted once a second, not on every line (one tuple swap: thread-safe)
        second = int(t)
        _second = second, text = second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
    return f"{text}.{int(t * 1000) % 1000:03d}Z"


class Invocation:
    """What the log records and the metrics of one invocation carry (set by the runtime, per thread)."""

    __slots__ = ("batch", "cold_start", "error", "fault", "kind", "model", "request_id", "tokens", "trace_id")

    def __init__(self, request_id: str | None, trace_id: str | None, cold_start: bool, model: str) -> None:
        self.request_id = request_id
        self.trace_id = trace_id
        self.cold_start = cold_start
        self.model = model
        self.kind = "inference"  # inference | ping | status
        self.batch = 0
        self.tokens = 0
        self.error: str | None = None  # the error's type name when the request failed
        self.fault = False  # an internal error (5xx), not the request's fault

    def fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {"function_request_id": self.request_id}
        if self.trace_id:
            out["xray_trace_id"] = self.trace_id
        out["cold_start"] = self.cold_start
        out["model"] = self.model
        return out


_local = threading.local()


def current() -> Invocation | None:
    inv: Invocation | None = getattr(_local, "invocation", None)
    return inv


def enter(invocation: Invocation | None) -> None:
    _local.invocation = invocation


class JsonFormatter(logging.Formatter):
    """One JSON object per record; the current invocation's keys when inside one; never a multi-line trace
    unless the record carries an exception (then `exception` and `exception_name`, Powertools' keys)."""

    def format(self, record: logging.LogRecord) -> str:
        level = _NAMES.get(min(50, max(10, record.levelno // 10 * 10)), "INFO")
        out: dict[str, Any] = {
            "level": level,
            "timestamp": timestamp(record.created),
            "message": record.getMessage(),
            "logger": record.name,
        }
        inv = current()
        if inv is not None:
            out.update(inv.fields())
        # A record's own keys (`extra={"fields": {...}}`): the HTTP host's access line (route, status, ms).
        out.update(getattr(record, "fields", None) or {})
        if record.exc_info and record.exc_info[0] is not None:
            out["exception_name"] = record.exc_info[0].__name__
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, separators=(",", ":"), default=str)


class _Handler(logging.Handler):
    """Writes to whatever sys.stdout is at the time (pytest and awslambdaric both replace it)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + "\n"
            sys.stdout.write(line)
            sys.stdout.flush()
        except Exception:
            self.handleError(record)


def json_handler() -> logging.Handler:
    """A handler writing JSON lines to stdout (for other libraries' loggers too: uvicorn's on the HTTP host)."""
    handler = _Handler()
    handler.setFormatter(JsonFormatter())
    return handler


def configure(environ: Mapping[str, str] | None = None) -> logging.Logger:
    """Our logger writes JSON lines to stdout at the function's level, and does not also propagate to the
    root logger (awslambdaric's handler there would write every record a second time). Idempotent."""
    logger = logging.getLogger(LOGGER)
    logger.setLevel(LEVELS[threshold(environ)])
    if not any(isinstance(h, _Handler) for h in logger.handlers):
        logger.addHandler(json_handler())
    logger.propagate = False
    return logger


def stamp(record: dict[str, Any], message: str, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A report record (`{"warmstart": kind, ...}`) with the keys every line has; `warmstart` stays first."""
    out: dict[str, Any] = {}
    if "warmstart" in record:
        out["warmstart"] = record["warmstart"]
    out["level"] = keep_level(environ)
    out["timestamp"] = timestamp()
    out["message"] = message
    out.update(record)
    return out
