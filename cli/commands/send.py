"""``tidemesh send``: one message through the local daemon."""

from __future__ import annotations

import base64
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

import click

from tidemesh.cli import send_wait
from tidemesh.cli.commands.common import client_for, json_option, mesh_option, paths_for
from tidemesh.cli.output import emit_json, fail
from tidemesh.cli.terminal import printable
from tidemesh.client import DaemonNotAnswering, DaemonNotRunning, IncompatibleDaemon, SendResult
from tidemesh.client.endpoint import joined_meshes
from tidemesh.core.errors import TidemeshError
from tidemesh.core.exitcodes import Exit
from tidemesh.core.ids import client_message_id_problem
from tidemesh.core.send import Destination
from tidemesh.daemon import admin
from tidemesh.daemon.admin import AlreadyRunning

PROBE_TIMEOUT_S = 0.5
# How long a send waits for the holder of the mesh's lock: a daemon to answer, or another
# cold send to finish.
HOLDER_WAIT_S = 10.0
HOLDER_POLL_S = 0.1


def _payload(message: str | None, file: Path | None, as_base64: bool) -> tuple[str, str]:
    """The body text and its encoding, from the argument, a file, or stdin ("-")."""
    if message is not None and file is not None:
        raise click.UsageError("give the message as an argument or --file, not both")
    if file is not None:
        raw = sys.stdin.buffer.read() if str(file) == "-" else file.read_bytes()
    elif message == "-":
        raw = sys.stdin.buffer.read()
    elif message is None and not sys.stdin.isatty():
        raw = sys.stdin.buffer.read()
        if not raw:  # e.g. cron or a pipe that produced nothing: refuse a silent empty send
            raise click.UsageError("no message: stdin was empty; pass the message as an "
                                   "argument, --file PATH, or pipe it in (use - to send an "
                                   "empty stdin on purpose)")
    elif message is not None:
        raw = message.encode("utf-8")
    else:
        raise click.UsageError("no message: pass it as an argument, --file PATH, or on stdin")
    if as_base64:
        return base64.b64encode(raw).decode("ascii"), "base64"
    try:
        return raw.decode("utf-8"), "utf8"
    except UnicodeDecodeError:
        return base64.b64encode(raw).decode("ascii"), "base64"


def _checked_id(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """The daemon's rule for ids, checked here: an Idempotency-Key header would silently
    lose leading and trailing spaces, so the daemon would bind a different id."""
    if value is not None and (problem := client_message_id_problem(value)):
        raise click.BadParameter(f"client_message_id {problem} (got {value!r})")
    return value


def _json_meta(_ctx: click.Context, _param: click.Parameter, value: str | None) -> Any:
    """--meta parsed here: a flag that is not JSON is a usage error (exit 2), not a send
    the daemon refused."""
    if value is None:
        return None
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not valid JSON: {exc}") from None


def build_request(to: str, body: str, encoding: str, priority: str, meta: Any,
                  reply_to: str | None) -> dict[str, Any]:
    dest = Destination.parse(to)
    req: dict[str, Any] = {"to": dest.to_dict(), "body": body, "priority": priority}
    if encoding != "utf8":
        req["body_encoding"] = encoding
    if meta is not None:
        req["meta"] = meta
    if reply_to:
        req["reply_to"] = reply_to
    return req


@click.command("send")
@mesh_option
@click.argument("message", required=False)
@click.option("--to", "to", required=True,
              help="topic:NAME | dm:MEMBER | queue:NAME (MEMBER: a key, a 16+ hex prefix of "
                   "it, or @name)")
@click.option("--file", "file", default=None,
              type=click.Path(exists=True, dir_okay=False, allow_dash=True, path_type=Path),
              help="Read the body from a file ('-' for stdin).")
@click.option("--base64", "as_base64", is_flag=True, help="Send the bytes as a binary body.")
@click.option("--meta", default=None, callback=_json_meta,
              help="A JSON object carried with the message.")
@click.option("--priority", type=click.Choice(["now", "next", "low"]), default="next",
              show_default=True)
@click.option("--reply-to", default=None, help="broker_message_id this replies to.")
@click.option("--id", "client_id", default=None, callback=_checked_id,
              help="client_message_id; a retry with the same id and body is sent once.")
@click.option("--wait", is_flag=True,
              help="Wait for the broker's outcome: exit 0 once delivered, 13 when it went "
                   "dead (the reason is printed), 14 when still queued at --timeout.")
@click.option("--timeout", "wait_timeout", type=click.FloatRange(min=0), default=30.0,
              show_default=True, help="Longest --wait, in seconds.")
@json_option
def send_cmd(mesh: str, message: str | None, to: str, file: Path | None, as_base64: bool,
             meta: Any, priority: str, reply_to: str | None, client_id: str | None,
             wait: bool, wait_timeout: float, as_json: bool) -> None:
    """Send a message through the local daemon (or, when no daemon runs for the mesh,
    straight to the broker as the same member: the cold path, which runs the mesh's pre-send
    hook as the daemon would); prints the outcome and the path taken. A daemon that runs but
    does not answer is not bypassed: exit 15, nothing sent."""
    body, encoding = _payload(message, file, as_base64)
    try:
        req = build_request(to, body, encoding, priority, meta, reply_to)
        result, path = _deliver(mesh, req, client_id)
    except TidemeshError as exc:
        fail(exc, as_json)
    if wait and path == "daemon":
        _wait_then_exit(mesh, result, wait_timeout, as_json)
    if as_json:
        emit_json({**result, "path": path})
        return
    if path == "cold":
        click.echo(f"{result['status']}: client_message_id {result['client_message_id']}, "
                   f"broker_message_id {result['broker_message_id']} via cold path "
                   "(no daemon was running)")
        return
    if result.get("duplicate"):
        click.echo(f"duplicate of an already delivered send: client_message_id "
                   f"{result['client_message_id']}, "
                   f"broker_message_id {result['broker_message_id']}")
    else:
        click.echo(f"{result['status']}: client_message_id {result['client_message_id']} "
                   f"(outbox row {result['outbox_id']}) via daemon")


def _wait_then_exit(mesh: str, result: SendResult, timeout_s: float, as_json: bool) -> NoReturn:
    """``--wait``: report the outbox row's final state (cli/send_wait.py) and exit with it."""
    try:
        row = send_wait.wait_for_row(client_for(mesh), result["outbox_id"], timeout_s)
    except TidemeshError as exc:
        fail(exc, as_json)
    outcome = send_wait.outcome_of(row, timeout_s)
    if as_json:
        emit_json({**result, "path": "daemon", "outcome": dict(outcome.row)})
    else:
        click.echo(printable(outcome.line), err=outcome.exit != Exit.OK)   # a broker's reason
    sys.exit(int(outcome.exit))


def _deliver(mesh: str, req: dict[str, Any], client_id: str | None) -> tuple[Any, str]:
    """The daemon if one answers a quick compatibility probe (``/v1/compat``) and fits this
    CLI; else the cold path, which runs only while no daemon holds the mesh's instance lock.
    A daemon of another IPC API major sends the CLI to the cold path (spec §15.4), which
    that daemon's lock then refuses, with both versions named; a CLI version outside the
    daemon's range is refused at once."""
    try:
        client_for(mesh, timeout=PROBE_TIMEOUT_S).check_compatible("cli")
    except IncompatibleDaemon as exc:
        if exc.details.get("kind") != "ipc_api" or not paths_for(mesh).mesh_file.exists():
            raise   # no cold path without a joined mesh: the daemon's versions are the news
        click.echo(printable(f"{exc.message}; trying the cold path"), err=True)
        try:
            return admin.coldpath.send(mesh, req, client_id, os.environ), "cold"
        except AlreadyRunning as held:
            raise IncompatibleDaemon(
                f"{exc.message}, and the cold path does not run while that daemon (pid "
                f"{held.pid}) holds the lock of mesh {mesh}: nothing was sent. Use a "
                "tidemesh of the daemon's version, or stop it (`tidemesh daemon down`) to "
                "send by the cold path", **exc.details) from exc
    except DaemonNotRunning as exc:
        paths = paths_for(mesh)
        if not paths.mesh_file.exists():
            raise _not_joined(exc, mesh) from exc
        return _cold(mesh, req, client_id)
    result: SendResult = client_for(mesh).send(req, idempotency_key=client_id)
    return result, "daemon"


def _not_joined(exc: DaemonNotRunning, mesh: str) -> DaemonNotRunning:
    """No daemon and no mesh.json: say why nothing is joined, when a CI daemon's stop left
    its mesh (its key lasted one run), and which meshes are joined here instead."""
    others = [m for m in joined_meshes() if m != mesh]
    said = f"{exc.reason}; this host has not joined mesh {mesh} either, so there is no cold path"
    left_mesh, left = mesh, admin.ephemeral.left_record(paths_for(mesh))
    if left is None and mesh == "default" and not others:
        # Nothing joined and no --mesh: the mesh a CI daemon left is the one meant.
        for name in _mesh_folders():
            if (found := admin.ephemeral.left_record(paths_for(name))) is not None:
                left_mesh, left = name, found
    if left is not None:
        said += (f"; the ephemeral member ({str(left.get('pubkey', ''))[:16]}…) of mesh "
                 f"{left_mesh} left the mesh when its daemon stopped: a CI run's key lasts "
                 "one run, so join again")
    if others:
        said += f"; meshes joined here: {', '.join(others)} (name one with --mesh)"
    elif left is None and mesh == "default":
        said += "; name the mesh with --mesh if it is not \"default\""
    if left is None:
        return DaemonNotRunning(said, hint=exc.hint)
    return DaemonNotRunning(said, hint="tidemesh daemon join INVITE"
                            + ("" if left_mesh == "default" else f" --mesh {left_mesh}"))


def _mesh_folders() -> list[str]:
    root = paths_for("default").data_dir.parent
    try:
        return sorted(d.name for d in root.iterdir() if d.is_dir())
    except OSError:
        return []


def _cold(mesh: str, req: dict[str, Any], client_id: str | None) -> tuple[Any, str]:
    """The cold path, once the mesh's lock is free. Its holder may be a daemon that is
    busy or starting (used as soon as it answers), another cold send (waited for: each holds
    the lock only for its own send), or a daemon that does not answer: after HOLDER_WAIT_S,
    exit 15 and nothing sent, so that daemon keeps its broker session."""
    deadline = time.monotonic() + HOLDER_WAIT_S
    while True:
        try:
            return admin.coldpath.send(mesh, req, client_id, os.environ), "cold"
        except AlreadyRunning as held:
            pid = held.pid
        try:
            client_for(mesh, timeout=PROBE_TIMEOUT_S).version()
        except DaemonNotRunning as exc:
            if time.monotonic() >= deadline:
                raise DaemonNotAnswering(
                    f"pid {pid} holds the lock of mesh {mesh}, but no daemon answered in "
                    f"{HOLDER_WAIT_S:g} s ({exc.reason}): a daemon stopped (SIGSTOP), stuck "
                    "or still starting, or a cold send that takes that long. Nothing was "
                    "sent, and the cold path is not taken around a running daemon: check "
                    "`tidemesh daemon status`, or `kill -CONT` it, and retry", pid=pid) from exc
            time.sleep(HOLDER_POLL_S)
            continue
        result: SendResult = client_for(mesh).send(req, idempotency_key=client_id)
        return result, "daemon"
