"""The route table, the schemas and the committed OpenAPI document agree."""

from __future__ import annotations

import json
from importlib import resources

import jsonschema

from tidemesh.daemon.api.openapi import document
from tidemesh.daemon.api.routes import TABLE
from tidemesh.daemon.api.validation import load_schema

SCHEMAS = resources.files("tidemesh") / "schemas"


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
