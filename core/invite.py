"""Invite strings: ``tm1.`` + base64url(JSON {url, mesh_id, mesh, token[, fallbacks]}), no
padding; ``mesh`` fits ``core.paths.NAME`` (it becomes a folder name). ``fallbacks`` lists
further brokers of the mesh (several brokers on one PostgreSQL); an invite with one broker
omits it, so older hosts still read it.

The token is a random secret; the broker keeps only its sha256 (``token_hash``). A refused
invite closes the join with reason ``invite_invalid:<why>`` (``Refusal``), which the joining
host turns back into a sentence (``explain_refusal``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import secrets
from dataclasses import dataclass
from enum import StrEnum

from tidemesh.core.errors import InvalidRequest
from tidemesh.core.paths import check_name

PREFIX = "tm1."


@dataclass(frozen=True, slots=True)
class Invite:
    url: str          # ws:// or wss:// address of the broker
    mesh_id: str
    mesh: str         # mesh name
    token: str
    fallbacks: tuple[str, ...] = ()   # the mesh's other brokers, tried in order

    @property
    def urls(self) -> tuple[str, ...]:
        return (self.url, *self.fallbacks)

    def encode(self) -> str:
        data: dict[str, object] = {"url": self.url, "mesh_id": self.mesh_id, "mesh": self.mesh,
                                   "token": self.token}
        if self.fallbacks:
            data["fallbacks"] = list(self.fallbacks)
        raw = json.dumps(data, separators=(",", ":"), sort_keys=True).encode()
        return PREFIX + base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


class Refusal(StrEnum):
    """Why the broker would not redeem an invite."""

    UNKNOWN = "unknown"
    REVOKED = "revoked"
    EXPIRED = "expired"
    USED_UP = "used_up"


REFUSED = "invite_invalid"
_EXPLAINED = {
    Refusal.UNKNOWN: "the invite is unknown to this broker (mistyped, or made for another "
                     "broker or store); ask the operator for a new one",
    Refusal.REVOKED: "the invite was revoked; ask the operator for a new one",
    Refusal.EXPIRED: "the invite has expired; ask the operator for a new one "
                     "(`tidemesh broker invite create --expires …`)",
    Refusal.USED_UP: "the invite is used up: all its uses were redeemed; ask the operator for "
                     "a new one (`tidemesh broker invite create --uses N`)",
}


def refusal(row: tuple[int, int, int | None, int | None] | None, now_ms: int) -> Refusal:
    """Why an invite row (uses, max_uses, expires_at, revoked_at), or None when no invite has
    the token, cannot be redeemed at ``now_ms``."""
    if row is None:
        return Refusal.UNKNOWN
    uses, max_uses, expires_at, revoked_at = row
    if revoked_at is not None:
        return Refusal.REVOKED
    if expires_at is not None and expires_at <= now_ms:
        return Refusal.EXPIRED
    if uses >= max_uses:
        return Refusal.USED_UP
    raise ValueError("the invite is redeemable")


def refusal_reason(why: Refusal) -> str:
    """The close reason for a refused join: ``invite_invalid:<why>``."""
    return f"{REFUSED}:{why.value}"


def explain_refusal(reason: str) -> str | None:
    """The sentence for a close reason made by ``refusal_reason``, else None."""
    kind, _, why = reason.partition(":")
    if kind != REFUSED or why not in Refusal.__members__.values():
        return None
    return _EXPLAINED[Refusal(why)]


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
        fallbacks = data.get("fallbacks", [])
        if not isinstance(fallbacks, list):
            raise TypeError("fallbacks must be a list")
        invite = Invite(str(data["url"]), str(data["mesh_id"]), str(data["mesh"]),
                        str(data["token"]), tuple(str(u) for u in fallbacks))
    except (binascii.Error, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InvalidRequest(f"the invite is damaged: {exc}", field="invite") from exc
    check_broker_urls(invite.urls, "invite")
    # The name becomes the local mesh's folder unless --mesh says otherwise: an edited
    # invite must not point the join's files out of the home.
    check_name(invite.mesh, field="invite.mesh")
    return invite


def check_broker_urls(urls: tuple[str, ...], field: str) -> None:
    for url in urls:
        if not url.startswith(("ws://", "wss://")):
            raise InvalidRequest(f"a broker url must be ws:// or wss://, not {url!r}",
                                 field=field)


_UNITS_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}


def parse_duration_ms(text: str) -> int:
    """``30m``, ``12h``, ``7d``, ``2w`` → milliseconds."""
    text = text.strip().lower()
    unit = _UNITS_MS.get(text[-1:]) if text else None
    if unit is None or not text[:-1].isdigit() or int(text[:-1]) <= 0:
        raise InvalidRequest(f"duration {text!r} must look like 30m, 12h, 7d or 2w",
                             field="expires")
    return int(text[:-1]) * unit
