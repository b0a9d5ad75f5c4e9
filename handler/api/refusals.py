"""Compatible routes validate a body once (`validate`): what the route recognises and refuses, declared as data
(`Refuse`, `TokenIds`: UnsupportedRequestError, a 400 saying what to send instead), then its JSON Schema
(`handler.api.schemas.check`: structure, InvalidInputError naming every fault). A refused value is one the schema
would reject too, but with a message that says why the API's field is not served; what passes needs no further
check before the native task's own (its texts: length, count, encoding)."""

from __future__ import annotations

from typing import Any

from handler.core.errors import UnsupportedRequestError
from handler.core.records import record
from handler.core.types import JSON


def _check(body: Any, schema: str) -> dict[str, Any]:
    """`handler.api.schemas.check`, imported on first use: the schemas are ~0.8 ms of import that a Lambda
    function serving only native requests never needs (the HTTP host imports them at startup anyway)."""
    from handler.api import schemas

    return schemas.check(body, schema)


def _at(body: dict[str, Any], field: str) -> tuple[bool, Any]:
    """The value at a dotted `field` ("parameters.truncation_direction"), and whether it is there at all."""
    value: Any = body
    for part in field.split("."):
        if not isinstance(value, dict) or part not in value:
            return False, None
        value = value[part]
    return True, value


@record
class Refuse:
    """`field` refused when it holds one of `values` (by type too: `0` is not `false`), or, with `allowed`,
    anything but those (null is never refused: it means "not set")."""

    field: str
    message: str
    values: tuple[Any, ...] = ()
    allowed: tuple[Any, ...] | None = None

    def find(self, body: dict[str, Any]) -> str | None:
        there, value = _at(body, self.field)
        if not there or value is None:
            return None
        if self.allowed is not None:
            refused = not any(value == v and type(value) is type(v) for v in self.allowed)
        else:
            refused = any(value == v and type(value) is type(v) for v in self.values)
        return f'"{self.field}": {self.message}' if refused else None


@record
class TokenIds:
    """Token ids (an int, a list of ints) and text pairs in a texts field, refused with what to send.
    `lists_only`: only items of a list are read (`/predict`'s single int is a type error, not token ids)."""

    field: str
    hint: str = ""
    lists_only: bool = False

    def find(self, body: dict[str, Any]) -> str | None:
        there, value = _at(body, self.field)
        if not there or (self.lists_only and not isinstance(value, list)):
            return None
        for i, text in enumerate(value if isinstance(value, list) else [value]):
            if isinstance(text, list | int) and not isinstance(text, bool):
                hint = f" ({self.hint})" if self.hint else ""
                return f"{self.field}[{i}]: token ids and text pairs are not taken here; send text{hint}"
        return None


@record
class TextParts:
    """Chat messages' content parts other than text (images, audio, files), refused naming the message and
    part: the generation models served here read text only."""

    field: str = "messages"

    def find(self, body: dict[str, Any]) -> str | None:
        there, messages = _at(body, self.field)
        if not there or not isinstance(messages, list):
            return None
        for i, message in enumerate(messages):
            content = message.get("content") if isinstance(message, dict) else None
            for j, part in enumerate(content if isinstance(content, list) else ()):
                kind = part.get("type") if isinstance(part, dict) else None
                if isinstance(kind, str) and kind != "text":
                    return f'{self.field}[{i}].content[{j}]: "{kind}" parts are not served; send text parts'
        return None


@record
class OneText:
    """A texts field that may hold one text only (a completion's `prompt`): a list of more is refused."""

    field: str
    why: str

    def find(self, body: dict[str, Any]) -> str | None:
        there, value = _at(body, self.field)
        if there and isinstance(value, list) and len(value) > 1 and all(isinstance(v, str) for v in value):
            return f'"{self.field}": a list of {len(value)} texts is not served; {self.why}'
        return None


@record
class Items:
    """A list field whose items the API knows more of than are served: an item outside `served` is refused,
    named with the field and what is served."""

    field: str
    served: tuple[str, ...]
    why: str

    def find(self, body: dict[str, Any]) -> str | None:
        there, value = _at(body, self.field)
        for item in value if there and isinstance(value, list) else ():
            if isinstance(item, str) and item not in self.served:
                return f'"{self.field}": {item!r} is not served ({self.why}); send {" or ".join(self.served)}'
        return None


Refusal = Refuse | TokenIds | TextParts | OneText | Items


def validate(payload: JSON, schema: str, refusals: tuple[Refusal, ...]) -> dict[str, Any]:
    """The client's body, checked once: its refusals (UnsupportedRequestError), then its schema (structure:
    InvalidInputError naming every fault). What passes needs no further check before the native task's."""
    if isinstance(payload, dict):
        for refusal in refusals:
            message = refusal.find(payload)
            if message is not None:
                raise UnsupportedRequestError(message)
    return _check(payload, schema)
