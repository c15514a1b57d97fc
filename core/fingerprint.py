"""The request fingerprint (DESIGN §4.2), byte for byte.

    sha256("1" 0x00 kind 0x00 ref 0x00 reply_to_or_empty 0x00 priority 0x00
           meta_jcs 0x00 body_sha256_hex)

Computed once at accept and frozen in the outbox row; the broker recomputes it from the
frame with this same function. Vectors live in ``schemas/vectors/fingerprint.json``.
"""

from __future__ import annotations

import hashlib
from typing import Any

import rfc8785

ENVELOPE_VERSION = "1"


def meta_canonical(meta: dict[str, Any] | None) -> bytes:
    """RFC 8785 JSON of meta; empty when meta is absent, null or ``{}``."""
    if not meta:
        return b""
    out: bytes = rfc8785.dumps(meta)
    return out


def request_fingerprint(
    kind: str,
    ref: str,
    body: bytes,
    priority: str,
    meta: dict[str, Any] | None = None,
    reply_to: str | None = None,
    meta_jcs: bytes | None = None,
) -> bytes:
    """Return the 32-byte fingerprint of one send; ``meta_jcs``, when the caller already has
    the canonical form of ``meta``, saves computing it again."""
    parts = [
        ENVELOPE_VERSION.encode(),
        kind.encode(),
        ref.encode(),
        (reply_to or "").encode(),
        priority.encode(),
        meta_canonical(meta) if meta_jcs is None else meta_jcs,
        hashlib.sha256(body).hexdigest().encode(),
    ]
    return hashlib.sha256(b"\x00".join(parts)).digest()


def prefix(fingerprint: bytes) -> str:
    """The 8-byte hex prefix that 409 bodies carry for drift debugging."""
    return fingerprint[:8].hex()
