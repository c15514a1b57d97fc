"""``tidemesh config show|docs``: every effective setting and where it came from.

Owns printing the resolved settings of the daemon (per mesh) or the broker, with secrets
redacted, and generating the reference tables of ``docs/configuration.md`` from the one
declaration of each setting (``daemon.process.config.SETTINGS``, ``broker.config.SETTINGS``).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

import click

from tidemesh.broker.admin import running as broker_running
from tidemesh.broker.admin import settings as broker_config
from tidemesh.cli.output import emit_json, table
from tidemesh.client.endpoint import joined_meshes
from tidemesh.core.environment import SETTINGS as ENVIRONMENT_SETTINGS
from tidemesh.core.errors import TidemeshError
from tidemesh.core.exitcodes import Exit
from tidemesh.core.fleet import SETTINGS as FLEET_SETTINGS
from tidemesh.core.paths import choose_mesh, daemon_paths
from tidemesh.core.settings import (
    ConfigError,
    Resolved,
    Setting,
    markdown_table,
    redact,
    toml_value,
)
from tidemesh.daemon import admin as daemon_admin
from tidemesh.daemon.admin import settings as daemon_config

TABLES: dict[str, tuple[Setting, ...]] = {
    "daemon": daemon_config.SETTINGS,
    "fleet": FLEET_SETTINGS,
    "broker": broker_config.SETTINGS,
}
_BLOCK = re.compile(r"(<!-- BEGIN settings:(?P<name>\w+) -->\n)(?P<body>.*?)"
                    r"(<!-- END settings:(?P=name) -->)", re.DOTALL)


def render_docs(text: str) -> str:
    """``text`` with every generated settings block replaced by the current table."""
    return _BLOCK.sub(lambda m: m[1] + markdown_table(TABLES[m["name"]]) + m[4], text)


@click.group("config")
def config_group() -> None:
    """Inspect configuration (flag > TIDEMESH_* environment > TOML file > default)."""


def _resolve_daemon(mesh: str | None) -> tuple[str, Path, dict[str, Resolved]]:
    # The mesh every other command means: the named one, else the only joined one.
    name = choose_mesh(mesh or os.environ.get("TIDEMESH_DAEMON_MESH"), joined_meshes())
    paths = daemon_paths(name, os.environ)
    path = paths.config_file
    _, resolved = daemon_config.load(daemon_config.read_file(path), os.environ,
                                     {"daemon.mesh": mesh})
    if resolved["daemon.mesh"].value != name:   # chosen as the only joined mesh
        resolved["daemon.mesh"] = Resolved(name, "joined")
    # The settings left unset take the environment's value (host, container or CI).
    env = daemon_admin.ephemeral.environment_of(paths, os.environ)
    for setting, attr in ENVIRONMENT_SETTINGS:
        if resolved[setting].value is None:
            resolved[setting] = Resolved(getattr(env, attr), f"environment:{env.kind}")
    return name, path, resolved


def _resolve_broker() -> tuple[Path, dict[str, Resolved]]:
    """The broker's settings from its file and environment; a store and listen address it
    was given as flags (``broker up --store …``) are not in either, so where a setting is
    left at its default the running broker's record (or the last run's) says what it uses."""
    path = broker_config.config_file(os.environ)
    _, resolved = broker_config.load(broker_config.read_file(path), os.environ, {})
    now = broker_running.find(os.environ)
    seen = now or broker_running.last(os.environ)
    if seen is not None:
        source = f"running broker (pid {seen.pid})" if now else f"last run (pid {seen.pid})"
        for name, value in (("broker.store", seen.store), ("broker.listen", seen.listen)):
            if resolved[name].source == "default":
                resolved[name] = Resolved(value, source)
    return path, resolved


def _rows(settings: tuple[Setting, ...], resolved: dict[str, Resolved]) -> list[dict[str, Any]]:
    return [{"name": s.name, "value": redact(s, resolved[s.name].value),
             "source": resolved[s.name].source, "env": s.env, "type": s.type.__name__,
             "default": redact(s, s.default), "reload": "sighup" if s.reloadable else "restart"}
            for s in settings]


@config_group.command("show")
@click.option("--daemon", "process", flag_value="daemon", default=True,
              help="The daemon's settings (the default).")
@click.option("--broker", "process", flag_value="broker", help="The broker's settings.")
@click.option("--mesh", default=None, help="Which mesh's daemon; default $TIDEMESH_DAEMON_MESH, "
              "else the only joined mesh, else `default`.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
def show(process: str, mesh: str | None, as_json: bool) -> None:
    """Print every effective setting, its value and its source (default/file/env/flag)."""
    try:
        if process == "daemon":
            name, path, resolved = _resolve_daemon(mesh)
            head: dict[str, Any] = {"process": "daemon", "mesh": name}
        else:
            path, resolved = _resolve_broker()
            head = {"process": "broker"}
    except (ConfigError, TidemeshError) as exc:   # a bad setting, or several meshes joined
        click.echo(f"error: {exc.message}", err=True)
        sys.exit(int(Exit.USAGE))
    rows = _rows(TABLES[process], resolved)
    head.update(file=str(path), file_exists=path.exists())
    if as_json:
        emit_json({**head, "settings": rows})
        return
    where = "" if path.exists() else " (absent: defaults and environment only)"
    click.echo(f"# {process} settings; file {path}{where}")
    table([{**r, "value": "unset" if r["value"] is None else toml_value(r["value"])}
           for r in rows], ["name", "value", "source", "reload"])


@config_group.command("docs")
@click.option("--write", "target", type=click.Path(path_type=Path, exists=True), default=None,
              help="Rewrite the generated tables inside this Markdown file.")
@click.argument("process", type=click.Choice(sorted(TABLES)), required=False)
def docs(target: Path | None, process: str | None) -> None:
    """Print a settings reference table, or refresh them in a docs file (--write)."""
    if target is not None:
        target.write_text(render_docs(target.read_text(encoding="utf-8")), encoding="utf-8")
        click.echo(f"refreshed the settings tables in {target}")
        return
    for name in [process] if process else sorted(TABLES):
        click.echo(markdown_table(TABLES[name]))
