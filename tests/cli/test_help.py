"""Every command a user can reach says what it does in `--help`."""

from __future__ import annotations

import click

from tidemesh.cli.main import cli


def _commands(cmd: click.Command, path: tuple[str, ...], ctx: click.Context
              ) -> list[tuple[tuple[str, ...], click.Command]]:
    found = [(path, cmd)]
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            assert sub is not None, f"{' '.join(path)} lists {name} but cannot load it"
            found += _commands(sub, (*path, name), click.Context(sub, parent=ctx, info_name=name))
    return found


def test_every_command_has_help_text() -> None:
    commands = _commands(cli, ("tidemesh",), click.Context(cli, info_name="tidemesh"))
    assert len(commands) > 40
    silent = [" ".join(path) for path, cmd in commands if not (cmd.help or cmd.short_help)]
    assert silent == []
