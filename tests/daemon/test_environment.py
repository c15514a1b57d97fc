"""Environment defaults (spec §16) in real daemons without a broker: a container serves the
Unix socket only, CI runs no hooks and keeps no key, and what the environment changed is in
/v1/health. The environment reaches the daemon as it would on a machine: CI variables, and
container markers under a fake root (environment.markers_root)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.daemon.harness import RunningDaemon, run_cli, start_daemon, tcp_listeners
from tests.daemon.test_hooks import PRE_SEND, hooks_folder
from tidemesh.core.environment import CI_VARIABLES, KUBERNETES_VARIABLE
from tidemesh.core.paths import daemon_paths
from tidemesh.daemon.process.environment import marker_reader

# Nothing of the machine the suite runs on decides: no CI variable, no container marker
# except those a test puts under its own root.
NO_MARKERS = {**{name: "" for name in CI_VARIABLES}, KUBERNETES_VARIABLE: "",
              "TIDEMESH_ENVIRONMENT_KIND": "auto"}
CI = {**NO_MARKERS, "CI": "true"}


def fake_root(home: Path, *markers: str) -> dict[str, str]:
    root = home / "root"
    root.mkdir()
    for marker in markers:
        (root / marker).write_text("")
    return {**NO_MARKERS, "TIDEMESH_ENVIRONMENT_MARKERS_ROOT": str(root)}


async def health(d: RunningDaemon) -> dict[str, Any]:
    async with d.session() as s, s.get("/v1/health") as r:
        assert r.status == 200
        return dict(await r.json())


def logged(d: RunningDaemon, event: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in d.log.read_text().splitlines()
            if f'"event": "{event}"' in line or f'"event":"{event}"' in line]


def test_the_marker_reader_reads_under_its_root(short_tmp: Path) -> None:
    (short_tmp / "proc" / "1").mkdir(parents=True)
    (short_tmp / "proc" / "1" / "cgroup").write_text("4:memory:/docker/abc\n")
    read = marker_reader(short_tmp)
    assert read("/proc/1/cgroup") == "4:memory:/docker/abc\n"
    assert read("/.dockerenv") is None


async def test_in_a_container_the_daemon_serves_the_socket_only(short_tmp: Path) -> None:
    d = start_daemon(short_tmp, extra_env=fake_root(short_tmp, ".dockerenv"))
    try:
        env = (await health(d))["environment"]
        assert env == {"kind": "container", "reason": "/.dockerenv", "tcp_enabled": False,
                       "hooks_enabled": True, "persistent_keypair": True,
                       "changed": ["ipc.tcp_enabled"]}
        assert tcp_listeners(d.proc.pid) == []
        assert not d.paths.port_file.exists()
        assert d.client.version()["mesh"] == "t"    # the socket answers
        status = run_cli(short_tmp, "daemon", "status", "--mesh", "t", "--json")
        assert json.loads(status.stdout)["environment"] == env, status.stderr
        human = run_cli(short_tmp, "daemon", "status", "--mesh", "t").stdout
        assert "container (/.dockerenv); changed: ipc.tcp_enabled" in human
    finally:
        assert d.stop() == 0


async def test_a_container_listens_on_tcp_when_told_to(short_tmp: Path) -> None:
    d = start_daemon(short_tmp, extra_env={**fake_root(short_tmp, ".dockerenv"),
                                           "TIDEMESH_IPC_TCP_ENABLED": "true"})
    try:
        env = (await health(d))["environment"]
        assert env["kind"] == "container" and env["tcp_enabled"] and env["changed"] == []
        assert tcp_listeners(d.proc.pid) == [d.port]
    finally:
        assert d.stop() == 0


async def test_container_flag_without_markers(short_tmp: Path) -> None:
    d = start_daemon(short_tmp, extra_env=fake_root(short_tmp), args=("--container",))
    try:
        env = (await health(d))["environment"]
        assert (env["kind"], env["reason"]) == ("container", "environment.kind")
        assert tcp_listeners(d.proc.pid) == []
    finally:
        assert d.stop() == 0


async def test_a_host_without_markers_listens_on_tcp_too(short_tmp: Path) -> None:
    d = start_daemon(short_tmp, extra_env=fake_root(short_tmp))
    try:
        env = (await health(d))["environment"]
        assert env["kind"] == "host" and env["changed"] == []
        assert tcp_listeners(d.proc.pid) == [d.port]
    finally:
        assert d.stop() == 0


async def test_in_ci_hooks_do_not_run(short_tmp: Path) -> None:
    hooks_folder(short_tmp, {"pre-send": PRE_SEND}, "[pre-send]\n")
    d = start_daemon(short_tmp, extra_env=CI)
    try:
        env = (await health(d))["environment"]
        assert env["kind"] == "ci" and env["reason"] == "CI variable CI"
        assert env["hooks_enabled"] is False and env["tcp_enabled"] is False
        async with d.session() as s, s.post("/v1/send", json={"to": "topic:ops",
                                                              "body": "forbidden fruit"}) as r:
            assert r.status == 202, "no pre-send hook vetoed it"
        assert tcp_listeners(d.proc.pid) == []
    finally:
        assert d.stop() == 0
    assert not logged(d, "hook_executed")


async def test_in_ci_a_daemon_keeps_no_key_and_warns_when_asked_to(short_tmp: Path) -> None:
    d = start_daemon(short_tmp, extra_env=CI)
    try:
        pubkey = (await health(d))["member_pubkey"]
        assert not d.paths.keypair.exists() and not d.paths.ephemeral_keypair.exists()
    finally:
        assert d.stop() == 0
    assert not d.paths.keypair.exists()
    assert not logged(d, "persistent_keypair_in_ci_environment")
    again = start_daemon(short_tmp, extra_env=CI, args=("--persistent",))
    try:
        h = await health(again)
        assert h["environment"]["persistent_keypair"] is True
        assert h["member_pubkey"] != pubkey and again.paths.keypair.exists()
    finally:
        assert again.stop() == 0
    warned = logged(again, "persistent_keypair_in_ci_environment")
    assert len(warned) == 1 and warned[0]["level"] == "warning"


def test_an_unreadable_ephemeral_key_is_removed_at_start(short_tmp: Path) -> None:
    paths = daemon_paths("t", {"TIDEMESH_HOME": str(short_tmp)})
    paths.runtime_dir.mkdir(parents=True, mode=0o700)
    paths.ephemeral_keypair.write_text('{"version": 1, "ed25519_se')
    d = start_daemon(short_tmp, extra_env=CI)
    try:
        assert not d.paths.ephemeral_keypair.exists()
    finally:
        assert d.stop() == 0
    assert logged(d, "ephemeral_keypair_unreadable")


def test_config_show_says_what_the_environment_set(short_tmp: Path) -> None:
    res = run_cli(short_tmp, "config", "show", "--mesh", "t", "--json",
                  extra_env={**CI, "TIDEMESH_IPC_TCP_ENABLED": "true"})
    assert res.returncode == 0, res.stderr
    rows = {r["name"]: r for r in json.loads(res.stdout)["settings"]}
    assert (rows["hooks.enabled"]["value"], rows["hooks.enabled"]["source"]) == \
        (False, "environment:ci")
    assert (rows["identity.persistent"]["value"], rows["identity.persistent"]["source"]) == \
        (False, "environment:ci")
    assert (rows["ipc.tcp_enabled"]["value"], rows["ipc.tcp_enabled"]["source"]) == \
        (True, "env")
