"""The ``tidemesh`` command group."""

from __future__ import annotations

import os
import sys

import click

import tidemesh
from tidemesh.cli.commands.audit import audit_group
from tidemesh.cli.commands.broker import broker_group, join_cmd
from tidemesh.cli.commands.config import config_group
from tidemesh.cli.commands.daemon import daemon_group
from tidemesh.cli.commands.demo import demo_cmd
from tidemesh.cli.commands.outbox import inbox_group, outbox_group
from tidemesh.cli.commands.receive import (
    events_cmd,
    inbox_cmd,
    peers_cmd,
    profile_cmd,
    queue_group,
    topic_group,
)
from tidemesh.cli.commands.send import send_cmd
from tidemesh.cli.commands.service import (
    broker_install,
    broker_uninstall,
    daemon_install,
    daemon_uninstall,
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(tidemesh.__version__, prog_name="tidemesh")
def cli() -> None:
    """tidemesh: effective-once messaging between the programs on your hosts."""


daemon_group.add_command(outbox_group)
daemon_group.add_command(inbox_group)
cli.add_command(daemon_group)
cli.add_command(send_cmd)
cli.add_command(demo_cmd)
cli.add_command(audit_group)
daemon_group.add_command(join_cmd)
cli.add_command(broker_group)
cli.add_command(config_group)
daemon_group.add_command(daemon_install)
daemon_group.add_command(daemon_uninstall)
broker_group.add_command(broker_install)
broker_group.add_command(broker_uninstall)
for command in (inbox_cmd, events_cmd, topic_group, queue_group, peers_cmd, profile_cmd):
    cli.add_command(command)


def main() -> None:
    # Commands print results on stdout; library logs go to stderr, warnings and up only,
    # so `--json` output stays parseable. Daemon and broker processes reconfigure for
    # themselves when they start.
    from tidemesh.daemon.admin import configure_logging

    configure_logging(os.environ.get("TIDEMESH_CLI_LOG_LEVEL", "warning"), "console", sys.stderr)
    cli()
