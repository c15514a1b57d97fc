"""The ``tidemesh`` command group."""

from __future__ import annotations

import os
import sys

import click

import tidemesh
from tidemesh.cli.lazy import LazyGroup

C = "tidemesh.cli.commands."
COMMANDS = {
    "daemon": C + "daemon:daemon_group",
    "send": C + "send:send_cmd",
    "inbox": C + "receive:inbox_cmd",
    "events": C + "receive:events_cmd",
    "topic": C + "receive:topic_group",
    "queue": C + "receive:queue_group",
    "peers": C + "receive:peers_cmd",
    "profile": C + "receive:profile_cmd",
    "file": C + "files:file_group",
    "broker": C + "broker:broker_group",
    "config": C + "config:config_group",
    "audit": C + "audit:audit_group",
    "demo": C + "demo:demo_cmd",
    "mcp": C + "mcp:mcp_group",
    "session": C + "session:session_group",
}


@click.group(cls=LazyGroup, lazy_subcommands=COMMANDS,
             context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(tidemesh.__version__, prog_name="tidemesh")
def cli() -> None:
    """tidemesh: effective-once messaging between the programs on your hosts."""
    # Here, not in main(): --version and --help need no logging and skip its import cost.
    from tidemesh.cli.logs import configure_logging

    configure_logging(os.environ.get("TIDEMESH_CLI_LOG_LEVEL", "warning"), sys.stderr)


def main() -> None:
    # Commands print results on stdout; library logs go to stderr, warnings and up only,
    # so `--json` output stays parseable. Daemon and broker processes reconfigure for
    # themselves when they start.
    cli()
