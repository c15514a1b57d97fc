"""Options and look-ups shared by the command modules."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

import click

from tidemesh.client import Client
from tidemesh.client.endpoint import joined_meshes
from tidemesh.core.errors import TidemeshError
from tidemesh.core.paths import DaemonPaths, choose_mesh, daemon_paths

F = TypeVar("F", bound=Callable[..., Any])


def _chosen_mesh(ctx: click.Context, _param: click.Parameter, value: str | None) -> str:
    if ctx.params.get("all_meshes"):
        return value or ""      # --all names every joined mesh; nothing to choose
    try:
        return choose_mesh(value, joined_meshes())
    except TidemeshError as exc:   # a usage error: the command line must say more
        raise click.UsageError(exc.message, ctx) from None


def mesh_option(fn: F) -> F:
    return click.option(
        "--mesh", envvar="TIDEMESH_DAEMON_MESH", default=None, callback=_chosen_mesh,
        help="Which mesh's daemon (one daemon per user and mesh) [default: the only joined "
             "mesh, else 'default'].",
    )(fn)


def json_option(fn: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")(fn)


def paths_for(mesh: str) -> DaemonPaths:
    return daemon_paths(mesh, os.environ)


def client_for(mesh: str, timeout: float = 10.0) -> Client:
    return Client.for_mesh(mesh, timeout=timeout)


def all_option(fn: F) -> F:
    """``--all``: every joined mesh. Eager, so ``--mesh`` knows not to choose one."""
    return click.option("--all", "all_meshes", is_flag=True, is_eager=True,
                        help="Every mesh joined on this host.")(fn)
