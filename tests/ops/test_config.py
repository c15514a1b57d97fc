"""Configuration: `config show` reports every value and its source; the docs list every setting."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.ops.conftest import Host
from tidemesh.broker.config import SETTINGS as BROKER_SETTINGS
from tidemesh.cli.commands.config import render_docs
from tidemesh.core.settings import REDACTED, Setting, redact
from tidemesh.daemon.process.config import SETTINGS as DAEMON_SETTINGS

DOCS = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_docs_list_every_setting_with_its_generated_row() -> None:
    text = DOCS.read_text(encoding="utf-8")
    assert render_docs(text) == text, (
        "docs/configuration.md is out of date with the SETTINGS tables; run "
        "`tidemesh config docs --write docs/configuration.md`")
    for s in (*DAEMON_SETTINGS, *BROKER_SETTINGS):
        assert f"| `{s.name}` | `{s.env}` |" in text, s.name


def test_every_default_is_within_its_own_range() -> None:
    for s in (*DAEMON_SETTINGS, *BROKER_SETTINGS):
        if s.bounds is not None and s.default is not None:
            assert s.bounds[0] <= s.default <= s.bounds[1], s.name


def test_each_setting_is_declared_once_per_process() -> None:
    for table in (DAEMON_SETTINGS, BROKER_SETTINGS):
        names = [s.name for s in table]
        assert len(names) == len(set(names))
        assert all(s.help.strip() for s in table)


def _show(host: Host, *args: str,
          extra: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    code, out, err = host.run("config", "show", "--json", *args, extra=extra)
    assert code == 0, err
    return {row["name"]: row for row in json.loads(out)["settings"]}


def test_show_reports_default_file_env_and_flag_sources(host: Host) -> None:
    folder = Path(host.env["TIDEMESH_HOME"]) / "daemon" / "ops"
    folder.mkdir(parents=True)
    (folder / "daemon.toml").write_text('[ipc]\nmax_inflight = 64\nmax_streams = 4\n'
                                        '[log]\nlevel = "debug"\n')
    rows = _show(host, "--mesh", "ops", extra={"TIDEMESH_IPC_MAX_STREAMS": "8"})
    assert len(rows) == len(DAEMON_SETTINGS)
    assert rows["daemon.mesh"]["value"] == "ops"
    assert (rows["daemon.mesh"]["source"], rows["ipc.max_inflight"]["source"]) == ("flag", "file")
    assert (rows["ipc.max_inflight"]["value"], rows["log.level"]["value"]) == (64, "debug")
    assert (rows["ipc.max_streams"]["value"], rows["ipc.max_streams"]["source"]) == (8, "env")
    assert (rows["ipc.sse_buffer"]["value"], rows["ipc.sse_buffer"]["source"]) == (1000, "default")
    assert rows["log.level"]["reload"] == "sighup" and rows["ipc.sse_buffer"]["reload"] == "restart"


def test_show_names_the_bad_setting_and_exits_2(host: Host) -> None:
    folder = Path(host.env["TIDEMESH_HOME"]) / "daemon" / "default"
    folder.mkdir(parents=True)
    (folder / "daemon.toml").write_text("[ipc]\nmax_infligth = 3\n")
    code, _, err = host.run("config", "show")
    assert code == 2 and "ipc.max_infligth" in err
    (folder / "daemon.toml").unlink()
    code, _, err = host.run("config", "show", extra={"TIDEMESH_LOG_FILE_BACKUPS": "many"})
    assert code == 2 and "log.file_backups" in err


def test_broker_show_redacts_the_password_in_the_store_url(host: Host) -> None:
    rows = _show(host, "--broker",
                 extra={"TIDEMESH_BROKER_STORE": "postgresql://tide:hunter2@db:5432/tm"})
    assert rows["broker.store"]["value"] == f"postgresql://tide:{REDACTED}@db:5432/tm"
    assert rows["broker.store"]["source"] == "env"
    code, out, _ = host.run("config", "show", "--broker",
                            extra={"TIDEMESH_BROKER_STORE": "postgresql://tide:hunter2@db/tm"})
    assert code == 0 and b"hunter2" not in out


def test_secret_settings_are_always_redacted() -> None:
    secret = Setting("auth.token", str, None, "a token", secret=True, optional=True)
    assert redact(secret, "s3cr3t") == REDACTED and redact(secret, None) is None


def test_show_means_the_only_joined_mesh_like_every_other_command(host: Host) -> None:
    from tidemesh.core.paths import daemon_paths

    team = daemon_paths("team", host.env)
    team.mesh_file.parent.mkdir(parents=True)
    team.mesh_file.write_text("{}")
    (team.config_file.parent / "daemon.toml").write_text('[log]\nlevel = "debug"\n')
    code, out, err = host.run("config", "show", "--json")
    assert code == 0, err
    shown = json.loads(out)
    assert shown["mesh"] == "team" and shown["file"] == str(team.config_file)
    rows = {r["name"]: r for r in shown["settings"]}
    assert rows["log.level"]["value"] == "debug"
    assert (rows["daemon.mesh"]["value"], rows["daemon.mesh"]["source"]) == ("team", "joined")
    other = daemon_paths("ops", host.env)
    other.mesh_file.parent.mkdir(parents=True)
    other.mesh_file.write_text("{}")
    code, _, err = host.run("config", "show")
    assert code == 2 and "--mesh" in err, "several joined: which one?"
    code, out, err = host.run("config", "show", "--broker", "--json")
    assert code == 0 and json.loads(out)["process"] == "broker", err
