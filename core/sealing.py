"""DM bodies sealed for one recipient (DESIGN §5.2): crypto_box from the sender's X25519 key
(derived from its ed25519 member key) to the recipient's, once, at accept. The broker stores
and forwards the sealed bytes and can never read them.

The sealed plaintext is an envelope: one byte 4, a 4-byte big-endian length, a header in
canonical JSON (``{"cmid", "enc", "from", "meta", "priority", "reply_to", "to"}``), then the
body bytes. So a DM's ``meta`` and ``reply_to`` travel sealed with its body (the broker sees
them null), and its ``priority``, which the broker needs in the clear to order deliveries,
is also inside: the recipient refuses an outer priority that differs.

The header also binds the envelope to who and which (``Binding``): the sender's key, the
recipient's key and the ``client_message_id``. crypto_box's key is the same in both
directions, so without them an envelope alice sealed for bob opened on alice's host when the
broker presented it as bob's; and one re-accepted under a new id showed twice. The
recipient compares the binding with the delivery (``binding_problem``) and refuses a
mismatch. Envelopes of earlier versions (3: the header without the binding; 1 or 2: one
encoding byte, then the body) still open, with ``bound`` False, so the receiver can flag
them (docs/threat-model.md, "DM reflection and replay").

Sealing is deterministic per request (DESIGN §10): the nonce is a keyed BLAKE2b hash of
(sender, recipient, client_message_id, plaintext) under a key derived from the sender's
secret key. The same logical request thus yields the same sealed bytes, hence the same broker
fingerprint, on every path (daemon, retry, cold path), while a different body under the same
id still differs. A nonce repeats only for the same key pair and the same plaintext, so equal
ciphertexts reveal only that two requests were identical (docs/daemon.md, "DM sealing").
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import dataclass
from typing import Any

import orjson
from nacl.exceptions import CryptoError
from nacl.public import Box, PrivateKey, PublicKey
from nacl.signing import SigningKey, VerifyKey

from tidemesh.core.errors import InvalidRequest
from tidemesh.core.fingerprint import meta_canonical
from tidemesh.core.jsonbounds import META_DEPTH, deeper_than
from tidemesh.core.send import SendRequest

_ENCODINGS = {"utf8": 1, "base64": 2}
_NAMES = {v: k for k, v in _ENCODINGS.items()}
_ENVELOPE = 4
_UNBOUND_ENVELOPE = 3


@dataclass(frozen=True, slots=True)
class Binding:
    """Who sealed a DM, for whom, under which ``client_message_id`` (keys as hex)."""

    sender: str
    recipient: str
    client_message_id: str


@dataclass(frozen=True, slots=True)
class Opened:
    """What a sealed DM held. ``sealed_fields`` is False for an envelope of the first
    version, which held the body alone (its meta and reply_to came in the clear);
    ``binding`` is None for envelopes before version 4."""

    body: bytes
    encoding: str
    meta: dict[str, Any] | None = None
    reply_to: str | None = None
    priority: str | None = None
    sealed_fields: bool = False
    binding: Binding | None = None

    @property
    def bound(self) -> bool:
        return self.binding is not None


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


def envelope(body: bytes, encoding: str, meta: dict[str, Any] | None, reply_to: str | None,
             priority: str, binding: Binding) -> bytes:
    """The plaintext sealed for a DM: the same request gives the same bytes (its meta in
    canonical form, keys sorted), so the nonce, the ciphertext and the broker's
    fingerprint repeat."""
    meta_json = meta_canonical(meta) or b"null"
    header = b"".join((
        b'{"cmid":', orjson.dumps(binding.client_message_id), b',"enc":', orjson.dumps(encoding),
        b',"from":', orjson.dumps(binding.sender), b',"meta":', meta_json,
        b',"priority":', orjson.dumps(priority), b',"reply_to":', orjson.dumps(reply_to),
        b',"to":', orjson.dumps(binding.recipient), b"}"))
    return bytes([_ENVELOPE]) + len(header).to_bytes(4, "big") + header + body


def seal(sender: SigningKey, recipient_pubkey_hex: str, client_message_id: str, body: bytes,
         encoding: str, meta: dict[str, Any] | None = None, reply_to: str | None = None,
         priority: str = "next") -> bytes:
    """Seal the body with its meta, reply_to and priority for the recipient; the same
    arguments always give the same bytes."""
    try:
        recipient = _x25519_public(recipient_pubkey_hex)
    except CryptoError as exc:  # 64 hex digits, but not a point on the curve
        raise InvalidRequest("dm ref is not an ed25519 public key; no member can have it",
                             field="to.ref") from exc
    box = Box(_x25519_private(sender), recipient)
    binding = Binding(sender.verify_key.encode().hex(), recipient_pubkey_hex.lower(),
                      client_message_id)
    plain = envelope(body, encoding, meta, reply_to, priority, binding)
    return bytes(box.encrypt(plain, _nonce(sender, recipient, client_message_id, plain)))


def seal_request(sender: SigningKey, req: SendRequest, client_message_id: str) -> SendRequest:
    """A DM request as it is stored and sent: body, meta, reply_to and priority sealed into
    the body; meta and reply_to left null outside; priority kept outside for the broker."""
    sealed = seal(sender, req.to.ref, client_message_id, req.body, req.body_encoding, req.meta,
                  req.reply_to, req.priority.value)
    return dataclasses.replace(req, body=sealed, body_encoding="base64", meta=None,
                               reply_to=None, meta_jcs=b"")


def unseal(recipient: SigningKey, sender_pubkey_hex: str, sealed: bytes) -> Opened:
    """Open a DM sealed by ``sender_pubkey_hex`` for ``recipient``."""
    return unseal_with(_x25519_private(recipient), sender_pubkey_hex, sealed)


def unseal_with(recipient: PrivateKey, sender_pubkey_hex: str, sealed: bytes) -> Opened:
    """``unseal`` with the recipient's X25519 key itself: one kept in the archive of
    rotated-out keys (docs/threat-model.md, "Key rotation")."""
    try:
        box = Box(recipient, _x25519_public(sender_pubkey_hex))
        plain = box.decrypt(sealed)
    except (CryptoError, ValueError) as exc:
        raise UnsealError(f"cannot open DM from {sender_pubkey_hex[:16]}…: {exc}") from exc
    if not plain:
        raise UnsealError("sealed DM is empty")
    if plain[0] in _NAMES:
        return Opened(plain[1:], _NAMES[plain[0]])
    if plain[0] not in (_ENVELOPE, _UNBOUND_ENVELOPE) or len(plain) < 5:
        raise UnsealError("sealed DM has no encoding marker")
    size = int.from_bytes(plain[1:5], "big")
    try:
        header = orjson.loads(plain[5:5 + size])
        encoding, meta = header["enc"], header["meta"]
        reply_to, priority = header["reply_to"], header["priority"]
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        raise UnsealError(f"sealed DM has a bad envelope header: {exc}") from exc
    if (not isinstance(encoding, str) or encoding not in _ENCODINGS
            or (meta is not None and not isinstance(meta, dict))):
        raise UnsealError("sealed DM has a bad envelope header")
    binding = None
    if plain[0] == _ENVELOPE:
        parts = header.get("from"), header.get("to"), header.get("cmid")
        if not all(isinstance(p, str) for p in parts):
            raise UnsealError("sealed DM's envelope does not say who sealed it for whom")
        binding = Binding(*parts)
    return Opened(plain[5 + size:], encoding, meta, reply_to, priority, sealed_fields=True,
                  binding=binding)


def binding_problem(opened: Opened, sender: str, recipient: str,
                    client_message_id: str | None) -> str | None:
    """Why an opened DM is not the one its delivery says it is (None when it is): the
    envelope was sealed by another member (a DM reflected back to its sender), for another
    key, or under another id (one re-accepted to show twice)."""
    b = opened.binding
    if b is None:
        return None
    if b.sender != sender:
        return (f"sealed by {b.sender[:16]}…, delivered as from {sender[:16]}…: "
                "a reflected or re-sent envelope")
    if b.recipient != recipient:
        return f"sealed for {b.recipient[:16]}…, delivered to {recipient[:16]}…"
    if b.client_message_id != client_message_id:
        return (f"sealed as message {b.client_message_id!r}, delivered as "
                f"{client_message_id!r}: a replayed envelope")
    return None


# A sealed reply_to is what a clear one may be: a broker message id (a ULID) or null.
_ULID = re.compile(r"[0-9A-HJKMNP-TV-Z]{26}")


def sealed_fields_problems(opened: Opened) -> dict[str, str]:
    """What an opened envelope holds that a clear send could not: each field with its
    reason (empty when all is well). The sender sealed it, so the broker could not check it;
    the recipient checks it as the daemon checks a send (``core/send``): meta an object of
    at most ``META_DEPTH`` levels with a canonical form, reply_to a ULID or null, a UTF-8
    body valid UTF-8. A hostile member's header must not reach the inbox's writer as is."""
    if not opened.sealed_fields:
        return {}
    problems: dict[str, str] = {}
    meta = opened.meta
    if meta is not None:
        if deeper_than(meta, META_DEPTH):
            problems["meta"] = f"nests deeper than {META_DEPTH} levels"
        else:
            try:
                meta_canonical(meta)
            except (ValueError, TypeError, OverflowError) as exc:
                problems["meta"] = f"cannot be canonicalized: {exc}"
    if opened.reply_to is not None and not (
            isinstance(opened.reply_to, str) and _ULID.fullmatch(opened.reply_to)):
        problems["reply_to"] = "is not a broker message id (a ULID) or null"
    if opened.encoding == "utf8":
        try:
            opened.body.decode("utf-8")
        except UnicodeDecodeError:
            problems["body"] = "is marked UTF-8 but is not"
    return problems
