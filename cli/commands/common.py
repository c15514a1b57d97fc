"""Options and look-ups shared by the command modules."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

import click

from tidemesh.cli.client import DaemonClient
from tidemesh.core.paths import DaemonPaths, daemon_paths

F = TypeVar("F", bound=Callable[..., Any])


def mesh_option(fn: F) -> F:
    return click.option(
        "--mesh", envvar="TIDEMESH_DAEMON_MESH", default="default", show_default=True,
        help="Which mesh's daemon (one daemon per user and mesh).",
    )(fn)


def json_option(fn: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")(fn)


def paths_for(mesh: str) -> DaemonPaths:
    return daemon_paths(mesh, os.environ)


def client_for(mesh: str, timeout: float = 10.0) -> DaemonClient:
    return DaemonClient(paths_for(mesh).socket, timeout=timeout)
