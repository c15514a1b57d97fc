"""JSON Schema checks through jsonschema-rs, and a failed check as (field, short message).

Every request body and every frame is checked against its schema: on the hot path a send is
checked three times (the daemon's request, the broker's send frame, the recipient's deliver
frame). jsonschema-rs took a deliver frame in 1.3 µs where fastjsonschema's generated Python
took 7.2 µs; py-spy had that check at a quarter of the receiving daemon's event loop.

It sees only values already held to ``core/jsonbounds`` (a body or frame is parsed within
its size and depth limits before any schema runs; jsonschema-rs converts a failing instance
and recursed per level on the 1,000-deep values that once reached it).

Its own messages quote the offending value, which can be a megabyte body; ``problem`` words
each failed keyword itself instead, naming the field the way a caller wrote it (``to.ref``,
``sends.3.body``; a missing property by the object that lacks it), and for an
``anyOf``/``oneOf`` it says what the field's description says it accepts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jsonschema_rs

Invalid = jsonschema_rs.ValidationError


class Schema:
    """One schema, compiled once; ``resolve`` maps the URI of a ``$ref`` to another schema
    (from the package, never the network)."""

    def __init__(self, document: dict[str, Any],
                 resolve: Callable[[str], dict[str, Any]]) -> None:
        self.document = document
        self._validate = jsonschema_rs.validator_for(document, retriever=resolve).validate

    def problem(self, data: Any) -> tuple[str, str] | None:
        """None when ``data`` fits; else its first failure, as ``problem`` words it."""
        try:
            self._validate(data)
        except Invalid as exc:
            return problem(exc, self.document)
        return None


def problem(exc: Invalid, schema: dict[str, Any]) -> tuple[str, str]:
    """The field that failed (dotted, "" for the whole document) and what it must be."""
    path = [str(p) for p in exc.instance_path]
    kind = exc.kind
    return ".".join(path), _must(kind.name, kind.value, exc, schema)


# What a failed keyword says, from the keyword's own value (a limit, a pattern, a property).
_ONE = {
    "required": "must contain {!r}",   # named by its parent: the object that is incomplete
    "const": "must be {!r}",
    "pattern": "must match pattern {}",
    "minLength": "must be at least {} characters",
    "maxLength": "must be at most {} characters",
    "minimum": "must be at least {}",
    "maximum": "must be at most {}",
    "minItems": "must have at least {} items",
    "maxItems": "must have at most {} items",
}
# ... from a list the keyword holds: (lead, separator, how to show an item).
_MANY: dict[str, tuple[str, str, Callable[[Any], str]]] = {
    "type": ("must be ", " or ", str),
    "enum": ("must be one of ", ", ", repr),
    "additionalProperties": ("must not have ", ", ", repr),
}


def _must(name: str, value: Any, exc: Invalid, schema: dict[str, Any]) -> str:
    if name in _ONE:
        return _ONE[name].format(value)
    if name in _MANY:
        lead, sep, show = _MANY[name]
        return lead + sep.join(show(v) for v in _names(value))
    if name in ("anyOf", "oneOf"):
        described = _at(schema, list(exc.schema_path)[:-1]).get("description")
        return f"must be {described}" if described else "must match one of its forms"
    return exc.message[:200]


def _names(value: Any) -> Sequence[Any]:
    return value if isinstance(value, list) else [value]


def _at(schema: dict[str, Any], path: list[Any]) -> dict[str, Any]:
    """The subschema at ``path`` in ``schema``, or {} when it leads elsewhere (a $ref)."""
    node: Any = schema
    for step in path:
        try:
            node = node[step if isinstance(node, dict) else int(step)]
        except (KeyError, IndexError, ValueError, TypeError):
            return {}
    return node if isinstance(node, dict) else {}
