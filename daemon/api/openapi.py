"""The OpenAPI 3.1 document of the IPC surface, built from the route table and schemas/."""

from __future__ import annotations

import re
from typing import Any

import tidemesh
from tidemesh.daemon.api.routes import ERROR, TABLE

_COMMON = {401: "no or wrong bearer token (TCP)", 403: "foreign Host or any Origin (TCP)",
           404: "no such route or row", 405: "method not allowed", 429: "too many in flight"}


def _ref(schema: str) -> dict[str, str]:
    return {"$ref": f"https://tidemesh.dev/schemas/{schema}"}


def _operation(route: Any) -> dict[str, Any]:
    responses: dict[str, Any] = {}
    for status, schema in sorted({**{s: ERROR for s in _COMMON}, **route.responses}.items()):
        content = {route.content_type if status < 400 else "application/json":
                   {"schema": _ref(schema)} if schema else {}}
        responses[str(status)] = {"description": _COMMON.get(status, "see schema"),
                                  "content": content}
    op: dict[str, Any] = {"summary": route.summary, "responses": responses,
                          "operationId": route.handler.__name__}
    params = re.findall(r"{(\w+)}", route.path)
    if params:
        op["parameters"] = [{"name": p, "in": "path", "required": True,
                             "schema": {"type": "string", "minLength": 1, **(
                                 {"pattern": f"^{route.params[p]}$"} if p in route.params
                                 else {})}} for p in params]
    if route.request:
        op["requestBody"] = {"required": True,
                             "content": {"application/json": {"schema": _ref(route.request)}}}
    return op


def document() -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for route in TABLE:
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(route)
    return {
        "openapi": "3.1.0",
        "info": {"title": "tidemesh daemon IPC", "version": tidemesh.__version__,
                 "description": "Served on the daemon's Unix socket (no token) and on "
                                "127.0.0.1 (Authorization: Bearer <local_token>)."},
        "servers": [{"url": "http://localhost"}],
        "paths": paths,
    }


if __name__ == "__main__":  # regenerate schemas/openapi.json
    import json
    from importlib import resources

    target = resources.files("tidemesh") / "schemas" / "openapi.json"
    with resources.as_file(target) as path:
        path.write_text(json.dumps(document(), indent=2) + "\n", encoding="utf-8")
        print(f"wrote {path.name}")
