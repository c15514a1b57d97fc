"""``Client``: the blocking SDK, over ``http.client`` on the daemon's Unix socket or loopback
TCP. One connection per call; ``events()`` and ``consume()`` hold theirs while they run."""

from __future__ import annotations

import http.client
import socket
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

from tidemesh.client import calls, wire
from tidemesh.client.calls import Call, Kind, Response
from tidemesh.client.endpoint import LOOPBACK, Located
from tidemesh.client.errors import DaemonNotRunning
from tidemesh.client.stream import Cursor, Event, Notice, Parser, Quiet, Reconnect
from tidemesh.core import agents
from tidemesh.core.errors import NotFound

T = TypeVar("T")
_UNREACHABLE = (OSError, http.client.HTTPException)


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float | None) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class Client(Located):
    """A daemon's IPC surface as typed calls. Errors are the ``core.errors`` tree; a daemon
    that does not answer is ``DaemonNotRunning``.

    ``Client.for_mesh("team")`` finds the daemon the way the CLI does; or give
    ``socket_path``; or ``port`` and ``token_file`` for loopback TCP.
    """

    # -- transport -------------------------------------------------------------------------

    def _connect(self, timeout: float | None) -> http.client.HTTPConnection:
        if self.endpoint.socket_path is not None:
            return _UnixConnection(str(self.endpoint.socket_path), timeout)
        return http.client.HTTPConnection(LOOPBACK, self.endpoint.port, timeout=timeout)

    def _open(self, call: Call[Any], timeout: float | None, fresh: bool = False,
              moved: bool = False) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        self.endpoint.check_socket()
        conn = self._connect(timeout)
        headers = {"Content-Type": "application/json", **self.auth_headers(fresh), **call.headers}
        try:
            conn.request(call.method, call.path, body=call.payload(), headers=headers)
            return conn, conn.getresponse()
        except _UNREACHABLE as exc:
            conn.close()
            # A daemon that restarted listens on a new TCP port: follow it once.
            if not moved and (there := self.endpoint.moved()) is not None:
                self.endpoint = there
                return self._open(call, timeout, fresh, moved=True)
            raise self.endpoint.not_running(exc) from exc

    def _call(self, call: Call[T]) -> T:
        status, content_type, raw = self._exchange(call)
        if status == 401 and self.endpoint.token_file is not None:
            # The token may have been rotated since the file was read: read it once more.
            status, content_type, raw = self._exchange(call, fresh=True)
        return call.answer(status, content_type, raw)

    def _timeout(self, call: Call[Any]) -> float | None:
        if call.timeout is None or self.timeout is None:
            return self.timeout
        return max(self.timeout, call.timeout)

    def _exchange(self, call: Call[Any], fresh: bool = False) -> tuple[int, str, bytes]:
        conn, resp = self._open(call, self._timeout(call), fresh)
        try:
            raw = resp.read()
        except _UNREACHABLE as exc:
            raise self.endpoint.not_running(exc) from exc
        finally:
            conn.close()
        return resp.status, resp.getheader("Content-Type", ""), raw

    def request(self, method: str, path: str, body: Any = None,
                headers: Mapping[str, str] | None = None) -> Response:
        """Any route, for what has no method here; returns a 2xx, raises the error tree."""
        return self._call(calls.request(method, path, body, headers))

    # -- the daemon ------------------------------------------------------------------------

    def version(self) -> dict[str, Any]:
        return self._call(calls.version())

    def compat(self) -> dict[str, Any]:
        """The versions the daemon works with (``GET /v1/compat``)."""
        return self._call(calls.compat())

    def check_compatible(self, client: str = "python",
                         version: str | None = None) -> dict[str, Any]:
        """``compat()``, or ``IncompatibleDaemon`` when this SDK (or ``client``: "cli"), at
        ``version`` (by default its own), does not fit the daemon; a daemon older than the
        route is checked by ``/v1/version``."""
        try:
            doc = self.compat()
        except NotFound:
            doc = calls.compat_of_version(self.version())
        return calls.compat_checked(doc, client, version)

    def health(self) -> dict[str, Any]:
        return self._call(calls.health())

    def metrics(self) -> str:
        """Prometheus text."""
        return self._call(calls.metrics())

    def backup(self, passphrase: str) -> bytes:
        """A sealed backup of this member's identity and configuration: the bytes of the file
        `tidemesh daemon restore` reads (never the outbox or inbox)."""
        return self._call(calls.backup(passphrase))

    def rotate_token(self) -> dict[str, Any]:
        """A new local bearer token in the token file; the old one works for
        ``ipc.token_grace_s`` more (60 s by default)."""
        return self._call(calls.rotate_token())

    # -- send side -------------------------------------------------------------------------

    def send(self, message: Mapping[str, Any], idempotency_key: str | None = None
             ) -> wire.SendResult:
        """Hand one message to the daemon; it is on disk when this returns. A retry with the
        same ``idempotency_key`` (or ``client_message_id``) and body is sent once."""
        return self._call(calls.send(message, idempotency_key))

    def send_many(self, messages: Iterable[Mapping[str, Any]]) -> list[wire.BatchResult]:
        """Hand 1-1000 messages to the daemon in one request and one outbox transaction; all
        accepted ones are on disk when this returns. One ``BatchResult`` per message, in
        order, each what ``send`` would have got: a refused message fails no other."""
        return self._call(calls.send_many(messages))

    def outbox_list(self, status: str | None = None, limit: int = 50,
                    before: str | None = None) -> wire.OutboxPage:
        return self._call(calls.outbox_list(status, limit, before))

    def outbox_inspect(self, row_id: str) -> dict[str, Any]:
        return self._call(calls.outbox_inspect(row_id))

    def outbox_requeue(self, row_id: str, new_client_message_id: str | None = None,
                       patch_payload: Mapping[str, Any] | None = None) -> wire.RequeueResult:
        return self._call(calls.outbox_requeue(row_id, new_client_message_id, patch_payload))

    def prune(self, which: Literal["outbox", "inbox"], dry_run: bool = False) -> wire.PruneResult:
        """Run retention now on the ``outbox``, or the ``inbox`` and its events."""
        return self._call(calls.prune(which, dry_run))

    # -- receive side ----------------------------------------------------------------------

    def inbox(self, after: int | None = None, limit: int = 100, topic: str | None = None,
              sender: str | None = None, consumer: str | None = None, q: str | None = None
              ) -> wire.InboxPage:
        """A page of the inbox; ``q`` keeps the entries whose text body matches that FTS5
        query (words, "a phrase", pre*, AND/OR/NOT), in seq order like any page."""
        return self._call(calls.inbox(after, limit, topic, sender, consumer, q))

    def ack(self, consumer: str, up_to: int) -> wire.AckResult:
        return self._call(calls.ack(consumer, up_to))

    def consume(self, name: str, *, limit: int = 100, idle_timeout: float | None = None,
                poll_s: float = 0.5) -> Iterator[wire.InboxEntry]:
        """The named consumer's entries, in order. An entry is acked when the loop asks for
        the next one, so one the program was holding when it stopped comes again next time.
        Ends after ``idle_timeout`` seconds with nothing new (``None``: never)."""
        quiet = Quiet(idle_timeout)
        while True:
            items = self.inbox(limit=limit, consumer=name)["items"]
            if not items:
                if quiet.over():
                    return
                time.sleep(quiet.wait(poll_s))
                continue
            for entry in items:
                yield entry
                self.ack(name, entry["seq"])
            quiet.touch()

    def events(self, since: int | None = None, *, idle_timeout: float | None = None
               ) -> Iterator[Event | Notice]:
        """Follow ``/v1/events`` from after ``since``, reconnecting on its own (across daemon
        restarts) and resuming by ``Last-Event-ID``: no event is missed or given twice.
        ``Notice`` items say something about the stream itself. Ends after ``idle_timeout``
        quiet seconds (``None``: never); raises ``DaemonNotRunning`` only if the first
        connection fails."""
        cursor, quiet, again = Cursor(since), Quiet(idle_timeout), Reconnect()
        fresh = retried = False
        while not quiet.over():
            call = calls.events(cursor)
            try:
                conn, resp = self._open(call, quiet.remaining(), fresh)
            except DaemonNotRunning:
                if (delay := again.delay()) is None:
                    raise
                time.sleep(quiet.wait(delay))
                continue
            again.succeeded()
            try:
                if resp.status == 401 and not retried and self.endpoint.token_file is not None:
                    fresh = retried = True      # a rotated token: read the file once more
                    continue
                if resp.status != 200:
                    call.answer(resp.status, resp.getheader("Content-Type", ""), resp.read())
                fresh = retried = False
                for item in _lines(conn, resp, quiet):
                    if cursor.admit(item):
                        quiet.touch()
                        yield item
            finally:
                conn.close()

    # -- files ---------------------------------------------------------------------------

    def file_share(self, path: str | Path, to: str | Mapping[str, str], *,
                   message: str | None = None, persistent: bool = False) -> dict[str, Any]:
        """Share a local file with ``to`` (as in ``send``); returns when it is uploaded and
        its announcement is on disk. A retry of the same file to the same ``to`` resumes an
        upload that was cut off and is announced once."""
        return self._call(calls.file_share(path, to, message, persistent))

    def file_get(self, file_id: str, out: str | Path) -> dict[str, Any]:
        """Fetch a file shared with this member to ``out``, verified by its SHA-256; a get
        that was cut off resumes when asked again with the same ``out``."""
        return self._call(calls.file_get(file_id, out))

    def file_stream(self, file_id: str, block: int = 1 << 20) -> Iterator[bytes]:
        """A file's bytes (verified by the daemon before the first one comes), in blocks."""
        call = calls.file_get(file_id, None)
        conn, resp = self._open(call, self._timeout(call))
        try:
            if resp.status != 200:
                call.answer(resp.status, resp.getheader("Content-Type", ""), resp.read())
            while data := resp.read(block):
                yield data
        finally:
            conn.close()

    def file_list(self, limit: int = 100) -> dict[str, Any]:
        """Files this member shared or was announced, newest first."""
        return self._call(calls.file_list(limit))

    # -- membership and presence ---------------------------------------------------------

    def membership(self, kind: Kind, action: str, name: str, *, create: bool = False
                   ) -> dict[str, Any]:
        """``topic``: subscribe, unsubscribe, create; ``queue``: consume, leave."""
        return self._call(calls.membership(kind, action, name, create))

    def memberships(self, kind: Kind) -> wire.Memberships:
        return self._call(calls.memberships(kind))

    def peers(self) -> dict[str, Any]:
        return self._call(calls.peers())

    def receipts(self, limit: int = 20) -> list[dict[str, Any]]:
        """The newest ``limit`` sent messages, each with its furthest state (accepted,
        at_broker, delivered, read) and each recipient session's (docs/agents.md)."""
        rows = self.outbox_list(limit=limit)["items"]
        entries: list[dict[str, Any]] = []
        after: int | None = None
        while True:
            page = self.inbox(after=after, limit=1000)
            entries += [dict(e) for e in page["items"]]
            if len(page["items"]) < 1000 and not page.get("more"):   # more: cut by bytes
                return agents.receipt_views(rows, entries)
            after = page.get("next_after")

    def session_register(self, name: str) -> dict[str, Any]:
        """Keep messages for agent session ``name`` (docs/agents.md); a repeat is a no-op."""
        return self._call(calls.session_register(name))

    def sessions(self) -> list[dict[str, Any]]:
        """The agent sessions the daemon keeps messages for, how far each was pushed, read."""
        return self._call(calls.sessions())

    def session_remove(self, name: str) -> dict[str, Any]:
        return self._call(calls.session_remove(name))

    def profile(self, patch: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """This member's profile; with ``patch``, change those fields first."""
        return self._call(calls.profile(patch))


def _lines(conn: http.client.HTTPConnection, resp: http.client.HTTPResponse,
           quiet: Quiet) -> Iterator[Event | Notice]:
    """Parsed items until the stream ends, breaks, or stays quiet too long."""
    parser = Parser()
    while not quiet.over():
        if conn.sock is not None:
            conn.sock.settimeout(quiet.remaining())
        try:
            raw = resp.readline()
        except _UNREACHABLE:  # a timeout (quiet too long) or a dropped daemon
            return
        if not raw:
            return
        item = parser.feed(raw.decode("utf-8"))
        if item is not None:
            yield item

