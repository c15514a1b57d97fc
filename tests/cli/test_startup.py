"""What a command imports decides how long it takes to start (about 1 s when every command
module was imported up front). Asserted as imports, not timings."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# The write engines, not the storage package: its instance lock (fcntl only) is what tells
# status whether a daemon runs.
HEAVY = ("aiohttp", "asyncpg", "websockets", "aiosqlite", "tidemesh.daemon.main",
         "tidemesh.broker", "tidemesh.daemon.link.websocket", "tidemesh.daemon.offline.coldpath",
         "tidemesh.storage.sqlite", "tidemesh.storage.postgres")

PROBE = "HEAVY = " + repr(HEAVY) + """
import json, sys
from click.testing import CliRunner
from tidemesh.cli.main import cli
result = CliRunner().invoke(cli, sys.argv[1:])
heavy = sorted({m for m in sys.modules for h in HEAVY if m == h or m.startswith(h + ".")})
print(json.dumps({"exit": result.exit_code, "heavy": heavy}))
"""


def _imports(*args: str) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True,
                         check=True, timeout=60)
    return dict(json.loads(out.stdout.splitlines()[-1]))


def test_version_loads_no_daemon_broker_or_network_code() -> None:
    # (--help imports every listed command for its summary line; that is the price of it.)
    assert _imports("--version") == {"exit": 0, "heavy": []}


@pytest.mark.parametrize("args", [("daemon", "status"), ("daemon", "ps")])
def test_looking_at_a_stopped_daemon_loads_no_daemon_internals(args: tuple[str, ...]) -> None:
    assert _imports(*args, *(["--mesh", "nosuch"] if args[1] == "status" else []))["heavy"] == []


def test_a_send_loads_the_cold_path_only_when_it_takes_it() -> None:
    # `send` to a running daemon is one IPC call; the cold path (the WebSocket link, the
    # pre-send hook, the stores) is for when no daemon answers. Its options are enough to
    # show what the command module itself imports.
    heavy = _imports("send", "--help")["heavy"]
    assert isinstance(heavy, list)
    assert not [m for m in heavy if m.startswith(("tidemesh.daemon.offline.coldpath",
                                                   "tidemesh.daemon.link", "websockets"))]


def test_broker_admin_commands_load_neither_the_daemon_link_nor_the_broker_server() -> None:
    # `daemon join` lives in the same command module; only it dials a broker. Only
    # `broker up` serves.
    heavy = _imports("broker", "invite", "--help")["heavy"]
    assert isinstance(heavy, list)
    assert not [m for m in heavy if m.startswith(("tidemesh.daemon.link",
                                                   "tidemesh.broker.server",
                                                   "tidemesh.broker.main"))]
