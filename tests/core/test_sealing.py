"""DM sealing is deterministic per request (DESIGN §10): same request, same sealed bytes."""

from __future__ import annotations

from nacl.signing import SigningKey

from tidemesh.core.sealing import seal, unseal

ALICE, BOB = SigningKey(bytes(range(32))), SigningKey(bytes(range(1, 33)))
BOB_HEX = BOB.verify_key.encode().hex()
ALICE_HEX = ALICE.verify_key.encode().hex()


def test_seal_same_request_gives_same_bytes() -> None:
    one = seal(ALICE, BOB_HEX, "id-1", b"hello", "utf8")
    assert one == seal(ALICE, BOB_HEX, "id-1", b"hello", "utf8")
    assert unseal(BOB, ALICE_HEX, one) == (b"hello", "utf8")


def test_seal_differs_when_any_part_of_the_request_differs() -> None:
    base = seal(ALICE, BOB_HEX, "id-1", b"hello", "utf8")
    carol = SigningKey(bytes(range(2, 34))).verify_key.encode().hex()
    others = [
        seal(ALICE, BOB_HEX, "id-1", b"hellO", "utf8"),
        seal(ALICE, BOB_HEX, "id-2", b"hello", "utf8"),
        seal(ALICE, BOB_HEX, "id-1", b"hello", "base64"),
        seal(ALICE, carol, "id-1", b"hello", "utf8"),
        seal(SigningKey(bytes(32)), BOB_HEX, "id-1", b"hello", "utf8"),
    ]
    assert len({base, *others}) == 6
    nonces = {s[:24] for s in [base, *others]}
    assert len(nonces) == 6, "a nonce is never reused for a different plaintext or key pair"


def test_seal_field_boundaries_are_unambiguous() -> None:
    assert seal(ALICE, BOB_HEX, "id-1", b"2hello", "utf8")[:24] != \
        seal(ALICE, BOB_HEX, "id-12", b"hello", "utf8")[:24]
