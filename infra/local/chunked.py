"""An incremental HTTP/1.1 chunked body decoder (RFC 9112 §7.1) that keeps the trailers.

Why our own: the Runtime API listener is a bare asyncio protocol (infra.local.runtime_http), and a streamed
Lambda response ends with trailers (`Lambda-Runtime-Function-Error-Type`, `-Error-Body`) that carry a
mid-stream error. h11 would parse them too (`EndOfMessage.headers`), but it would own the whole connection;
this decoder only turns the bytes after the head into chunks as they arrive, bounded at every step.
"""

from __future__ import annotations

MAX_LINE = 4096  # a chunk-size line (size + extensions); a runtime writes a few hex digits
MAX_TRAILERS = 64 * 1024  # the trailer section, as the request head's limit
_HEX = b"0123456789abcdefABCDEF"


class ChunkedError(ValueError):
    """The body is not valid chunked encoding (the connection cannot be kept in sync after it)."""


class ChunkedDecoder:
    """feed(bytes) -> the data it completes, in order; `done` once the last chunk and trailers are read,
    then `trailers` (names lower-cased) and `rest` (bytes past the body: the next request's)."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._need = 0  # data bytes left in the current chunk
        self._state = "size"  # size | data | data-crlf | trailers | done
        self.done = False
        self.trailers: dict[str, str] = {}
        self.rest = b""

    def feed(self, data: bytes) -> list[bytes]:
        if self.done:
            self.rest += data
            return []
        self._buf += data
        out: list[bytes] = []
        while not self.done:
            if self._state == "data":
                if not self._buf:
                    break
                take = min(self._need, len(self._buf))
                out.append(bytes(self._buf[:take]))
                del self._buf[:take]
                self._need -= take
                if self._need == 0:
                    self._state = "data-crlf"
            elif self._state == "data-crlf":
                if len(self._buf) < 2:
                    break
                if self._buf[:2] != b"\r\n":
                    raise ChunkedError("chunk data not followed by CRLF")
                del self._buf[:2]
                self._state = "size"
            elif self._state == "size":
                line = self._line(MAX_LINE)
                if line is None:
                    break
                size_text = line.split(b";", 1)[0].strip()
                if not size_text or len(size_text) > 16 or size_text.strip(_HEX):
                    raise ChunkedError(f"bad chunk size {size_text[:20]!r}")
                size = int(size_text, 16)
                if size == 0:
                    self._state = "trailers"
                else:
                    self._need, self._state = size, "data"
            else:  # trailers: header lines up to an empty one
                end = self._buf.find(b"\r\n\r\n") if not self._buf.startswith(b"\r\n") else -2
                if end == -1:
                    if len(self._buf) > MAX_TRAILERS:
                        raise ChunkedError("trailer section too large")
                    break
                raw = b"" if end == -2 else bytes(self._buf[:end])
                del self._buf[: 2 if end == -2 else end + 4]
                self.trailers = _fields(raw)
                self.done = True
                self.rest = bytes(self._buf)
                self._buf.clear()
        return out

    def _line(self, limit: int) -> bytes | None:
        end = self._buf.find(b"\r\n")
        if end < 0:
            if len(self._buf) > limit:
                raise ChunkedError("chunk-size line too long")
            return None
        line = bytes(self._buf[:end])
        del self._buf[: end + 2]
        return line


def _fields(raw: bytes) -> dict[str, str]:
    fields: dict[str, str] = {}
    for item in raw.decode("latin-1").split("\r\n") if raw else []:
        name, sep, value = item.partition(":")
        if not sep or not name.strip():
            raise ChunkedError(f"bad trailer line {item[:40]!r}")
        fields[name.strip().lower()] = value.strip()
    return fields
