"""The typed client of a daemon's IPC surface, over its Unix socket (stdlib only).

HTTP errors come back as the ``core.errors`` tree; a daemon that does not answer is
``DaemonNotRunning`` with a hint.
"""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict, cast
from urllib.parse import quote

from tidemesh.core.errors import TidemeshError, from_body


class DaemonNotRunning(TidemeshError):
    code = "daemon_not_running"
    http_status = 503


class SendResult(TypedDict, total=False):
    client_message_id: str
    outbox_id: str
    status: str
    duplicate: bool
    broker_message_id: str | None
    history_id: str | None


class RequeueResult(TypedDict):
    aborted_row_id: str
    new_row_id: str
    new_client_message_id: str


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: Any


class DaemonClient:
    def __init__(self, socket_path: Path, timeout: float = 10.0) -> None:
        self.socket_path = socket_path
        self.timeout = timeout

    def request(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> Response:
        """Send one request; returns any 2xx response, raises the error tree otherwise."""
        conn = _UnixConnection(str(self.socket_path), self.timeout)
        payload = None if body is None else json.dumps(body).encode()
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        try:
            conn.request(method, path, body=payload, headers=hdrs)
            resp = conn.getresponse()
            raw = resp.read()
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise DaemonNotRunning(
                f"no daemon answers on {self.socket_path}; start one with `tidemesh daemon up`"
            ) from exc
        except (TimeoutError, OSError, http.client.HTTPException) as exc:
            raise DaemonNotRunning(
                f"the daemon on {self.socket_path} did not answer: {exc}"
            ) from exc
        finally:
            conn.close()
        ctype = resp.getheader("Content-Type", "")
        data: Any = json.loads(raw) if "json" in ctype and raw else raw.decode()
        if resp.status >= 400:
            raise from_body(resp.status, data)
        return Response(resp.status, data)

    def version(self) -> dict[str, Any]:
        return cast(dict[str, Any], self.request("GET", "/v1/version").body)

    def health(self) -> dict[str, Any]:
        return cast(dict[str, Any], self.request("GET", "/v1/health").body)

    def send(self, request: dict[str, Any], idempotency_key: str | None = None) -> SendResult:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        return cast(SendResult, self.request("POST", "/v1/send", request, headers).body)

    def outbox_list(self, status: str | None = None, limit: int = 50) -> dict[str, Any]:
        query = f"?limit={limit}" + (f"&status={status}" if status else "")
        return cast(dict[str, Any], self.request("GET", "/v1/outbox" + query).body)

    def outbox_inspect(self, row_id: str) -> dict[str, Any]:
        return cast(dict[str, Any], self.request("GET", f"/v1/outbox/{row_id}").body)

    def outbox_requeue(
        self, row_id: str, new_client_message_id: str | None = None,
        patch_payload: dict[str, Any] | None = None,
    ) -> RequeueResult:
        body: dict[str, Any] = {"id": row_id}
        if new_client_message_id:
            body["new_client_message_id"] = new_client_message_id
        if patch_payload is not None:
            body["patch_payload"] = patch_payload
        return cast(RequeueResult, self.request("POST", "/v1/outbox/requeue", body).body)

    def prune(self, which: str, dry_run: bool = False) -> dict[str, Any]:
        """Run retention now on the ``outbox`` or the ``inbox`` (and its events)."""
        return cast(dict[str, Any], self.request(
            "POST", f"/v1/{which}/prune", {"dry_run": dry_run}).body)

    def metrics(self) -> str:
        return str(self.request("GET", "/v1/metrics").body)

    # -- receive side --------------------------------------------------------------------

    def inbox(self, after: int | None = None, limit: int = 100, topic: str | None = None,
              sender: str | None = None, consumer: str | None = None) -> dict[str, Any]:
        params = {"after": after, "limit": limit, "topic": topic, "from": sender,
                  "consumer": consumer}
        query = "&".join(f"{k}={quote(str(v))}" for k, v in params.items() if v is not None)
        return cast(dict[str, Any], self.request("GET", "/v1/inbox?" + query).body)

    def inbox_ack(self, consumer: str, up_to: int) -> dict[str, Any]:
        return cast(dict[str, Any], self.request(
            "POST", "/v1/inbox/ack", {"consumer": consumer, "up_to": up_to}).body)

    def events(self, since: int | None = None, idle_timeout: float | None = None
               ) -> Iterator[Event]:
        """Follow ``/v1/events`` (from ``since``); ends when ``idle_timeout`` passes quietly."""
        conn = _UnixConnection(str(self.socket_path), idle_timeout or 3600.0)
        headers = {"Accept": "text/event-stream"}
        if since is not None:
            headers["Last-Event-ID"] = str(since)
        try:
            conn.request("GET", "/v1/events", headers=headers)
            resp = conn.getresponse()
            if resp.status != 200:
                raise from_body(resp.status, json.loads(resp.read() or b"{}"))
            yield from _parse_sse(resp)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise DaemonNotRunning(f"no daemon answers on {self.socket_path}") from exc
        except TimeoutError:
            return
        finally:
            conn.close()

    # -- membership ----------------------------------------------------------------------

    def membership(self, kind: str, action: str, name: str,
                   create: bool = False) -> dict[str, Any]:
        group = "topics" if kind == "topic" else "queues"
        body: dict[str, Any] = {"name": name}
        if create:
            body["create"] = True
        return cast(dict[str, Any], self.request("POST", f"/v1/{group}/{action}", body).body)

    def memberships(self, kind: str) -> dict[str, Any]:
        group = "topics" if kind == "topic" else "queues"
        return cast(dict[str, Any], self.request("GET", f"/v1/{group}").body)


@dataclass(frozen=True, slots=True)
class Event:
    id: int | None    # None: a notice about the stream itself (history_truncated, cursor_ahead)
    type: str
    data: dict[str, Any]


def _parse_sse(resp: http.client.HTTPResponse) -> Iterator[Event]:
    fields: dict[str, str] = {}
    for raw in resp:
        line = raw.decode("utf-8").rstrip("\r\n")
        if line == "":
            if "data" in fields:
                yield Event(int(fields["id"]) if "id" in fields else None,
                            fields.get("event", "message"), json.loads(fields["data"]))
            fields = {}
        elif not line.startswith(":"):
            key, _, value = line.partition(":")
            fields[key] = value.removeprefix(" ")
