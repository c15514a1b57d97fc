"""Which versions work together (spec §15.3-15.4): the ranges a daemon publishes at
``GET /v1/compat``, and the check a client makes against them (pure).

A range is comma-separated clauses that must all hold: ``>=0.1.0``, ``<0.2.0``, ``==0.1.3``,
or a pattern such as ``0.1.x`` (``*`` is any version). Before 1.0 a new minor version may
break, so each range stops at the next minor. The policy when a client does not fit: a
different ``ipc_api`` major makes the CLI try its cold path (which runs only while no daemon
holds the mesh's lock) and the SDK raise; a client version outside the daemon's range is
refused with both versions named.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from tidemesh.core import features

IPC_API = "v1"
COMPATIBLE_BROKERS = ">=0.1.0,<0.2.0"
COMPATIBLE_CLIS = ">=0.1.0,<0.2.0"
COMPATIBLE_SDKS: Mapping[str, str] = {
    "python": ">=0.1.0,<0.2.0", "go": ">=0.1.0,<0.2.0", "typescript": ">=0.1.0,<0.2.0",
}

_CLAUSE = re.compile(r"^(>=|<=|==|>|<)?\s*([0-9x*][0-9a-zA-Z.*+-]*)$")


def parse_version(text: str) -> tuple[int, ...] | None:
    """``1.2.3`` (a pre-release or build suffix ignored) as numbers; None when not one."""
    m = re.match(r"^v?(\d+)(?:\.(\d+))?(?:\.(\d+))?", text.strip())
    if m is None:
        return None
    return tuple(int(g) if g is not None else 0 for g in m.groups())


def fits(range_: str, version: str) -> bool:
    """Whether ``version`` is in ``range_``; False for a version or range not understood."""
    parsed = parse_version(version)
    clauses = [c.strip() for c in range_.split(",") if c.strip()]
    if parsed is None or not clauses:
        return False
    return all(_holds(clause, parsed) for clause in clauses)


def _holds(clause: str, version: tuple[int, ...]) -> bool:
    m = _CLAUSE.match(clause)
    if m is None:
        return False
    op, text = m.group(1), m.group(2)
    if op is None and ("x" in text or "*" in text):
        parts = text.split(".")
        return all(p in ("x", "*") or (p.isdigit() and int(p) == v)
                   for p, v in zip(parts, version, strict=False))
    bound = parse_version(text)
    if bound is None:
        return False
    return {None: version == bound, "==": version == bound, ">=": version >= bound,
            ">": version > bound, "<=": version <= bound, "<": version < bound}[op]


def api_major(ipc_api: Any) -> int | None:
    """``"v1"`` (or ``"v1.2"``) -> 1; None when not of that form."""
    m = re.match(r"^v(\d+)(?:\.\d+)?$", ipc_api) if isinstance(ipc_api, str) else None
    return int(m.group(1)) if m else None


def document(daemon_version: str, broker_version: str | None) -> dict[str, Any]:
    """The body of ``GET /v1/compat``."""
    return {
        "daemon": daemon_version,
        "ipc_api": IPC_API,
        "compatible_brokers": COMPATIBLE_BROKERS,
        "required_broker_features": list(features.REQUIRED),
        "optional_broker_features": list(features.OPTIONAL),
        "broker": {"version": broker_version,
                   "fits": None if broker_version is None
                   else fits(COMPATIBLE_BROKERS, broker_version)},
        "compatible_clis": COMPATIBLE_CLIS,
        "compatible_sdks": dict(COMPATIBLE_SDKS),
    }


def misfit(doc: Mapping[str, Any], client: str, version: str,
           ipc_api: str = IPC_API) -> tuple[str, str] | None:
    """Why ``client`` ("cli", or an SDK's language) at ``version``, speaking ``ipc_api``,
    cannot use the daemon that answered ``doc``: ``("ipc_api", message)`` for a different
    API major, ``("version", message)`` for a version outside the daemon's range; None when
    it fits. A range the daemon does not publish is no objection."""
    daemon = doc.get("daemon", "?")
    theirs = doc.get("ipc_api")
    if api_major(theirs) != api_major(ipc_api):
        return ("ipc_api", f"the daemon ({daemon}) speaks IPC API {theirs}, this {client} "
                           f"({version}) speaks {ipc_api}")
    range_ = (doc.get("compatible_clis") if client == "cli"
              else (doc.get("compatible_sdks") or {}).get(client))
    if isinstance(range_, str) and not fits(range_, version):
        return ("version", f"the daemon ({daemon}) works with {client} versions {range_}, "
                           f"and this {client} is {version}")
    return None
