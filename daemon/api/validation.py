"""Request bodies checked against ``schemas/*.schema.json`` (compiled once)."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any, cast

import orjson

from tidemesh.core import jsonbounds
from tidemesh.core.errors import InvalidRequest
from tidemesh.core.schemas import Schema

_BASE = "https://tidemesh.dev/schemas/"


def load_schema(name: str) -> dict[str, Any]:
    text = (resources.files("tidemesh.schemas") / name).read_text(encoding="utf-8")
    return cast(dict[str, Any], json.loads(text))


def _resolve(uri: str) -> dict[str, Any]:
    if not uri.startswith(_BASE):
        raise ValueError(f"schema reference outside tidemesh: {uri}")
    return load_schema(uri.removeprefix(_BASE))


@cache
def validator(name: str) -> Schema:
    return Schema(load_schema(name), _resolve)


# ``ipc.max_body_bytes`` refuses a bigger body (413) before it is read; this is the parse's
# own budget behind it.
BODY_BUDGET = 16 << 20


def parse_json(raw: bytes) -> Any:
    """A request body parsed within ``BODY_BUDGET`` and ``jsonbounds.MAX_DEPTH`` levels: a
    deeper one is a 400 before any schema or handler sees it."""
    if not raw:
        raise InvalidRequest("request body is empty; expected a JSON object", field="body")
    try:
        return jsonbounds.loads(raw, max_bytes=BODY_BUDGET)
    except (jsonbounds.TooLarge, jsonbounds.TooDeep) as exc:
        raise InvalidRequest(f"request body refused: {exc}", field="body") from None
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc}", field="body") from exc


def checked(schema: str, data: Any) -> dict[str, Any]:
    """Validate ``data``; the error names the failing field (``to.kind``, ``priority``, ...)."""
    if not isinstance(data, dict):
        raise InvalidRequest("request body must be a JSON object", field="body")
    found = validator(schema).problem(data)
    if found is not None:
        field, message = found[0] or "body", found[1]
        raise InvalidRequest(f"{field}: {message}", field=field)
    return data
