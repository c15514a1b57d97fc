"""A failed schema check as the caller reads it: the field as written, a short message that
never quotes the value, and the field's description for a value that fits none of its forms."""

from __future__ import annotations

from typing import Any

import pytest

from tidemesh.core.schemas import Schema

SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["to"],
    "properties": {
        "to": {
            "description": "a destination, topic:NAME or {kind, ref}",
            "anyOf": [{"type": "string", "pattern": "^topic:"},
                      {"type": "object", "required": ["kind"]}],
        },
        "body": {"type": "string", "maxLength": 4},
        "n": {"type": "integer", "minimum": 1},
        "tags": {"type": "array", "maxItems": 2, "items": {"enum": ["a", "b"]}},
        "ref": {"$ref": "https://example.test/ref.json"},
    },
}
REF = {"type": "string", "minLength": 2}


def _problem(data: Any) -> tuple[str, str] | None:
    return Schema(SCHEMA, lambda uri: REF).problem(data)


@pytest.mark.parametrize(("data", "want"), [
    ({}, ("", "must contain 'to'")),
    ({"to": "topic:x", "extra": 1}, ("", "must not have 'extra'")),
    ({"to": "topic:x", "body": 5}, ("body", "must be string")),
    ({"to": "topic:x", "n": 0}, ("n", "must be at least 1")),
    ({"to": "topic:x", "tags": ["a", "z"]}, ("tags.1", "must be one of 'a', 'b'")),
    ({"to": "topic:x", "tags": ["a"] * 3}, ("tags", "must have at most 2 items")),
    ({"to": "queue:x"}, ("to", "must be a destination, topic:NAME or {kind, ref}")),
    ({"to": "topic:x", "ref": "r"}, ("ref", "must be at least 2 characters")),
], ids=["required", "extra", "type", "minimum", "item", "items", "any-of", "ref"])
def test_a_failed_check_names_the_field_and_what_it_must_be(
        data: Any, want: tuple[str, str]) -> None:
    assert _problem(data) == want


def test_the_message_never_quotes_the_value() -> None:
    assert _problem({"to": "topic:x", "body": "x" * 100_000}) == (
        "body", "must be at most 4 characters")


def test_a_document_that_fits_has_no_problem() -> None:
    assert _problem({"to": {"kind": "topic"}, "body": "ok", "n": 3, "tags": ["b"]}) is None
