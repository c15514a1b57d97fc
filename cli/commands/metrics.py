"""``tidemesh daemon metrics``: the daemon's Prometheus series, read over its socket.

The same text ``GET /v1/metrics`` serves (for a scraper); ``--name`` keeps the families
whose name starts with a prefix, and ``--json`` gives one object per sample, parsed with
prometheus_client's own parser (what a scraper would read, not a split of the text)."""

from __future__ import annotations

import click
from prometheus_client.parser import text_string_to_metric_families

from tidemesh.cli.commands.common import client_for, json_option, mesh_option
from tidemesh.cli.output import emit_json, fail
from tidemesh.core.errors import TidemeshError


@click.command("metrics")
@mesh_option
@click.option("--name", "prefix", default="", metavar="PREFIX",
              help="Only the families whose name starts with PREFIX (e.g. cm_daemon_send).")
@json_option
def metrics_cmd(mesh: str, prefix: str, as_json: bool) -> None:
    """Print the running daemon's metrics (Prometheus text, or samples with --json)."""
    try:
        text = client_for(mesh).metrics()
    except TidemeshError as exc:
        fail(exc, as_json)
    families = [f for f in text_string_to_metric_families(text) if f.name.startswith(prefix)]
    if as_json:
        emit_json({"samples": [{"name": s.name, "labels": s.labels, "value": s.value}
                               for f in families for s in f.samples]})
        return
    if not prefix:
        click.echo(text, nl=False)
        return
    for f in families:
        for s in f.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            click.echo(f"{s.name}{{{labels}}} {s.value}" if labels else f"{s.name} {s.value}")
