"""Operator tools on a stopped daemon's outbox (DESIGN §4.4): the same service code the
daemon runs, on ``outbox.db`` directly, under ``BEGIN IMMEDIATE``. A composition root of its
own, used by the CLI only when no daemon holds the mesh's lock."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from tidemesh.core.errors import NotFound
from tidemesh.core.send import parse_send_request
from tidemesh.daemon.api.validation import checked
from tidemesh.daemon.process.stores import open_outbox
from tidemesh.daemon.service.outbox import OutboxService
from tidemesh.daemon.service.retention import RetentionService, RetentionSettings
from tidemesh.daemon.store.db import INBOX_MIGRATIONS, Database

T = TypeVar("T")


def _with_service(db_path: Path, fn: Callable[[OutboxService], Awaitable[T]]) -> T:
    async def go() -> T:
        if not db_path.exists():  # noqa: ASYNC240 - a stat before the file is opened
            raise NotFound(f"no outbox at {db_path}; has a daemon for this mesh ever run?")
        db = await open_outbox(db_path, batch_max=16, recover=False)
        try:
            return await fn(OutboxService(db))
        finally:
            await db.close()

    return asyncio.run(go())


def outbox_list(db_path: Path, status: str | None, limit: int) -> dict[str, Any]:
    return _with_service(db_path, lambda svc: svc.list_rows(status, limit))


def outbox_inspect(db_path: Path, row_id: str) -> dict[str, Any]:
    return _with_service(db_path, lambda svc: svc.inspect(row_id))


def outbox_requeue(
    db_path: Path, row_id: str, new_client_message_id: str | None, patch: dict[str, Any] | None
) -> dict[str, Any]:
    """Requeue; ``patch`` is a send request body, checked exactly as the IPC route checks it."""
    parsed = None
    if patch is not None:
        parsed = parse_send_request(checked("send_request.schema.json", patch))
    return _with_service(
        db_path, lambda svc: svc.requeue(row_id, new_client_message_id, parsed, "operator")
    )


def _migrate_inbox(conn: sqlite3.Connection) -> None:
    # Not open_inbox: an operator's prune must not move a damaged inbox aside.
    INBOX_MIGRATIONS.apply_sqlite(conn)


def prune(outbox_db: Path, inbox_db: Path, settings: RetentionSettings, which: str,
          dry_run: bool) -> dict[str, Any]:
    """Retention on a stopped daemon's files, with the daemon's own settings and code."""
    async def go() -> dict[str, Any]:
        if not outbox_db.exists():  # noqa: ASYNC240 - a stat before the file is opened
            raise NotFound(f"no outbox at {outbox_db}; has a daemon for this mesh ever run?")
        out = await open_outbox(outbox_db, batch_max=16, recover=False)
        inn = None
        try:
            if which == "inbox":
                inn = await Database.open(inbox_db, _migrate_inbox)
            svc = RetentionService(out, inn, settings)
            return await (svc.prune_inbox(dry_run) if which == "inbox"
                          else svc.prune_outbox(dry_run))
        finally:
            await out.close()
            if inn is not None:
                await inn.close()

    return asyncio.run(go())
