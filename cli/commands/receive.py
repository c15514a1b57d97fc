"""``tidemesh inbox``, ``tidemesh events``, ``tidemesh topic …`` and ``tidemesh queue …``."""

from __future__ import annotations

import json
from typing import Any

import click

from tidemesh.cli.commands.common import client_for, json_option, mesh_option
from tidemesh.cli.output import emit_json, fail, fields, table, when
from tidemesh.cli.terminal import printable
from tidemesh.client import Client, Event
from tidemesh.client.calls import Kind
from tidemesh.core.errors import TidemeshError
from tidemesh.core.names import Known, shown_names


@click.command("inbox")
@mesh_option
@click.option("--after", type=click.IntRange(min=0), default=None, help="Entries after this seq.")
@click.option("--limit", type=click.IntRange(1, 1000), default=100, show_default=True)
@click.option("--topic", default=None)
@click.option("--from", "sender", default=None, help="Sender's member key (hex).")
@click.option("--consumer", default=None, help="Read as a durable named consumer.")
@click.option("--ack", is_flag=True, help="With --consumer: ack what was printed.")
@click.option("--search", "q", default=None, metavar="Q",
              help='Only entries whose text body matches Q: words (all must appear), '
                   '"a phrase", prefix*, OR, NOT (SQLite FTS5 syntax).')
@json_option
def inbox_cmd(mesh: str, after: int | None, limit: int, topic: str | None, sender: str | None,
              consumer: str | None, ack: bool, q: str | None, as_json: bool) -> None:
    """Show received messages (each exactly once, in delivery order)."""
    if ack and not consumer:
        raise click.UsageError("--ack needs --consumer")
    if q is not None and consumer:
        raise click.UsageError("--search reads the whole inbox; drop --consumer")
    client = client_for(mesh)
    try:
        page: dict[str, Any] = dict(client.inbox(after, limit, topic, sender, consumer, q))
        if ack and page["items"]:
            page["acked"] = client.ack(str(consumer), page["items"][-1]["seq"])
    except TidemeshError as exc:
        fail(exc, as_json)
    if as_json:
        emit_json(page)
        return
    names = _names([Known(e["from"], e.get("sender_name")) for e in page["items"]], client)
    rows = [{"seq": e["seq"], "from": e["from"], "name": names.get(e["from"]),
             "to": f"{e['to']['kind']}:{e['to']['ref']}",
             "id": e["client_message_id"], "body": _short(e["body"])} for e in page["items"]]
    table(rows, ["seq", "from", "name", "to", "id", "body"])


def _names(senders: list[Known], client: Client) -> dict[str, str]:
    """Each sender's name as shown, with a key prefix when another member (in the page or
    connected now) goes by it too."""
    try:
        peers = client.peers()["peers"] if senders else []
    except TidemeshError:   # the page is worth printing without them
        peers = []
    return shown_names([*senders, *(Known(p["pubkey"], p.get("display_name")) for p in peers)])


def _short(text: str, width: int = 60) -> str:
    one = text.replace("\n", " ")
    return one if len(one) <= width else one[: width - 1] + "…"


@click.command("events")
@mesh_option
@click.option("--since", type=click.IntRange(min=0), default=None,
              help="Replay events after this id first (like Last-Event-ID).")
@click.option("--idle-exit", type=float, default=None,
              help="Stop after this many quiet seconds (default: follow forever).")
@json_option
def events_cmd(mesh: str, since: int | None, idle_exit: float | None, as_json: bool) -> None:
    """Follow the daemon's event stream (message, peer_join, peer_leave, broker_status,
    outbox_dead, hook_failed, clone_suspected, file_shared, peer_key_rotated); one line per
    event. Reconnects on its own across daemon restarts."""
    try:
        for ev in client_for(mesh).events(since, idle_timeout=idle_exit):
            ev_id = ev.id if isinstance(ev, Event) else None  # a Notice is not in the log
            if as_json:
                click.echo(json.dumps({"id": ev_id, "type": ev.type, "data": ev.data}))
            else:
                click.echo(printable(f"{ev_id if ev_id is not None else '-':>6}  "
                                     f"{ev.type:14} {_summary(ev.data)}"))
    except TidemeshError as exc:
        fail(exc, as_json)
    except KeyboardInterrupt:
        pass


def _summary(data: dict[str, Any]) -> str:
    if "body" in data:
        return f"from {data['from']} to {data['to']['kind']}:{data['to']['ref']}: " \
               f"{_short(data['body'])}"
    return _short(json.dumps(data), 100)


def _membership_group(kind: Kind, join_verb: str, leave_verb: str) -> click.Group:
    group = click.Group(kind, help=f"This member's {kind} memberships.")

    def run(mesh: str, action: str, name: str, as_json: bool, create: bool = False) -> None:
        try:
            result = client_for(mesh).membership(kind, action, name, create=create)
        except TidemeshError as exc:
            fail(exc, as_json)
        if as_json:
            emit_json({"kind": kind, "name": name, "action": action, **dict(result or {})})
        else:
            click.echo(printable(f"{kind} {name}: {action} ok"))

    @group.command(join_verb, help=f"Join the {kind} NAME (the broker records it).")
    @mesh_option
    @click.argument("name")
    @json_option
    def join(mesh: str, name: str, as_json: bool) -> None:
        run(mesh, join_verb, name, as_json)

    @group.command(leave_verb, help=f"Leave the {kind} NAME.")
    @mesh_option
    @click.argument("name")
    @json_option
    def leave(mesh: str, name: str, as_json: bool) -> None:
        run(mesh, leave_verb, name, as_json)

    @group.command("list", help=f"The {kind}s this member belongs to, and since when (UTC).")
    @mesh_option
    @json_option
    def list_cmd(mesh: str, as_json: bool) -> None:
        try:
            data = client_for(mesh).memberships(kind)
        except TidemeshError as exc:
            fail(exc, as_json)
        if as_json:
            emit_json(data)
        else:
            table([{**item, "since": when(item.get("since"))} for item in data["items"]],
                  ["name", "since"])

    if kind == "topic":
        @group.command("create", help="Create the topic NAME in the mesh and subscribe to it.")
        @mesh_option
        @click.argument("name")
        @json_option
        def create(mesh: str, name: str, as_json: bool) -> None:
            run(mesh, "create", name, as_json)

    return group


topic_group = _membership_group("topic", "subscribe", "unsubscribe")
queue_group = _membership_group("queue", "consume", "leave")


@click.command("peers")
@mesh_option
@json_option
def peers_cmd(mesh: str, as_json: bool) -> None:
    """Members connected to the broker now, with their profiles."""
    try:
        data = client_for(mesh).peers()
    except TidemeshError as exc:
        fail(exc, as_json)
    if as_json:
        emit_json(data)
        return
    names = shown_names(Known(p["pubkey"], p.get("display_name")) for p in data["peers"])
    rows = [{"pubkey": p["pubkey"] + ("  (this host)" if p.get("self") else ""),
             "name": names.get(p["pubkey"]), "status": (p.get("profile") or {}).get("status"),
             "summary": _short((p.get("profile") or {}).get("summary") or "", 40),
             "connections": p["connections"]} for p in data["peers"]]
    table(rows, ["pubkey", "name", "status", "summary", "connections"])


@click.command("profile")
@mesh_option
@click.option("--summary", default=None)
@click.option("--status", type=click.Choice(["idle", "working", "dnd", "away"]), default=None)
@click.option("--visible/--hidden", default=None, help="Show or hide this member in peers.")
@click.option("--title", default=None)
@click.option("--bio", default=None)
@click.option("--avatar", default=None)
@click.option("--capability", "capabilities", multiple=True, help="Repeat for several.")
@json_option
def profile_cmd(mesh: str, summary: str | None, status: str | None, visible: bool | None,
                title: str | None, bio: str | None, avatar: str | None,
                capabilities: tuple[str, ...], as_json: bool) -> None:
    """Show this member's profile, or change the fields given."""
    patch: dict[str, Any] = {k: v for k, v in {
        "summary": summary, "status": status, "visible": visible, "title": title, "bio": bio,
        "avatar": avatar, "capabilities": list(capabilities) or None}.items() if v is not None}
    try:
        data = client_for(mesh).profile(patch)
    except TidemeshError as exc:
        fail(exc, as_json)
    if as_json:
        emit_json(data)
        return
    fields(data["profile"])
    if patch and not data.get("published"):
        click.echo("(saved; published to the broker when the daemon reconnects)")
