"""`GET /docs`: the OpenAPI document (`GET /openapi.json`) as one page of plain HTML, written here, on the server:
no script, no stylesheet or font from elsewhere, so it reads the same on a host with no way out (a VPC, an
air-gapped cluster). Every operation has its heading and anchor; schemas are shown as their JSON, `$ref`s as
links to them."""

from __future__ import annotations

import json
import re
from html import escape
from typing import Any

STYLE = (
    "body{font:15px/1.5 system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#222}"
    "code,pre{font:13px/1.4 ui-monospace,monospace}pre{background:#f5f5f5;padding:.75rem;overflow:auto}"
    "h2{border-top:1px solid #ddd;padding-top:1rem}.m{font-weight:bold;text-transform:uppercase}"
)
REF = re.compile(r"&quot;#/components/schemas/([A-Za-z0-9_.-]+)&quot;")


def anchor(method: str, path: str) -> str:
    return f"{method}-{path.strip('/').replace('/', '-') or 'root'}"


def _schema_link(schema: dict[str, Any] | None) -> str:
    ref = (schema or {}).get("$ref", "")
    if ref.startswith("#/components/schemas/"):
        name = ref.rsplit("/", 1)[1]
        return f'<a href="#schema-{escape(name)}">{escape(name)}</a>'
    return f"<code>{escape(json.dumps(schema))}</code>" if schema else ""


def _json(value: Any) -> str:
    """Pretty JSON, escaped, each `$ref` a link to its schema's section."""
    text = escape(json.dumps(value, indent=2, ensure_ascii=False))
    return REF.sub(lambda m: f'&quot;<a href="#schema-{m[1]}">#/components/schemas/{m[1]}</a>&quot;', text)


def _operation(path: str, method: str, op: dict[str, Any]) -> str:
    parts = [
        f'<section id="{anchor(method, path)}"><h2><span class="m">{method}</span> <code>{escape(path)}</code></h2>'
    ]
    parts.append(f"<p>{escape(op.get('summary', ''))}</p>")
    if op.get("description"):
        parts.append(f"<p>{escape(op['description'])}</p>")
    body = op.get("requestBody", {}).get("content", {})
    for media, content in body.items():
        parts.append(f"<p>Request body (<code>{escape(media)}</code>): {_schema_link(content.get('schema'))}</p>")
    parts.append("<ul>")
    for status, answer in op.get("responses", {}).items():
        kinds = ", ".join(
            f"<code>{escape(media)}</code> {_schema_link(c.get('schema'))}"
            for media, c in answer.get("content", {}).items()
        )
        parts.append(f"<li><b>{escape(status)}</b>: {escape(answer.get('description', ''))} {kinds}</li>")
    parts.append("</ul></section>")
    return "".join(parts)


def render(document: dict[str, Any]) -> str:
    """The whole page for an OpenAPI document."""
    info = document.get("info", {})
    title = f"{info.get('title', 'API')} {info.get('version', '')}".strip()
    operations = [(path, method, op) for path, ops in document.get("paths", {}).items() for method, op in ops.items()]
    toc = "".join(
        f'<li><a href="#{anchor(m, p)}"><span class="m">{m}</span> <code>{escape(p)}</code></a> '
        f"{escape(op.get('summary', ''))}</li>"
        for p, m, op in operations
    )
    schemas = "".join(
        f'<section id="schema-{escape(name)}"><h3>{escape(name)}</h3><pre>{_json(schema)}</pre></section>'
        for name, schema in document.get("components", {}).get("schemas", {}).items()
    )
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
        f"<style>{STYLE}</style></head><body><h1>{escape(title)}</h1>"
        f"<p>{escape(info.get('description', ''))}</p>"
        '<p>The machine-readable document: <a href="/openapi.json"><code>GET /openapi.json</code></a>.</p>'
        f"<h2>Routes</h2><ul>{toc}</ul>"
        + "".join(_operation(p, m, op) for p, m, op in operations)
        + f"<h2>Schemas</h2>{schemas}</body></html>"
    )
