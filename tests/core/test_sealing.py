"""DM sealing is deterministic per request (DESIGN §10): same request, same sealed bytes."""

from __future__ import annotations

from nacl.signing import SigningKey

from tidemesh.core.sealing import Binding, Opened, binding_problem, seal, unseal

ALICE, BOB = SigningKey(bytes(range(32))), SigningKey(bytes(range(1, 33)))
BOB_HEX = BOB.verify_key.encode().hex()
ALICE_HEX = ALICE.verify_key.encode().hex()


def test_seal_same_request_gives_same_bytes() -> None:
    one = seal(ALICE, BOB_HEX, "id-1", b"hello", "utf8")
    assert one == seal(ALICE, BOB_HEX, "id-1", b"hello", "utf8")
    opened = unseal(BOB, ALICE_HEX, one)
    assert (opened.body, opened.encoding) == (b"hello", "utf8")


def test_seal_differs_when_any_part_of_the_request_differs() -> None:
    base = seal(ALICE, BOB_HEX, "id-1", b"hello", "utf8")
    carol = SigningKey(bytes(range(2, 34))).verify_key.encode().hex()
    others = [
        seal(ALICE, BOB_HEX, "id-1", b"hellO", "utf8"),
        seal(ALICE, BOB_HEX, "id-2", b"hello", "utf8"),
        seal(ALICE, BOB_HEX, "id-1", b"hello", "base64"),
        seal(ALICE, carol, "id-1", b"hello", "utf8"),
        seal(SigningKey(bytes(32)), BOB_HEX, "id-1", b"hello", "utf8"),
        seal(ALICE, BOB_HEX, "id-1", b"hello", "utf8", meta={"k": 1}),
        seal(ALICE, BOB_HEX, "id-1", b"hello", "utf8", reply_to="01ABC"),
        seal(ALICE, BOB_HEX, "id-1", b"hello", "utf8", priority="now"),
    ]
    assert len({base, *others}) == 9
    nonces = {s[:24] for s in [base, *others]}
    assert len(nonces) == 9, "a nonce is never reused for a different plaintext or key pair"


def test_seal_field_boundaries_are_unambiguous() -> None:
    assert seal(ALICE, BOB_HEX, "id-1", b"2hello", "utf8")[:24] != \
        seal(ALICE, BOB_HEX, "id-12", b"hello", "utf8")[:24]


def test_meta_reply_to_and_priority_travel_sealed_with_the_body() -> None:
    """Before, a DM's meta and reply_to went to the broker in the clear and unauthenticated
    (the broker store showed {"invoice": "ACME-4711", "amount": "9000 EUR"})."""
    meta = {"invoice": "ACME-4711", "amount": "9000 EUR"}
    sealed = seal(ALICE, BOB_HEX, "id-1", b"pay", "utf8", meta, "01PARENT", "now")
    assert b"ACME-4711" not in sealed and b"01PARENT" not in sealed
    # The same meta in another key order is the same request: the same bytes.
    assert sealed == seal(ALICE, BOB_HEX, "id-1", b"pay", "utf8",
                          {"amount": "9000 EUR", "invoice": "ACME-4711"}, "01PARENT", "now")
    opened = unseal(BOB, ALICE_HEX, sealed)
    assert opened == Opened(b"pay", "utf8", meta, "01PARENT", "now", sealed_fields=True,
                            binding=Binding(ALICE_HEX, BOB_HEX, "id-1"))


def test_an_envelope_names_who_sealed_it_for_whom_under_which_id() -> None:
    """crypto_box's key is the same both ways: without the binding, alice's DM to bob,
    presented by the broker as bob's DM to alice, opened on alice's host as from bob."""
    sealed = seal(ALICE, BOB_HEX, "id-1", b"my own words", "utf8")
    at_bob = unseal(BOB, ALICE_HEX, sealed)
    assert binding_problem(at_bob, ALICE_HEX, BOB_HEX, "id-1") is None
    reflected = unseal(ALICE, BOB_HEX, sealed)   # it opens: the shared key is the same
    assert reflected.body == b"my own words"
    assert "reflected" in (binding_problem(reflected, BOB_HEX, ALICE_HEX, "id-1") or "")
    assert "replayed" in (binding_problem(at_bob, ALICE_HEX, BOB_HEX, "id-2") or "")
    carol = SigningKey(bytes(range(2, 34))).verify_key.encode().hex()
    assert "sealed for" in (binding_problem(at_bob, ALICE_HEX, carol, "id-1") or "")


def test_a_dm_sealed_by_an_earlier_version_still_opens() -> None:
    from nacl.public import Box

    box = Box(ALICE.to_curve25519_private_key(), BOB.verify_key.to_curve25519_public_key())
    old = bytes(box.encrypt(b"\x01old body"))
    assert unseal(BOB, ALICE_HEX, old) == Opened(b"old body", "utf8")
    assert not unseal(BOB, ALICE_HEX, old).bound


def test_a_sealed_header_is_held_to_the_rules_of_a_clear_send() -> None:
    from tidemesh.core.sealing import Opened, sealed_fields_problems

    deep: dict[str, object] = {}
    node = deep
    for _ in range(40):
        node["a"] = {}
        node = node["a"]  # type: ignore[assignment]
    fine = Opened(b"hi", "utf8", {"k": 1}, "01ARZ3NDEKTSV4RRFFQ69G5FAV", "next", True)
    assert sealed_fields_problems(fine) == {}
    bad = Opened(b"\xff", "utf8", deep, {"x": 1}, "next", True)  # type: ignore[arg-type]
    assert set(sealed_fields_problems(bad)) == {"meta", "reply_to", "body"}
    assert sealed_fields_problems(Opened(b"\xff", "utf8")) == {}, "a v1 envelope has no header"
