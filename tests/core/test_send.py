"""Send-request rules a schema cannot express: id grammar, base64, destinations, meta."""

from __future__ import annotations

import pytest

from tidemesh.core.errors import IdempotencyKeyMismatch, InvalidRequest
from tidemesh.core.ids import ULID_PATTERN, client_message_id_problem, new_ulid
from tidemesh.core.send import (
    Destination,
    DestinationKind,
    parse_send_request,
    pick_client_message_id,
)

PUB = "ab" * 32


def test_short_destination_forms_parse() -> None:
    assert Destination.parse("topic:ops") == Destination(DestinationKind.TOPIC, "ops")
    assert Destination.parse(f"dm:{PUB}").kind is DestinationKind.DM
    assert Destination.parse("queue:jobs.high").ref == "jobs.high"


@pytest.mark.parametrize("text", ["ops", "mail:x", "topic:", "dm:zz", f"dm:{PUB.upper()}",
                                  "topic:-lead", "topic:has space"])
def test_bad_destinations_are_refused(text: str) -> None:
    with pytest.raises(InvalidRequest):
        Destination.parse(text)


def test_header_and_body_id_must_agree() -> None:
    assert pick_client_message_id("a", "a") == "a"
    assert pick_client_message_id("a", None) == "a"
    assert pick_client_message_id(None, "b") == "b"
    with pytest.raises(IdempotencyKeyMismatch):
        pick_client_message_id("a", "b")


@pytest.mark.parametrize("value", ["", "x" * 256, "tab\there", "é", " lead", "trail "])
def test_bad_ids_are_named(value: str) -> None:
    assert client_message_id_problem(value) is not None


def test_ids_accept_printable_ascii_up_to_255() -> None:
    assert client_message_id_problem("job:7/retry #2") is None
    assert client_message_id_problem("~" * 255) is None


def test_base64_body_is_strict() -> None:
    with pytest.raises(InvalidRequest):
        parse_send_request({"to": "topic:a", "body": "not base64!", "body_encoding": "base64"})
    req = parse_send_request({"to": "topic:a", "body": "AAEC", "body_encoding": "base64"})
    assert req.body == b"\x00\x01\x02"


def test_meta_with_an_integer_beyond_ieee_range_is_refused() -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_send_request({"to": "topic:a", "body": "x", "meta": {"n": 2**60}})
    assert info.value.details["field"] == "meta"


def test_ulids_sort_by_time_and_have_the_right_shape() -> None:
    a, b = new_ulid(1_000), new_ulid(2_000)
    assert ULID_PATTERN.fullmatch(a) and a < b


@pytest.mark.parametrize(("rand", "text"), [
    (bytes(10), "0000000000000000"),
    (b"\xff" * 10, "ZZZZZZZZZZZZZZZZ"),
    (bytes(range(1, 11)), "041061050R3GG28A"),   # RFC 4648 base32 of 01..0a, re-lettered
])
def test_ulid_random_part_is_the_80_bits_in_crockford_base32(rand: bytes, text: str) -> None:
    assert new_ulid(0, rand) == "0000000000" + text
