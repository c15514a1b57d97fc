"""The request fingerprint (DESIGN §4.2), byte for byte.

    sha256("1" 0x00 kind 0x00 ref 0x00 reply_to_or_empty 0x00 priority 0x00
           meta_jcs 0x00 body_sha256_hex)

Computed once at accept and frozen in the outbox row; the broker recomputes it from the
frame with this same function. Vectors live in ``schemas/vectors/fingerprint.json``.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson
import rfc8785

ENVELOPE_VERSION = "1"


_SAFE_INT = 2**53 - 1


def _plain(value: Any) -> bool:
    """True when RFC 8785 and orjson's sorted output are the same bytes for ``value``:
    printable-ASCII strings and keys (so byte order is UTF-16 order and only ``"`` and
    ``\\`` are escaped, alike in both), integers JavaScript holds exactly, booleans, null,
    and lists and objects of those. Floats, other text and big integers take rfc8785."""
    if value is None or value is True or value is False:
        return True
    if type(value) is str:
        return value.isascii() and value.isprintable()
    if type(value) is int:
        return -_SAFE_INT <= value <= _SAFE_INT
    if type(value) is list:
        return all(_plain(v) for v in value)
    if type(value) is dict:
        return all(type(k) is str and k.isascii() and k.isprintable() and _plain(v)
                   for k, v in value.items())
    return False


def meta_canonical(meta: dict[str, Any] | None) -> bytes:
    """RFC 8785 JSON of meta; empty when meta is absent, null or ``{}``.

    rfc8785 is pure Python and was ~9 % of the daemon's accept CPU for a one-key meta; meta
    that is plainly the same bytes either way goes through orjson instead."""
    if not meta:
        return b""
    if _plain(meta):
        return orjson.dumps(meta, option=orjson.OPT_SORT_KEYS)
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
