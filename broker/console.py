"""``/console`` on the broker's HTTP port: the read-only operator page (core/console.py
decides and renders; this reads the state and answers). Off unless ``console.enabled``."""

from __future__ import annotations

import os
from collections.abc import Mapping
from http import HTTPStatus
from pathlib import Path

import structlog

from tidemesh.broker.service import BrokerService
from tidemesh.broker.service.connections import now_ms
from tidemesh.core import console
from tidemesh.core.wire import encode

log = structlog.get_logger(__name__)
TOKEN_FILE = "console-token"  # noqa: S105 - a file name, not a secret


def token_path(home: Path) -> Path:
    return home / TOKEN_FILE


def ensure_token(home: Path) -> str:
    """The console's own token (not a member's, not the daemon's): made once, 0600."""
    path = token_path(home)
    if path.exists():
        return path.read_text().strip()
    home.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(console.new_token() + "\n")
    log.info("console_token_created", path=str(path))
    return path.read_text().strip()


class Console:
    def __init__(self, service: BrokerService, token: str) -> None:
        self.service = service
        self.token = token

    async def respond(self, headers: Mapping[str, str], path: str, loop_state: str
                      ) -> tuple[HTTPStatus, dict[str, str], str]:
        """The answer to one console request: status, headers, body (server.py sends it)."""
        refused = console.refusal(headers, path, self.token)
        if refused is not None:
            log.warning("console_refused", code=refused.code, path=path.split("?")[0])
            body = encode({"error": {"code": refused.code, "message": refused.message}})
            return HTTPStatus(refused.status), {"Content-Type": "application/json"}, body + "\n"
        if "token=" in path:
            # The login link: the token goes into a cookie and out of the address bar.
            return HTTPStatus.SEE_OTHER, {
                "Location": "/console",
                "Set-Cookie": f"{console.COOKIE}={self.token}; Path=/console; HttpOnly; "
                              "SameSite=Strict"}, ""
        if path.split("?")[0].rstrip("/") != "/console":
            return HTTPStatus.NOT_FOUND, {"Content-Type": "text/plain"}, "not found\n"
        page = console.render(await self.view(loop_state))
        return HTTPStatus.OK, {
            "Content-Type": "text/html; charset=utf-8", "Cache-Control": "no-store",
            "X-Frame-Options": "DENY",
            "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'"}, page

    async def view(self, loop_state: str) -> console.View:
        service, store = self.service, self.service.store
        conns = [c for group in service.connections.conns.values() for c in group]
        rows = [console.ConnRow(c.mesh_id, c.pubkey, c.display_name, c.host, c.session_id,
                                c.connected_at, c.muted) for c in conns]
        online = {(c.mesh_id, c.pubkey) for c in conns}
        meshes: list[tuple[str, str]] = []
        members: list[console.MemberRow] = []
        for mesh_id in sorted({c.mesh_id for c in conns}):
            mesh = await store.find_mesh(mesh_id)
            meshes.append((mesh_id, mesh.name if mesh is not None else mesh_id))
            members += [console.MemberRow(m.mesh_id, m.pubkey, m.display_name, m.joined_at,
                                          m.revoked_at is not None,
                                          (m.mesh_id, m.pubkey) in online)
                        for m in await store.list_members(mesh_id)]
        accepts = {s.labels["status"]: s.value
                   for metric in service.metrics.accepts.collect() for s in metric.samples
                   if s.name.endswith("_total")}
        return console.View(now_ms(), loop_state, accepts, await store.counts(), rows,
                            members, meshes)
