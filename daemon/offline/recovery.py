"""``daemon recover``: check both databases and the key files of a stopped daemon, say what
is wrong and what will be done (``--dry-run`` stops there), then do it; never silently.

- a damaged inbox is moved aside; the daemon starts with an empty one and the broker
  redelivers what this member has not acknowledged (``STALE_SEQUENCE`` names what it pruned);
- a damaged outbox has every row that can still be read copied into a new outbox, the rest
  listed (by rowid) in ``salvage-report.json`` beside the moved-aside copy;
- a malformed key archive is quarantined (``*.malformed-<time>``); a missing or unreadable
  host fingerprint is written for this host; a damaged keypair or mesh.json cannot be
  rebuilt here: the plan says to restore a backup (or join again) and nothing is done to it.

``check`` is read-only; ``carry_out`` acts on the plan it made.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from nacl.signing import SigningKey

from tidemesh.core.paths import DaemonPaths
from tidemesh.daemon.membership import identity
from tidemesh.daemon.membership.departure import aside_dir
from tidemesh.daemon.store.db import OUTBOX_MIGRATIONS

ARCHIVE = "keypair-archive.json"
# Rowids probed one by one when a table cannot be scanned in order; past this the report
# says the rest was not looked at.
MAX_PROBE = 5_000_000


@dataclass(frozen=True, slots=True)
class Finding:
    target: str            # outbox.db, inbox.db, keypair.json, …
    state: str             # ok | missing | damaged
    detail: str = ""
    action: str = "none"   # none | move_aside_inbox | salvage_outbox | quarantine |
    #                        write_host_fingerprint | restore_from_backup
    plan: str = ""


@dataclass(slots=True)
class Plan:
    mesh: str
    findings: list[Finding] = field(default_factory=list)

    @property
    def actions(self) -> list[Finding]:
        return [f for f in self.findings if f.action != "none"]

    @property
    def unrepairable(self) -> list[Finding]:
        return [f for f in self.findings if f.action == "restore_from_backup"]

    def to_json(self) -> dict[str, Any]:
        return {"mesh": self.mesh, "healthy": not self.actions,
                "findings": [asdict(f) for f in self.findings]}


def _db_problem(path: Path) -> str | None:
    """None when the database opens and passes its integrity check."""
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.DatabaseError as exc:
        return str(exc)
    try:
        rows = [r[0] for r in conn.execute("PRAGMA integrity_check").fetchall()]
    except sqlite3.DatabaseError as exc:
        return str(exc)
    finally:
        conn.close()
    return None if rows == ["ok"] else "; ".join(rows[:5])


def _json_problem(path: Path) -> str | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return str(exc)
    return None if isinstance(data, dict) else "not a JSON object"


def _keypair_problem(path: Path) -> str | None:
    problem = _json_problem(path)
    if problem:
        return problem
    data = json.loads(path.read_text(encoding="utf-8"))
    try:
        key = SigningKey(bytes.fromhex(data["ed25519_seed"]))
    except (KeyError, TypeError, ValueError) as exc:
        return f"no usable ed25519_seed: {exc!r}"
    if data.get("ed25519_public") not in (None, bytes(key.verify_key).hex()):
        return "ed25519_public does not match the seed"
    return None


def check(paths: DaemonPaths, mesh: str) -> Plan:
    """What is wrong and what recover would do (reads only)."""
    plan = Plan(mesh)
    add = plan.findings.append
    for name, path in (("outbox.db", paths.outbox_db), ("inbox.db", paths.inbox_db)):
        if not path.exists():
            add(Finding(name, "missing", "created empty at the next start"))
            continue
        problem = _db_problem(path)
        if problem is None:
            add(Finding(name, "ok"))
        elif name == "inbox.db":
            add(Finding(name, "damaged", problem, "move_aside_inbox",
                        "move it aside; the daemon starts with an empty inbox and the broker "
                        "redelivers what this member has not acknowledged"))
        else:
            add(Finding(name, "damaged", problem, "salvage_outbox",
                        "copy every readable row into a new outbox, list the unreadable ones "
                        "in salvage-report.json, keep the damaged file aside"))
    problem = _keypair_problem(paths.keypair) if paths.keypair.exists() else "missing"
    add(Finding("keypair.json", "ok") if problem is None else Finding(
        "keypair.json", "missing" if problem == "missing" else "damaged", problem,
        "restore_from_backup", "cannot be rebuilt: `tidemesh daemon restore BACKUP` (after "
        "`daemon reset`), or `daemon reset` and join again as a new member"))
    if not paths.mesh_file.exists():
        add(Finding("mesh.json", "missing", "not joined to a mesh (`daemon join`)"))
    elif (problem := _json_problem(paths.mesh_file)) is not None:
        add(Finding("mesh.json", "damaged", problem, "restore_from_backup",
                    "restore a backup, or `daemon reset` and join again"))
    else:
        add(Finding("mesh.json", "ok"))
    problem = (_json_problem(paths.host_fingerprint) if paths.host_fingerprint.exists()
               else None)
    add(Finding("host_fingerprint.json", "ok") if problem is None else Finding(
        "host_fingerprint.json", "damaged", problem, "write_host_fingerprint",
        "write this host's fingerprint (as accept-host does)"))
    archive = paths.data_dir / ARCHIVE
    if archive.exists():
        problem = _json_problem(archive)
        add(Finding(ARCHIVE, "ok") if problem is None else Finding(
            ARCHIVE, "damaged", problem, "quarantine",
            f"move it to {ARCHIVE}.malformed-<time>; DMs sealed to rotated-out keys no "
            "longer open"))
    return plan


def carry_out(plan: Plan, paths: DaemonPaths, environ: Mapping[str, str],
              current_host: str) -> list[dict[str, Any]]:
    """Do what ``plan`` says, one finding at a time; returns what was done."""
    done: list[dict[str, Any]] = []
    aside: Path | None = None

    def aside_folder() -> Path:
        nonlocal aside
        if aside is None:
            aside = aside_dir(plan.mesh, "recover", environ)
            aside.mkdir(parents=True, mode=0o700)
        return aside

    for f in plan.actions:
        if f.action == "move_aside_inbox":
            moved = _move_db(paths.inbox_db, aside_folder())
            done.append({"target": f.target, "done": "moved aside", "to": moved})
        elif f.action == "salvage_outbox":
            done.append({"target": f.target, **salvage_outbox(paths.outbox_db,
                                                              aside_folder())})
        elif f.action == "quarantine":
            src = paths.data_dir / ARCHIVE
            dst = src.with_name(f"{ARCHIVE}.malformed-{int(time.time())}")
            src.rename(dst)
            done.append({"target": f.target, "done": "quarantined", "to": str(dst)})
        elif f.action == "write_host_fingerprint":
            identity.accept_host(paths.host_fingerprint, current_host)
            done.append({"target": f.target, "done": "written for this host"})
        else:
            done.append({"target": f.target, "done": "nothing: " + f.plan})
    return done


def _move_db(db: Path, to: Path) -> str:
    for suffix in ("", "-wal", "-shm"):
        src = Path(f"{db}{suffix}")
        if src.exists():
            src.rename(to / src.name)
    return str(to / db.name)


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]


def _rows(old: sqlite3.Connection, table: str, cols: list[str]
          ) -> tuple[list[tuple[Any, ...]], list[int], int | None]:
    """The table's readable rows; the rowids that could not be read; where probing stopped."""
    select = f"SELECT {', '.join(cols)} FROM {table}"   # noqa: S608 - names from PRAGMA
    try:
        return list(old.execute(select + " ORDER BY rowid")), [], None
    except sqlite3.DatabaseError:
        pass
    rows: list[tuple[Any, ...]] = []
    lost: list[int] = []
    try:
        top = int(old.execute(f"SELECT max(rowid) FROM {table}").fetchone()[0] or 0)  # noqa: S608
    except sqlite3.DatabaseError:
        top = MAX_PROBE
    stop = min(top, MAX_PROBE)
    for rowid in range(1, stop + 1):
        try:
            row = old.execute(select + " WHERE rowid = ?", (rowid,)).fetchone()
        except sqlite3.DatabaseError:
            lost.append(rowid)
            continue
        if row is not None:
            rows.append(row)
    return rows, lost, (stop if top > MAX_PROBE else None)


def _indexed(conn: sqlite3.Connection, table: str) -> dict[int, dict[str, Any]]:
    """rowid -> the values the table's full (not partial) indexes hold for it, read from
    the indexes alone: what is left of a row whose table page is lost."""
    found: dict[int, dict[str, Any]] = {}
    try:
        indexes = [(r[1], r[4]) for r in conn.execute(f"PRAGMA index_list({table})")]
    except sqlite3.DatabaseError:
        return found
    for name, partial in indexes:
        if partial:
            continue
        try:
            cols = [r[2] for r in conn.execute(f"PRAGMA index_info({name})") if r[2]]
            sql = (f"SELECT rowid, {', '.join(cols)} FROM {table}"  # noqa: S608
                   f" INDEXED BY {name}")
            for row in conn.execute(sql):
                found.setdefault(row[0], {}).update(zip(cols, row[1:], strict=True))
        except sqlite3.DatabaseError:
            continue
    return found


def salvage_outbox(db: Path, aside: Path) -> dict[str, Any]:
    """Move the damaged outbox aside and build a new one from what can be read of it."""
    damaged = Path(_move_db(db, aside))
    old = sqlite3.connect(f"file:{damaged}?mode=ro", uri=True)
    new = sqlite3.connect(db, isolation_level=None)
    report: dict[str, Any] = {"damaged_copy": str(damaged), "tables": {}}
    try:
        OUTBOX_MIGRATIONS.apply_sqlite(new)
        tables = [r[0] for r in new.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'"
            " AND name NOT LIKE 'sqlite_%' AND name != 'schema_migrations'")]
        new.execute("BEGIN IMMEDIATE")
        for table in tables:
            try:
                cols = [c for c in _columns(old, table) if c in set(_columns(new, table))]
            except sqlite3.DatabaseError as exc:
                report["tables"][table] = {"copied": 0, "error": str(exc)}
                continue
            if not cols:
                continue
            rows, lost, stopped = _rows(old, table, ["rowid", *cols])
            marks = ", ".join("?" for _ in cols)
            new.executemany(f"INSERT OR IGNORE INTO {table} ({', '.join(cols)})"  # noqa: S608
                            f" VALUES ({marks})", [r[1:] for r in rows])
            # Rows the table lost but an index still names: the report lists them with
            # what the index knows (for the outbox: id and client_message_id).
            copied = {r[0] for r in rows}
            known = _indexed(old, table)
            missing = [{"rowid": rid, **known[rid]} for rid in sorted(known)
                       if rid not in copied]
            missing += [{"rowid": rid} for rid in lost if rid not in known]
            report["tables"][table] = {"copied": len(rows), "lost": missing,
                                       **({"probed_up_to": stopped} if stopped else {})}
        new.execute("COMMIT")
    finally:
        old.close()
        new.close()
    db.chmod(0o600)
    report["done"] = "salvaged"
    (aside / "salvage-report.json").write_text(json.dumps(report, indent=2) + "\n",
                                               encoding="utf-8")
    report["report"] = str(aside / "salvage-report.json")
    return report
