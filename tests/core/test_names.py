"""Resolving ``@name`` and key prefixes: one member, or an error naming the candidates."""

from __future__ import annotations

import pytest

from tidemesh.core.errors import AmbiguousMember, UnknownMember
from tidemesh.core.names import Known, is_name_ref, resolve

BOB = "b0b" + "1" * 61
BOB2 = "b0b" + "2" * 61
ANN = "a" * 64
DIRECTORY = [Known(BOB, "bob"), Known(ANN, "ann"), Known(BOB2, "bob")]


def test_a_unique_name_resolves_to_its_key() -> None:
    assert resolve("@ann", DIRECTORY) == ANN


def test_a_prefix_resolves_when_it_fits_one_key() -> None:
    assert resolve(BOB[:16], DIRECTORY) == BOB


def test_a_shared_name_is_ambiguous_and_names_both() -> None:
    with pytest.raises(AmbiguousMember) as exc:
        resolve("@bob", DIRECTORY)
    assert {c["pubkey"] for c in exc.value.details["candidates"]} == {BOB, BOB2}
    assert exc.value.http_status == 400


def test_a_short_shared_prefix_is_ambiguous() -> None:
    twin = BOB[:20] + "9" * 44
    with pytest.raises(AmbiguousMember):
        resolve(BOB[:16], [Known(BOB, "bob"), Known(twin, None)])
    assert resolve(BOB[:21], [Known(BOB, "bob"), Known(twin, None)]) == BOB


def test_an_unknown_name_is_404_offering_a_near_miss() -> None:
    with pytest.raises(UnknownMember) as exc:
        resolve("@Ann", DIRECTORY)
    assert [c["pubkey"] for c in exc.value.details["candidates"]] == [ANN]
    assert exc.value.http_status == 404


def test_the_same_key_twice_is_one_member() -> None:
    assert resolve("@ann", [Known(ANN, "ann"), Known(ANN, "ann")]) == ANN
    assert resolve("@ann", [Known(ANN, None), Known(ANN, "ann")]) == ANN


@pytest.mark.parametrize(("ref", "ok"), [("@bob", True), ("g" * 16, False), ("0" * 16, True),
                                    ("0" * 15, False), ("0" * 64, False), ("@", False),
                                    ("@a\nb", False)])
def test_what_counts_as_a_ref_to_resolve(ref: str, ok: bool) -> None:
    assert is_name_ref(ref) is ok


def test_a_name_two_keys_hold_is_shown_with_each_key_prefix() -> None:
    from tidemesh.core.names import shown_names
    a, b, c = "a" * 64, "b" * 64, "c" * 64
    shown = shown_names([Known(a, "bob"), Known(b, "bob"), Known(c, "carol"), Known(a, "bob"),
                         Known("d" * 64, None)])
    assert shown == {a: f"bob ({'a' * 16})", b: f"bob ({'b' * 16})", c: "carol"}
