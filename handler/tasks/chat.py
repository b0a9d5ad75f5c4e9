"""Chat messages → the prompt text, rendered with the model's own chat template exactly as transformers'
`apply_chat_template` renders it (`transformers/utils/chat_template_utils.py`): a sandboxed jinja2 environment with
`trim_blocks`, `lstrip_blocks` and loop controls, its `tojson` filter (no HTML escaping), the globals
`raise_exception`, `strftime_now`, `dict` and `namespace`, and the variables `messages`, `tools` (None),
`documents` (None), `add_generation_prompt`, the tokenizer's special tokens and the request's
`chat_template_kwargs`.

A template is untrusted code from the model's repository: the sandbox refuses attribute access into Python's
internals, and a template's own `raise_exception` (Gemma's "roles must alternate") is the request's error.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache
from typing import Any

from handler.core.errors import InvalidInputError

ROLES = ("system", "user", "assistant")


def message_text(content: Any, where: str) -> str:
    """A message's content: a string, or a list of text parts joined by newlines (as vLLM joins them for a
    template that takes strings)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content:
        texts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise InvalidInputError(
                    f'{where}.content[{i}] must be {{"type": "text", "text": "..."}} (only text parts are served)'
                )
            texts.append(part["text"])
        return "\n".join(texts)
    raise InvalidInputError(f"{where}.content must be a string or a non-empty list of text parts")


def check_messages(messages: Any) -> list[dict[str, str]]:
    """`messages` as the template sees them: `[{"role", "content"}]`, roles from `ROLES`, content a string."""
    if not isinstance(messages, list) or not messages:
        raise InvalidInputError('"messages" must be a non-empty list of {"role", "content"} objects')
    out = []
    for i, message in enumerate(messages):
        where = f'"messages"[{i}]'
        if not isinstance(message, dict):
            raise InvalidInputError(f"{where} must be an object with role and content")
        role = message.get("role")
        if role not in ROLES:
            raise InvalidInputError(f"{where}.role {role!r}; valid: {', '.join(ROLES)}")
        if "content" not in message:
            raise InvalidInputError(f"{where} has no content")
        out.append({"role": role, "content": message_text(message["content"], where)})
    return out


@lru_cache(maxsize=8)
def compile_template(source: str) -> Any:
    """The template compiled in transformers' environment (cached: one model's template, compiled once)."""
    # Deferred: jinja2 costs ~15 ms to import, and an instance that serves no chat model never needs it.
    import jinja2
    import jinja2.ext
    import jinja2.utils
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
    ) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format: str) -> str:
        return datetime.now().strftime(format)

    class TemplateDict:  # `dict(...)` in a template, without the class's attributes
        def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):  # no underscore-prefixed attributes stored on a namespace
        def __init__(*args: Any, **kwargs: Any) -> None:
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check_name(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"a namespace cannot store {name!r}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise ValueError(f"the chat template does not compile: {e}") from None


def render(
    template: str,
    messages: list[dict[str, str]],
    special_tokens: Mapping[str, str | None],
    kwargs: Mapping[str, Any] | None = None,
) -> str:
    """The prompt text for `messages`, with the generation prompt added (the assistant's turn opened).
    `special_tokens`: those set are variables (`bos_token`, `eos_token`, ...); `kwargs` (the request's
    `chat_template_kwargs`) come after them and may override them, as in transformers."""
    import jinja2  # deferred as in compile_template (already imported by then)

    compiled = compile_template(template)
    variables = {k: v for k, v in special_tokens.items() if v is not None}
    variables.update(kwargs or {})
    variables.pop("messages", None)
    variables.pop("add_generation_prompt", None)
    try:
        text: str = compiled.render(
            messages=messages,
            tools=variables.pop("tools", None),
            documents=variables.pop("documents", None),
            add_generation_prompt=True,
            **variables,
        )
    except jinja2.exceptions.SecurityError as e:
        raise InvalidInputError(f"the chat template refused: {e}") from None
    except jinja2.exceptions.TemplateError as e:
        raise InvalidInputError(f"the model's chat template refused these messages: {e}") from None
    return text
