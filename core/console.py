"""The broker console's decisions and its page, without I/O: who may see it (its own token,
loopback Host, no foreign Origin) and the HTML of a state snapshot (no external assets, no
JavaScript: it is one server-rendered page)."""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from html import escape
from urllib.parse import parse_qs, urlsplit

COOKIE = "tidemesh_console"
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})


def new_token() -> str:
    return secrets.token_urlsafe(32)


@dataclass(frozen=True, slots=True)
class Refusal:
    status: int
    code: str
    message: str


def _host(value: str) -> str:
    """The host part of a Host header or an Origin's authority."""
    if value.startswith("["):
        return value.split("]", 1)[0] + "]"
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def presented(headers: Mapping[str, str], path: str) -> str | None:
    """The token a request carries: bearer header, the console cookie, or ``?token=`` (the
    login link only)."""
    auth = headers.get("Authorization", "")
    if auth.startswith("Bearer "):
        return auth.removeprefix("Bearer ").strip()
    for part in headers.get("Cookie", "").split(";"):
        name, _, value = part.strip().partition("=")
        if name == COOKIE:
            return value
    query = parse_qs(urlsplit(path).query).get("token")
    return query[0] if query else None


def refusal(headers: Mapping[str, str], path: str, token: str) -> Refusal | None:
    """Why a console request is refused, or None. Same Host/Origin rule as the daemon's
    loopback port: a page elsewhere must not drive an operator's browser into the console
    (DNS rebinding changes the Host; a cross-site request carries a foreign Origin)."""
    host = headers.get("Host", "")
    if _host(host) not in LOOPBACK:
        return Refusal(403, "forbidden", "the console answers only on a loopback Host")
    origin = headers.get("Origin")
    if origin is not None and urlsplit(origin).netloc != host:
        return Refusal(403, "forbidden", "requests from another origin are refused")
    given = presented(headers, path)
    if given is None or not hmac.compare_digest(given.encode(), token.encode()):
        return Refusal(401, "unauthorized", "no or wrong console token")
    return None


@dataclass(frozen=True, slots=True)
class ConnRow:
    mesh: str
    pubkey: str
    name: str | None
    host: str | None
    session: str
    connected_ms: int
    muted: bool


@dataclass(frozen=True, slots=True)
class MemberRow:
    mesh: str
    pubkey: str
    name: str | None
    joined_ms: int
    revoked: bool
    online: bool


@dataclass(frozen=True, slots=True)
class View:
    now_ms: int
    loop: str
    accepts: Mapping[str, float]       # cm_broker_accept_total by status
    counts: Mapping[str, int]          # rows per store table
    connections: Sequence[ConnRow] = ()
    members: Sequence[MemberRow] = ()
    meshes: Sequence[tuple[str, str]] = field(default_factory=list)   # (id, name)


def _table(head: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    th = "".join(f"<th>{escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in r) + "</tr>"
                   for r in rows) or f'<tr><td colspan="{len(head)}">none</td></tr>'
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _ago(now_ms: int, then_ms: int) -> str:
    return f"{max(0, now_ms - then_ms) // 1000} s ago"


STYLE = ("body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse;"
         "margin-bottom:1.5em}td,th{border:1px solid #bbb;padding:.2em .6em;text-align:left}"
         "th{background:#eee}.state-ok{color:#070}.state-stalled{color:#a00}")


def render(view: View) -> str:
    names = dict(view.meshes)

    def mesh(mesh_id: str) -> str:
        return names.get(mesh_id, mesh_id)

    parts = [
        "<h1>tidemesh broker</h1>",
        f'<p>Event loop: <b class="state-{escape(view.loop)}">{escape(view.loop)}</b>; '
        f"members connected: <b id=\"connected\">{len(view.connections)}</b></p>",
        "<h2>Sends answered</h2>",
        _table(["status", "total"], sorted((k, int(v)) for k, v in view.accepts.items())),
        "<h2>Store</h2>",
        _table(["table", "rows"], sorted(view.counts.items())),
        "<h2>Meshes</h2>",
        _table(["mesh", "id"], [(n, i) for i, n in view.meshes]),
        "<h2>Members</h2>",
        _table(["mesh", "member", "key", "joined", "online", "revoked"],
               [(mesh(m.mesh), m.name or "", m.pubkey[:16], _ago(view.now_ms, m.joined_ms),
                 "yes" if m.online else "no", "yes" if m.revoked else "no")
                for m in view.members]),
        "<h2>Connections</h2>",
        _table(["mesh", "member", "key", "host", "session", "connected", "muted"],
               [(mesh(c.mesh), c.name or "", c.pubkey[:16], c.host or "", c.session,
                 _ago(view.now_ms, c.connected_ms), "yes" if c.muted else "no")
                for c in view.connections]),
    ]
    return ("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<title>tidemesh console</title><meta http-equiv=\"refresh\" content=\"5\">"
            f"<style>{STYLE}</style></head><body>{''.join(parts)}</body></html>")
