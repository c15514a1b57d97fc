"""What a hello (or join) signs, and how both ends make and check the signature (DESIGN §2).

The broker sends a fresh 32-byte nonce; the member signs
``"tidemesh-hello-v1" 0x00 mesh_id 0x00 pubkey_hex 0x00 nonce_hex`` with its ed25519 key.
The domain prefix keeps the signature from being valid in any other context.
"""

from __future__ import annotations

import secrets

from nacl.exceptions import BadSignatureError
from nacl.signing import SigningKey, VerifyKey

DOMAIN = b"tidemesh-hello-v1"


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
