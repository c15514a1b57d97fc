"""DM bodies sealed for one recipient (DESIGN §5.2): crypto_box from the sender's X25519 key
(derived from its ed25519 member key) to the recipient's, once, at accept. The broker stores
and forwards the sealed bytes and can never read them.

The sealed plaintext is one byte saying how the body was encoded (1 = UTF-8 text,
2 = binary) followed by the body bytes, so the recipient gets back exactly what was sent.

Sealing is deterministic per request (DESIGN §10): the nonce is a keyed BLAKE2b hash of
(sender, recipient, client_message_id, plaintext) under a key derived from the sender's
secret key. The same logical request thus yields the same sealed bytes, hence the same broker
fingerprint, on every path (daemon, retry, cold path), while a different body under the same
id still differs. A nonce repeats only for the same key pair and the same plaintext, so equal
ciphertexts reveal only that two requests were identical (docs/daemon.md, "DM sealing").
"""

from __future__ import annotations

import hashlib

from nacl.exceptions import CryptoError
from nacl.public import Box, PrivateKey, PublicKey
from nacl.signing import SigningKey, VerifyKey

from tidemesh.core.errors import InvalidRequest

_ENCODINGS = {"utf8": 1, "base64": 2}
_NAMES = {v: k for k, v in _ENCODINGS.items()}


class UnsealError(ValueError):
    """The sealed body could not be opened (wrong recipient, tampered, or not sealed)."""


def _x25519_public(ed25519_hex: str) -> PublicKey:
    return VerifyKey(bytes.fromhex(ed25519_hex)).to_curve25519_public_key()


def _x25519_private(key: SigningKey) -> PrivateKey:
    return key.to_curve25519_private_key()


def _nonce(sender: SigningKey, recipient: PublicKey, client_message_id: str,
           plain: bytes) -> bytes:
    """24 bytes that depend on the whole request and on a secret only the sender holds."""
    key = hashlib.blake2b(bytes(sender), digest_size=32, person=b"tm-dm-nonce-key").digest()
    h = hashlib.blake2b(key=key, digest_size=Box.NONCE_SIZE, person=b"tm-dm-nonce-v1")
    cmid = client_message_id.encode("utf-8")
    # Fixed-size keys, then a length-prefixed id: no two requests hash the same bytes.
    for part in (sender.verify_key.encode(), bytes(recipient), len(cmid).to_bytes(4, "big"),
                 cmid, plain):
        h.update(part)
    return h.digest()


def seal(sender: SigningKey, recipient_pubkey_hex: str, client_message_id: str, body: bytes,
         encoding: str) -> bytes:
    """Seal ``body`` for the recipient; the same arguments always give the same bytes."""
    try:
        recipient = _x25519_public(recipient_pubkey_hex)
    except CryptoError as exc:  # 64 hex digits, but not a point on the curve
        raise InvalidRequest("dm ref is not an ed25519 public key; no member can have it",
                             field="to.ref") from exc
    box = Box(_x25519_private(sender), recipient)
    plain = bytes([_ENCODINGS[encoding]]) + body
    return bytes(box.encrypt(plain, _nonce(sender, recipient, client_message_id, plain)))


def unseal(recipient: SigningKey, sender_pubkey_hex: str, sealed: bytes) -> tuple[bytes, str]:
    """Return (body, encoding) of a body sealed by ``sender_pubkey_hex`` for ``recipient``."""
    try:
        box = Box(_x25519_private(recipient), _x25519_public(sender_pubkey_hex))
        plain = box.decrypt(sealed)
    except (CryptoError, ValueError) as exc:
        raise UnsealError(f"cannot open DM from {sender_pubkey_hex[:16]}…: {exc}") from exc
    if not plain or plain[0] not in _NAMES:
        raise UnsealError("sealed DM has no encoding marker")
    return plain[1:], _NAMES[plain[0]]
