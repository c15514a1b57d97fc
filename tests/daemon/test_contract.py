"""The route table, the schemas and the committed OpenAPI document agree."""

from __future__ import annotations

import json
import re
from importlib import resources

import jsonschema
from openapi_spec_validator import validate

from tidemesh.daemon.api.openapi import document
from tidemesh.daemon.api.routes import TABLE
from tidemesh.daemon.api.validation import load_schema

SCHEMAS = resources.files("tidemesh.schemas")


def test_no_two_routes_share_method_and_path() -> None:
    keys = [(r.method, r.path) for r in TABLE]
    assert len(keys) == len(set(keys))


def test_every_route_names_existing_schemas_for_request_and_success() -> None:
    for route in TABLE:
        assert any(s < 300 for s in route.responses), route.path
        names = [route.request, *route.responses.values()]
        for name in filter(None, names):
            jsonschema.Draft202012Validator.check_schema(load_schema(name))
        if route.method == "POST":
            assert route.request, f"{route.path} must name its request schema"


def test_committed_openapi_document_is_current() -> None:
    committed = json.loads((SCHEMAS / "openapi.json").read_text("utf-8"))
    assert committed == document(), "regenerate with: python -m tidemesh.daemon.api.openapi"


def test_openapi_document_is_valid_and_resolves_every_reference_inside_itself() -> None:
    doc = json.loads((SCHEMAS / "openapi.json").read_text("utf-8"))
    # Resolving a reference outside the document would fail here: the validator has no network
    # handler for tidemesh.dev, and the schemas' $id URLs resolve nowhere.
    validate(doc)
    refs = re.findall(r'"\$ref": "([^"]+)"', json.dumps(doc))
    assert refs and all(r.startswith("#/components/schemas/") for r in refs)


def _without_refs(node: object) -> object:
    if isinstance(node, dict):
        return {k: _without_refs(v) for k, v in node.items() if k not in ("$id", "$schema", "$ref")}
    if isinstance(node, list):
        return [_without_refs(v) for v in node]
    return node


def test_openapi_document_bundles_every_schema_as_it_is_in_schemas() -> None:
    committed = json.loads((SCHEMAS / "openapi.json").read_text("utf-8"))
    bundled = committed["components"]["schemas"]
    files = {p.name for p in SCHEMAS.iterdir() if p.name.endswith(".schema.json")}
    assert {f"{name}.schema.json" for name in bundled} == files
    for name, schema in bundled.items():
        assert _without_refs(schema) == _without_refs(load_schema(f"{name}.schema.json")), name
