"""What a hello (or join) signs, and how both ends make and check the signature (DESIGN §2).

The broker sends a fresh 32-byte nonce; the member signs
``"tidemesh-hello-v1" 0x00 mesh_id 0x00 pubkey_hex 0x00 nonce_hex`` with its ed25519 key.
The domain prefix keeps the signature from being valid in any other context.

A hello may also carry ``host_fingerprint``: ``host_mark`` of the daemon's host fingerprint,
outside the signature. Signing it would prove nothing: a clone holds the same key and signs
whatever it presents; and the signed bytes stay those every broker checks. The mark mixes in
the member key, so the broker never learns an identifier that follows a host across keys.
"""

from __future__ import annotations

import hashlib
import secrets

from nacl.exceptions import BadSignatureError
from nacl.signing import SigningKey, VerifyKey

DOMAIN = b"tidemesh-hello-v1"
HOST_DOMAIN = b"tidemesh-host-v1"


def new_nonce() -> str:
    return secrets.token_hex(32)


def signed_bytes(mesh_id: str, pubkey: str, nonce: str) -> bytes:
    return b"\x00".join((DOMAIN, mesh_id.encode(), pubkey.encode(), nonce.encode()))


def sign(key: SigningKey, mesh_id: str, nonce: str) -> tuple[str, str]:
    """Return (pubkey_hex, signature_hex) for a hello over ``nonce``."""
    pubkey = bytes(key.verify_key).hex()
    sig = key.sign(signed_bytes(mesh_id, pubkey, nonce)).signature
    return pubkey, bytes(sig).hex()


def verify(mesh_id: str, pubkey: str, nonce: str, signature: str) -> bool:
    try:
        VerifyKey(bytes.fromhex(pubkey)).verify(
            signed_bytes(mesh_id, pubkey, nonce), bytes.fromhex(signature)
        )
    except (BadSignatureError, ValueError):
        return False
    return True


def host_mark(pubkey: str, host_fingerprint: str) -> str:
    """What a hello says of its host: equal for one key on one host, different on a clone."""
    return hashlib.sha256(b"\x00".join((HOST_DOMAIN, pubkey.encode(),
                                         host_fingerprint.encode()))).hexdigest()


# A key rotation (``key_rotate``, docs/broker.md "Key rotation") is signed by both keys over
# the same bytes: the old key says "my successor is new", the new key says "I take over old".
# No nonce: the statement is the same whenever it is made, and the broker's step is idempotent
# (a replay of a rotation that happened changes nothing).
ROTATE_DOMAIN = b"tidemesh-rotate-v1"


def rotation_bytes(mesh_id: str, old_pubkey: str, new_pubkey: str) -> bytes:
    return b"\x00".join((ROTATE_DOMAIN, mesh_id.encode(), old_pubkey.encode(),
                         new_pubkey.encode()))


def sign_rotation(old: SigningKey, new: SigningKey, mesh_id: str) -> dict[str, str]:
    """The fields of a ``key_rotate`` frame: both public keys and both signatures."""
    old_pub, new_pub = bytes(old.verify_key).hex(), bytes(new.verify_key).hex()
    signed = rotation_bytes(mesh_id, old_pub, new_pub)
    return {"old_pubkey": old_pub, "new_pubkey": new_pub,
            "old_signature": bytes(old.sign(signed).signature).hex(),
            "new_signature": bytes(new.sign(signed).signature).hex()}


def verify_rotation(mesh_id: str, frame: dict[str, str]) -> bool:
    signed = rotation_bytes(mesh_id, frame["old_pubkey"], frame["new_pubkey"])
    try:
        for key, sig in ((frame["old_pubkey"], frame["old_signature"]),
                         (frame["new_pubkey"], frame["new_signature"])):
            VerifyKey(bytes.fromhex(key)).verify(signed, bytes.fromhex(sig))
    except (BadSignatureError, ValueError):
        return False
    return True
