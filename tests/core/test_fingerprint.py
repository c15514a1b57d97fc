"""The fingerprint matches the published vectors byte for byte (DESIGN §4.2)."""

from __future__ import annotations

import json
import os
from importlib import resources
from typing import Any

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemesh.core.fingerprint import meta_canonical, prefix, request_fingerprint
from tidemesh.core.send import parse_send_request

VECTORS: list[dict[str, Any]] = json.loads(
    (resources.files("tidemesh.schemas") / "vectors" / "fingerprint.json").read_text("utf-8")
)["vectors"]


def _fp(inp: dict[str, Any]) -> bytes:
    req = parse_send_request(inp)
    return request_fingerprint(
        req.to.kind.value, req.to.ref, req.body, req.priority.value, req.meta, req.reply_to
    )


def test_vectors_cover_the_cases_the_design_names() -> None:
    assert len(VECTORS) >= 12
    names = " ".join(v["name"] for v in VECTORS)
    for word in ("sorted", "nested", "unicode", "escapes", "number", "absent", "reply_to",
                 "base64", "now", "low"):
        assert word in names


@pytest.mark.parametrize("vector", VECTORS, ids=[v["name"] for v in VECTORS])
def test_fingerprint_matches_vector(vector: dict[str, Any]) -> None:
    assert _fp(vector["input"]).hex() == vector["fingerprint"]


@pytest.mark.parametrize("vector", VECTORS, ids=[v["name"] for v in VECTORS])
def test_meta_canonical_form_matches_vector(vector: dict[str, Any]) -> None:
    req = parse_send_request(vector["input"])
    assert meta_canonical(req.meta).decode("utf-8") == vector["meta_jcs"]
    assert req.meta_jcs.decode("utf-8") == vector["meta_jcs"]


def test_absent_empty_and_null_meta_fingerprint_alike() -> None:
    by_name = {v["name"]: v["fingerprint"] for v in VECTORS}
    assert by_name["text body, no meta, default priority"] \
        == by_name["empty meta object equals absent meta"] \
        == by_name["null meta equals absent meta"] \
        == by_name["explicit next equals default"] \
        == by_name["short destination form"]


def test_each_field_changes_the_fingerprint() -> None:
    base = {"to": {"kind": "topic", "ref": "ops"}, "body": "hello"}
    variants = [
        {**base, "to": {"kind": "queue", "ref": "ops"}},
        {**base, "to": {"kind": "topic", "ref": "dev"}},
        {**base, "body": "hello!"},
        {**base, "priority": "now"},
        {**base, "meta": {"a": 1}},
        {**base, "reply_to": "01JD5Z8Q3M9V6W2X4Y7Z0A1B2C"},
    ]
    fps = {_fp(v) for v in variants} | {_fp(base)}
    assert len(fps) == len(variants) + 1


def test_prefix_is_eight_bytes_hex() -> None:
    assert prefix(bytes(range(32))) == "0001020304050607"


_printable = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=12)
_plain_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | _printable,
    lambda c: st.lists(c, max_size=4) | st.dictionaries(_printable, c, max_size=4),
    max_leaves=16)
_any_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c, max_size=4),
    max_leaves=16)


# Nearly all of this test's time is hypothesis drawing the nested values (py-spy: 90 %), 12 ms
# an example: the suite draws 500 (2,000 took 27 s alone, 72 s beside the other workers);
# `make fuzz` draws many more (scripts/fuzz.py --canonical-examples).
CANONICAL_EXAMPLES = int(os.environ.get("TIDEMESH_FUZZ_EXAMPLES", "500"))


@given(st.dictionaries(_printable, _plain_json, min_size=1, max_size=6) | st.dictionaries(
    st.text(max_size=6), _any_json, min_size=1, max_size=6))
@settings(max_examples=CANONICAL_EXAMPLES)
def test_meta_canonical_is_rfc8785_byte_for_byte(meta: dict[str, Any]) -> None:
    try:
        expected = rfc8785.dumps(meta)
    except (rfc8785.CanonicalizationError, UnicodeEncodeError):
        return  # refused either way (a 400 at accept)
    assert meta_canonical(meta) == expected
