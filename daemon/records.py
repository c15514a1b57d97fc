"""Values the daemon's layers pass each other: read out of the stores by the services and
handed to the HTTP layer, which never imports the stores (the import contract in
pyproject.toml)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Event:
    """One entry of the local event log (GET /v1/events)."""

    id: int
    type: str
    data: dict[str, Any]
    created_at: int


@dataclass(frozen=True, slots=True)
class Page:
    """A query of the inbox: entries after a seq, optionally of one topic or sender."""

    after: int | None = None
    limit: int = 100
    topic: str | None = None
    sender: str | None = None
