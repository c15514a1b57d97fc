"""The IPC's OpenAPI document with every ``$ref`` made local, for schemathesis.

``schemas/openapi.json`` points at the JSON Schemas by their ``$id`` URLs; a fuzzer resolving
those would go to the network. This inlines ``schemas/*.schema.json`` as components.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
ID_PREFIX = "https://tidemesh.dev/schemas/"


def _component(file_name: str) -> str:
    return file_name.removesuffix(".schema.json")


def _localise(node: Any) -> Any:
    if isinstance(node, dict):
        out = {k: _localise(v) for k, v in node.items() if k not in ("$schema", "$id")}
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.endswith(".schema.json"):
            out["$ref"] = "#/components/schemas/" + _component(ref.removeprefix(ID_PREFIX))
        return out
    if isinstance(node, list):
        return [_localise(v) for v in node]
    return node


def local_openapi() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((SCHEMAS / "openapi.json").read_text())
    components = {_component(p.name): _localise(json.loads(p.read_text()))
                  for p in SCHEMAS.glob("*.schema.json")}
    doc = _localise(doc)
    doc.setdefault("components", {}).setdefault("schemas", {}).update(components)
    return doc
