"""Invite strings: ``tm1.`` + base64url(JSON {url, mesh_id, mesh, token}), no padding.

The token is a random secret; the broker keeps only its sha256 (``token_hash``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import secrets
from dataclasses import dataclass

from tidemesh.core.errors import InvalidRequest

PREFIX = "tm1."


@dataclass(frozen=True, slots=True)
class Invite:
    url: str          # ws:// or wss:// address of the broker
    mesh_id: str
    mesh: str         # mesh name
    token: str

    def encode(self) -> str:
        data = {"url": self.url, "mesh_id": self.mesh_id, "mesh": self.mesh, "token": self.token}
        raw = json.dumps(data, separators=(",", ":"), sort_keys=True).encode()
        return PREFIX + base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def new_token() -> str:
    return secrets.token_urlsafe(24)


def token_hash(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def decode(text: str) -> Invite:
    text = text.strip()
    if not text.startswith(PREFIX):
        raise InvalidRequest(f"an invite starts with {PREFIX!r}", field="invite")
    body = text.removeprefix(PREFIX)
    try:
        data = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        invite = Invite(str(data["url"]), str(data["mesh_id"]), str(data["mesh"]),
                        str(data["token"]))
    except (binascii.Error, ValueError, KeyError, TypeError) as exc:
        raise InvalidRequest(f"the invite is damaged: {exc}", field="invite") from exc
    if not invite.url.startswith(("ws://", "wss://")):
        raise InvalidRequest("the invite's broker url must be ws:// or wss://", field="invite")
    return invite


_UNITS_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}


def parse_duration_ms(text: str) -> int:
    """``30m``, ``12h``, ``7d``, ``2w`` → milliseconds."""
    text = text.strip().lower()
    unit = _UNITS_MS.get(text[-1:]) if text else None
    if unit is None or not text[:-1].isdigit() or int(text[:-1]) <= 0:
        raise InvalidRequest(f"duration {text!r} must look like 30m, 12h, 7d or 2w",
                             field="expires")
    return int(text[:-1]) * unit
