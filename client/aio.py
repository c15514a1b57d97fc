"""``AsyncClient``: the asyncio SDK, over aiohttp on the daemon's Unix socket or loopback TCP.

Use it as ``async with AsyncClient.for_mesh("team") as client:`` (or call ``aclose()``).
Connections are not pooled, so a daemon restart never leaves a stale one behind.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, TypeVar

import aiohttp

from tidemesh.client import calls, wire
from tidemesh.client.calls import Call, Kind, Response
from tidemesh.client.endpoint import Located
from tidemesh.client.errors import DaemonNotRunning
from tidemesh.client.stream import Cursor, Event, Notice, Parser, Quiet, Reconnect
from tidemesh.core import agents
from tidemesh.core.errors import NotFound

T = TypeVar("T")
_UNREACHABLE = (aiohttp.ClientError, OSError, TimeoutError)


class AsyncClient(Located):
    """The asyncio twin of ``Client``: the same calls, awaited; ``events()`` and
    ``consume()`` are async iterators."""

    def __init__(self, socket_path: str | Path | None = None, *, port: int | None = None,
                 token_file: str | Path | None = None, mesh: str | None = None,
                 timeout: float = 10.0) -> None:
        super().__init__(socket_path, port=port, token_file=token_file, mesh=mesh,
                         timeout=timeout)
        self._http: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    # -- transport -------------------------------------------------------------------------

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None:
            path = self.endpoint.socket_path
            connector = (aiohttp.UnixConnector(path=str(path), force_close=True) if path
                         else aiohttp.TCPConnector(force_close=True))
            self._http = aiohttp.ClientSession(base_url=self.endpoint.base_url,
                                               connector=connector)
        return self._http

    async def _open(self, call: Call[Any], limits: aiohttp.ClientTimeout, fresh: bool = False,
                    moved: bool = False) -> aiohttp.ClientResponse:
        self.endpoint.check_socket()
        headers = {"Content-Type": "application/json", **self.auth_headers(fresh), **call.headers}
        try:
            return await self._session().request(call.method, call.path, data=call.payload(),
                                                 headers=headers, timeout=limits)
        except _UNREACHABLE as exc:
            # A daemon that restarted listens on a new TCP port: follow it once.
            if not moved and (there := self.endpoint.moved()) is not None:
                self.endpoint = there
                if self._http is not None:   # its base URL names the old port
                    await self._http.close()
                    self._http = None
                return await self._open(call, limits, fresh, moved=True)
            raise self.endpoint.not_running(_os_error(exc)) from exc

    async def _call(self, call: Call[T]) -> T:
        status, content_type, raw = await self._exchange(call)
        if status == 401 and self.endpoint.token_file is not None:
            # The token may have been rotated since the file was read: read it once more.
            status, content_type, raw = await self._exchange(call, fresh=True)
        return call.answer(status, content_type, raw)

    def _timeout(self, call: Call[Any]) -> float | None:
        if call.timeout is None or self.timeout is None:
            return self.timeout
        return max(self.timeout, call.timeout)

    async def _exchange(self, call: Call[Any], fresh: bool = False
                        ) -> tuple[int, str, bytes]:
        resp = await self._open(call, aiohttp.ClientTimeout(total=self._timeout(call)), fresh)
        try:
            raw = await resp.read()
        except _UNREACHABLE as exc:
            raise self.endpoint.not_running(_os_error(exc)) from exc
        finally:
            resp.release()
        return resp.status, resp.headers.get("Content-Type", ""), raw

    async def request(self, method: str, path: str, body: Any = None,
                      headers: Mapping[str, str] | None = None) -> Response:
        """Any route, for what has no method here; returns a 2xx, raises the error tree."""
        return await self._call(calls.request(method, path, body, headers))

    # -- the daemon ------------------------------------------------------------------------

    async def version(self) -> dict[str, Any]:
        return await self._call(calls.version())

    async def compat(self) -> dict[str, Any]:
        """The versions the daemon works with (``GET /v1/compat``)."""
        return await self._call(calls.compat())

    async def check_compatible(self, client: str = "python",
                               version: str | None = None) -> dict[str, Any]:
        """``compat()``, or ``IncompatibleDaemon`` when this SDK (at ``version``, by default
        its own) does not fit the daemon."""
        try:
            doc = await self.compat()
        except NotFound:
            doc = calls.compat_of_version(await self.version())
        return calls.compat_checked(doc, client, version)

    async def health(self) -> dict[str, Any]:
        return await self._call(calls.health())

    async def metrics(self) -> str:
        return await self._call(calls.metrics())

    async def backup(self, passphrase: str) -> bytes:
        return await self._call(calls.backup(passphrase))

    async def rotate_token(self) -> dict[str, Any]:
        return await self._call(calls.rotate_token())

    # -- send side -------------------------------------------------------------------------

    async def send(self, message: Mapping[str, Any], idempotency_key: str | None = None
                   ) -> wire.SendResult:
        return await self._call(calls.send(message, idempotency_key))

    async def send_many(self, messages: Iterable[Mapping[str, Any]]
                        ) -> list[wire.BatchResult]:
        return await self._call(calls.send_many(messages))

    async def outbox_list(self, status: str | None = None, limit: int = 50,
                          before: str | None = None) -> wire.OutboxPage:
        return await self._call(calls.outbox_list(status, limit, before))

    async def outbox_inspect(self, row_id: str) -> dict[str, Any]:
        return await self._call(calls.outbox_inspect(row_id))

    async def outbox_requeue(self, row_id: str, new_client_message_id: str | None = None,
                             patch_payload: Mapping[str, Any] | None = None) -> wire.RequeueResult:
        return await self._call(
            calls.outbox_requeue(row_id, new_client_message_id, patch_payload))

    async def prune(self, which: Literal["outbox", "inbox"], dry_run: bool = False
                    ) -> wire.PruneResult:
        return await self._call(calls.prune(which, dry_run))

    # -- receive side ----------------------------------------------------------------------

    async def inbox(self, after: int | None = None, limit: int = 100, topic: str | None = None,
                    sender: str | None = None, consumer: str | None = None,
                    q: str | None = None) -> wire.InboxPage:
        """A page of the inbox; ``q`` searches the text bodies (see ``Client.inbox``)."""
        return await self._call(calls.inbox(after, limit, topic, sender, consumer, q))

    async def ack(self, consumer: str, up_to: int) -> wire.AckResult:
        return await self._call(calls.ack(consumer, up_to))

    async def consume(self, name: str, *, limit: int = 100, idle_timeout: float | None = None,
                      poll_s: float = 0.5) -> AsyncIterator[wire.InboxEntry]:
        """As ``Client.consume``: each entry is acked when the loop asks for the next."""
        quiet = Quiet(idle_timeout)
        while True:
            items = (await self.inbox(limit=limit, consumer=name))["items"]
            if not items:
                if quiet.over():
                    return
                await asyncio.sleep(quiet.wait(poll_s))
                continue
            for entry in items:
                yield entry
                await self.ack(name, entry["seq"])
            quiet.touch()

    async def events(self, since: int | None = None, *, idle_timeout: float | None = None
                     ) -> AsyncIterator[Event | Notice]:
        """As ``Client.events``: resumes by ``Last-Event-ID`` across reconnects and daemon
        restarts, never missing or repeating an event."""
        cursor, quiet, again = Cursor(since), Quiet(idle_timeout), Reconnect()
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.timeout)
        fresh = retried = False
        while not quiet.over():
            call = calls.events(cursor)
            try:
                resp = await self._open(call, timeout, fresh)
            except DaemonNotRunning:
                if (delay := again.delay()) is None:
                    raise
                await asyncio.sleep(quiet.wait(delay))
                continue
            again.succeeded()
            try:
                if resp.status == 401 and not retried and self.endpoint.token_file is not None:
                    fresh = retried = True      # a rotated token: read the file once more
                    continue
                if resp.status != 200:
                    call.answer(resp.status, resp.headers.get("Content-Type", ""),
                                await resp.read())
                fresh = retried = False
                async for item in _lines(resp, quiet):
                    if cursor.admit(item):
                        quiet.touch()
                        yield item
            finally:
                resp.close()

    # -- membership and presence ---------------------------------------------------------

    # -- files ---------------------------------------------------------------------------

    async def file_share(self, path: str | Path, to: str | Mapping[str, str], *,
                         message: str | None = None, persistent: bool = False
                         ) -> dict[str, Any]:
        """As ``Client.file_share``."""
        return await self._call(calls.file_share(path, to, message, persistent))

    async def file_get(self, file_id: str, out: str | Path) -> dict[str, Any]:
        """As ``Client.file_get``."""
        return await self._call(calls.file_get(file_id, out))

    async def file_stream(self, file_id: str, block: int = 1 << 20) -> AsyncIterator[bytes]:
        """As ``Client.file_stream``."""
        call = calls.file_get(file_id, None)
        resp = await self._open(call, aiohttp.ClientTimeout(total=self._timeout(call)))
        try:
            if resp.status != 200:
                call.answer(resp.status, resp.headers.get("Content-Type", ""),
                            await resp.read())
            async for data in resp.content.iter_chunked(block):
                yield data
        finally:
            resp.release()

    async def file_list(self, limit: int = 100) -> dict[str, Any]:
        return await self._call(calls.file_list(limit))

    async def membership(self, kind: Kind, action: str, name: str, *, create: bool = False
                         ) -> dict[str, Any]:
        return await self._call(calls.membership(kind, action, name, create))

    async def memberships(self, kind: Kind) -> wire.Memberships:
        return await self._call(calls.memberships(kind))

    async def peers(self) -> dict[str, Any]:
        return await self._call(calls.peers())

    async def receipts(self, limit: int = 20) -> list[dict[str, Any]]:
        """The newest ``limit`` sent messages, each with its furthest state (accepted,
        at_broker, delivered, read) and each recipient session's (docs/agents.md)."""
        rows = (await self.outbox_list(limit=limit))["items"]
        entries: list[dict[str, Any]] = []
        after: int | None = None
        while True:
            page = await self.inbox(after=after, limit=1000)
            entries += [dict(e) for e in page["items"]]
            if len(page["items"]) < 1000 and not page.get("more"):   # more: cut by bytes
                return agents.receipt_views(rows, entries)
            after = page.get("next_after")

    async def session_register(self, name: str) -> dict[str, Any]:
        """Keep messages for agent session ``name`` (docs/agents.md); a repeat is a no-op."""
        return await self._call(calls.session_register(name))

    async def sessions(self) -> list[dict[str, Any]]:
        return await self._call(calls.sessions())

    async def session_remove(self, name: str) -> dict[str, Any]:
        return await self._call(calls.session_remove(name))

    async def profile(self, patch: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return await self._call(calls.profile(patch))


async def _lines(resp: aiohttp.ClientResponse, quiet: Quiet) -> AsyncIterator[Event | Notice]:
    """Parsed items until the stream ends, breaks, or stays quiet too long."""
    parser = Parser()
    while not quiet.over():
        try:
            async with asyncio.timeout(quiet.remaining()):
                raw = await resp.content.readline()
        except _UNREACHABLE:  # a timeout (quiet too long) or a dropped daemon
            return
        if not raw:
            return
        item = parser.feed(raw.decode("utf-8"))
        if item is not None:
            yield item


def _os_error(exc: BaseException) -> BaseException:
    """The socket's own error inside aiohttp's, so "not running" reads the same as in sync."""
    return exc.os_error if isinstance(exc, aiohttp.ClientConnectorError) else exc
