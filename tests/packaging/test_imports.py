"""The import contracts hold on the tree, and adding a forbidden import breaks `make check`."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "importcheck.py"
FOLDERS = ("tidemesh", "core", "storage", "daemon", "broker", "cli", "client", "agent", "spark",
           "schemas", "migrations")


def _check(repo: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), "--repo", str(repo)],
                          capture_output=True, text=True, check=False, timeout=120)


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    for folder in FOLDERS:
        shutil.copytree(REPO / folder, tmp_path / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_every_contract_holds_on_the_tree() -> None:
    res = _check(REPO)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "BROKEN" not in res.stdout


@pytest.mark.parametrize(("module", "line", "contract"), [
    ("daemon/api/handlers.py", "from tidemesh.daemon.store import outbox as _o",
     "the daemon's HTTP layer reaches storage only through services"),
    ("cli/commands/send.py", "from tidemesh.daemon.link import relay as _r",
     "cli reaches daemon and broker only through their roots and admin facades"),
    ("client/sync.py", "from tidemesh.daemon import records as _d",
     "the SDK imports only core and itself"),
    ("agent/handlers.py", "from tidemesh.daemon import records as _d",
     "the MCP server reaches the daemon only through the SDK"),
    ("core/fingerprint.py", "import tidemesh.daemon.main as _m",
     "core imports none of tidemesh's I/O packages"),
    ("storage/sqlite.py", "from tidemesh.daemon.link import relay as _r",
     "storage (the write engines) imports only core and itself"),
    ("core/fingerprint.py", "import tidemesh.storage.sqlite as _s",
     "core imports none of tidemesh's I/O packages"),
    ("daemon/link/relay.py", "from tidemesh.broker import accept as _a",
     "daemon and broker never import each other"),
    ("daemon/store/search.py", "from tidemesh.daemon.service import events as _e",
     "the daemon's layers: api above service above store"),
    ("daemon/link/receiver.py", "from tidemesh.daemon.store import inbox as _i",
     "the broker link reaches the daemon's databases only through services"),
    ("daemon/service/presence.py", "import sqlite3 as _s",
     "the daemon's services and broker link reach SQLite only through the store"),
    ("broker/store/base.py", "from tidemesh.broker.service import send as _s",
     "the broker's layers: server above service above store"),
])
def test_a_forbidden_import_breaks_the_check(copy: Path, module: str, line: str,
                                             contract: str) -> None:
    target = copy / module
    target.write_text(target.read_text("utf-8") + f"\n{line}  # noqa\n", "utf-8")
    res = _check(copy)
    assert res.returncode != 0
    assert f"{contract} BROKEN" in res.stdout, res.stdout[-3000:]
