"""A click group that imports a sub-command's module only when that command runs.

Importing every command module up front cost about a second per invocation (aiohttp, the
daemon and broker roots, asyncpg), ``--version`` included; now a command pays only for
what it uses. ``--help`` still imports each listed command, for its one-line summary.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import click


class LazyGroup(click.Group):
    def __init__(self, *args: Any, lazy_subcommands: Mapping[str, str] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # name -> "module:attribute"
        self.lazy_subcommands = dict(lazy_subcommands or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy_subcommands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = self.lazy_subcommands.get(cmd_name)
        if target is None:
            return super().get_command(ctx, cmd_name)
        module, _, attr = target.partition(":")
        command = getattr(importlib.import_module(module), attr)
        if not isinstance(command, click.Command):
            raise TypeError(f"{target} is not a click command")
        return command
