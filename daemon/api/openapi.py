"""The OpenAPI 3.1 document of the IPC surface, built from the route table and schemas/.

The document stands alone: every JSON Schema a route names is bundled under
``components/schemas`` (its ``$id`` dropped, its references made local), so a validator or a
fuzzer needs nothing but this one file and never resolves a URL.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from importlib import resources
from typing import Any

import tidemesh
from tidemesh.daemon.api.routes import ERROR, TABLE

_COMMON = {401: "no or wrong bearer token (TCP)", 403: "foreign Host or any Origin (TCP)",
           404: "no such route or row", 405: "method not allowed",
           429: "too many in flight (daemon_busy), or over the token's request budget "
                "(rate_limited, with a Retry-After header)"}
_SUFFIX = ".schema.json"


def _component(file_name: str) -> str:
    return file_name.removeprefix("https://tidemesh.dev/schemas/").removesuffix(_SUFFIX)


def _ref(schema: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{_component(schema)}"}


def _localised(node: Any) -> Any:
    """A schema with ``$id``/``$schema`` dropped and ``x.schema.json`` refs made local."""
    if isinstance(node, dict):
        out = {k: _localised(v) for k, v in node.items() if k not in ("$id", "$schema")}
        if isinstance(node.get("$ref"), str) and node["$ref"].endswith(_SUFFIX):
            out.update(_ref(node["$ref"]))
        return out
    if isinstance(node, list):
        return [_localised(v) for v in node]
    return node


def _components() -> dict[str, Any]:
    folder = resources.files("tidemesh.schemas")
    files = sorted((p for p in folder.iterdir() if p.name.endswith(_SUFFIX)), key=lambda p: p.name)
    return {_component(p.name): _localised(json.loads(p.read_text("utf-8"))) for p in files}


def _operation(route: Any, operation_id: str) -> dict[str, Any]:
    responses: dict[str, Any] = {}
    for status, schema in sorted({**{s: ERROR for s in _COMMON}, **route.responses}.items()):
        content = {route.content_type if status < 400 else "application/json":
                   {"schema": _ref(schema)} if schema else {}}
        responses[str(status)] = {"description": _COMMON.get(status, "see schema"),
                                  "content": content}
    op: dict[str, Any] = {"summary": route.summary, "responses": responses,
                          "operationId": operation_id}
    params = re.findall(r"{(\w+)}", route.path)
    declared = [{"name": p, "in": "path", "required": True,
                 "schema": {"type": "string", "minLength": 1, **(
                     {"pattern": f"^{route.params[p]}$"} if p in route.params
                     else {})}} for p in params]
    declared += [{"name": name, "in": "query", "required": False, "description": text,
                  "schema": {"type": "string"}} for name, text in route.query.items()]
    if declared:
        op["parameters"] = declared
    if route.request:
        op["requestBody"] = {"required": route.request_required,
                             "content": {"application/json": {"schema": _ref(route.request)}}}
    return op


def _operation_id(route: Any, shared: Counter[str]) -> str:
    """The handler's name; a handler serving several routes gets the path appended, because
    OpenAPI requires operation ids to be unique."""
    name: str = route.function.__name__
    if shared[name] == 1:
        return name
    return name + re.sub(r"\W+", "_", route.path.removeprefix("/v1")).rstrip("_")


def document() -> dict[str, Any]:
    shared = Counter(route.function.__name__ for route in TABLE)
    paths: dict[str, dict[str, Any]] = {}
    for route in TABLE:
        op = _operation(route, _operation_id(route, shared))
        paths.setdefault(route.path, {})[route.method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": "tidemesh daemon IPC", "version": tidemesh.__version__,
                 "description": "Served on the daemon's Unix socket (no token) and on "
                                "127.0.0.1 (Authorization: Bearer <local_token>), "
                                "itself at GET /v1/openapi.json."},
        "servers": [{"url": "http://localhost"}],
        "paths": paths,
        "components": {"schemas": _components()},
    }


if __name__ == "__main__":  # regenerate schemas/openapi.json
    target = resources.files("tidemesh.schemas") / "openapi.json"
    with resources.as_file(target) as path:
        path.write_text(json.dumps(document(), indent=2) + "\n", encoding="utf-8")
        print(f"wrote {path.name}")
