"""Request bodies checked against ``schemas/*.schema.json`` (compiled once)."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any, cast

import orjson

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


def parse_json(raw: bytes) -> Any:
    if not raw:
        raise InvalidRequest("request body is empty; expected a JSON object", field="body")
    try:
        return orjson.loads(raw)
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
