"""The command reference in docs/cli.md, generated from the click commands themselves.

Owns rendering every command's ``--help`` at a fixed width, so the docs cannot drift from
the CLI: a test compares docs/cli.md with ``render()``. Regenerate with
``python -m tidemesh.cli.reference > docs/cli.md``.
"""

from __future__ import annotations

from collections.abc import Iterator

import click

from tidemesh.core.exitcodes import MEANING, Exit

WIDTH = 96
HELP_OPTIONS = ["-h", "--help"]   # as cli.main's context_settings

HEADER = """# Command reference

Generated from the commands' own `--help` and `core/exitcodes.py`
(`python -m tidemesh.cli.reference > docs/cli.md`; a test keeps this file current). Exit
codes are [below](#exit-codes-cli-and-daemon); operating guides are
[install.md](install.md) and [operations.md](operations.md).
"""


def _walk(cmd: click.Command, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...],
                                                                       click.Command]]:
    yield path, cmd
    if isinstance(cmd, click.Group):
        ctx = click.Context(cmd, info_name=path[-1])
        for name in cmd.list_commands(ctx):      # lazy groups load their commands here
            sub = cmd.get_command(ctx, name)
            if sub is not None:
                yield from _walk(sub, (*path, name))


def _help(cmd: click.Command, path: tuple[str, ...]) -> str:
    """``cmd --help`` as the CLI prints it; the parents only lend their names to Usage."""
    ctx: click.Context | None = None
    for depth, name in enumerate(path, start=1):
        ctx = click.Context(cmd if depth == len(path) else click.Command(name), info_name=name,
                            parent=ctx, max_content_width=WIDTH, terminal_width=WIDTH,
                            help_option_names=HELP_OPTIONS)
    assert ctx is not None
    return cmd.get_help(ctx)


def exit_table() -> str:
    rows = "".join(f"| {int(code)} | {MEANING[code]} |\n" for code in Exit)
    return f"\n## Exit codes (CLI and daemon)\n\n| code | meaning |\n|---|---|\n{rows}"


def render(root: click.Command, name: str = "tidemesh") -> str:
    parts = [HEADER]
    for path, cmd in _walk(root, (name,)):
        if cmd.hidden:
            continue
        parts.append(f"\n## `{' '.join(path)}`\n\n```text\n{_help(cmd, path)}\n```\n")
    parts.append(exit_table())
    return "".join(parts)


if __name__ == "__main__":
    from tidemesh.cli.main import cli

    print(render(cli), end="")
