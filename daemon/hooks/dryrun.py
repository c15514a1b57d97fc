"""``tidemesh daemon hooks test``: run one hook once, by hand, outside the ledger."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tidemesh.core import hooks as rules
from tidemesh.daemon.hooks.files import read_config
from tidemesh.daemon.hooks.launch import run_for_event
from tidemesh.daemon.hooks.runner import RunResult, Sandbox


async def dry_run(folder: Path, name: str, mesh: str, socket: Path,
                  event: dict[str, Any] | None = None) -> tuple[bytes, RunResult]:
    """Run ``name`` with ``event`` (or a sample) as the daemon would, minus the ledger and
    the reply token; returns what it read on stdin and how it ended."""
    cfg = read_config(folder).get(name, rules.HookConfig(name))
    doc = event if event is not None else rules.sample_event(name, int(time.time() * 1000))
    stdin = rules.encode_capped(rules.redact(doc, cfg.redact_payload))
    return stdin, await run_for_event(folder, mesh, socket, cfg,
                                      str(doc.get("event_id", "dry-run")), doc,
                                      await Sandbox.probe())
