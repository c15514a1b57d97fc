"""Two members that took one display name can be told apart: the second is warned at join,
and ``peers`` and ``inbox`` show a key prefix beside a name that is not unique."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.daemon.harness import RunningDaemon, run_cli, start_daemon
from tests.e2e.harness import Mesh, connected, inbox, pubkey, wait_for

pytestmark = pytest.mark.slow


def join(mesh: Mesh, root: Path, label: str, name: str, *flags: str) -> tuple[str, str]:
    home = root / label
    home.mkdir()
    res = run_cli(home, "daemon", "join", mesh.broker.invite(mesh.name), "--mesh", "m",
                  "--name", name, *flags)
    assert res.returncode == 0, res.stderr
    return res.stdout, res.stderr


def up(mesh: Mesh, root: Path, label: str) -> RunningDaemon:
    d = start_daemon(root / label, "m")
    mesh.daemons[label] = d
    return d


async def test_a_taken_name_is_warned_of_and_shown_with_a_key_prefix(
        any_mesh: Mesh, short_tmp: Path) -> None:
    mesh = any_mesh
    _, first_err = join(mesh, short_tmp, "bob1", "bob")
    assert "warning" not in first_err
    bob1 = up(mesh, short_tmp, "bob1")
    _, second_err = join(mesh, short_tmp, "bob2", "bob")
    bob2 = up(mesh, short_tmp, "bob2")
    key1, key2 = pubkey(bob1), pubkey(bob2)
    assert "warning: the display name 'bob' is taken" in second_err, second_err
    assert key1[:16] in second_err and key2[:16] not in second_err
    out, third_err = join(mesh, short_tmp, "bob3", "bob", "--json")
    assert json.loads(out)["name_taken_by"] == [key1, key2] and "bob3" not in third_err
    _, carol_err = join(mesh, short_tmp, "carol", "carol")
    assert "warning" not in carol_err
    carol = up(mesh, short_tmp, "carol")
    for d in (bob1, bob2, carol):
        await wait_for(lambda d=d: connected(d))
    assert run_cli(bob1.home, "topic", "create", "--mesh", "m", "news").returncode == 0
    assert run_cli(carol.home, "topic", "subscribe", "--mesh", "m", "news").returncode == 0
    for d, body in ((bob1, "from the first"), (bob2, "from the second")):
        sent = run_cli(d.home, "send", "--mesh", "m", "--to", "topic:news", body)
        assert sent.returncode == 0, sent.stderr
    await wait_for(lambda: _count(carol, 2))

    shown = run_cli(carol.home, "inbox", "--mesh", "m")
    assert shown.returncode == 0, shown.stderr
    lines = {line.split()[-1]: line for line in shown.stdout.splitlines()[1:]}
    assert f"bob ({key1[:16]})" in lines["first"], shown.stdout
    assert f"bob ({key2[:16]})" in lines["second"], shown.stdout

    async def both_seen() -> bool:
        peers = json.loads(run_cli(carol.home, "peers", "--mesh", "m", "--json").stdout)
        return {key1, key2} <= {p["pubkey"] for p in peers["peers"]}

    await wait_for(both_seen)
    peers = run_cli(carol.home, "peers", "--mesh", "m").stdout
    assert f"bob ({key1[:16]})" in peers and f"bob ({key2[:16]})" in peers, peers
    assert f"carol ({pubkey(carol)[:16]})" not in peers and " carol " in peers, peers


async def _count(d: RunningDaemon, n: int) -> bool:
    return len(await inbox(d)) >= n
