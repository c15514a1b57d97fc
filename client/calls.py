"""Each IPC call as data: method, path, body, headers, and how to read the answer (sans-I/O).

``Client`` and ``AsyncClient`` differ only in how they carry a ``Call`` to the daemon; what
is asked and how the answer is read lives here, once.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar
from urllib.parse import quote, urlencode

import tidemesh
from tidemesh.client import wire
from tidemesh.client.errors import IncompatibleDaemon
from tidemesh.client.stream import Cursor
from tidemesh.core import compat as compat_mod
from tidemesh.core import files as _files  # noqa: F401  (its errors, for from_body)
from tidemesh.core.errors import from_body

T = TypeVar("T")
Kind = Literal["topic", "queue"]
_GROUP: dict[str, str] = {"topic": "topics", "queue": "queues"}


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: Any


def _body(resp: Response) -> Any:
    return resp.body


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    method: str
    path: str
    read: Callable[[Response], T]
    body: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)
    # Seconds this call may take at least, whatever the client's own timeout (a file moves
    # for as long as its bytes take).
    timeout: float | None = None

    def payload(self) -> bytes | None:
        return None if self.body is None else json.dumps(self.body).encode()

    def answer(self, status: int, content_type: str, raw: bytes) -> T:
        """The typed result of a 2xx; the ``core.errors`` class of any other answer."""
        body: Any = json.loads(raw) if "json" in content_type and raw else raw.decode()
        if status >= 400:
            raise from_body(status, body)
        return self.read(Response(status, body))


def _query(**params: object) -> str:
    kept = {k.rstrip("_"): v for k, v in params.items() if v is not None}
    return "?" + urlencode(kept, quote_via=quote) if kept else ""


def request(method: str, path: str, body: Any = None,
            headers: Mapping[str, str] | None = None) -> Call[Response]:
    return Call(method, path, lambda r: r, body, headers or {})


def version() -> Call[dict[str, Any]]:
    return Call("GET", "/v1/version", _body)


def compat() -> Call[dict[str, Any]]:
    return Call("GET", "/v1/compat", _body)


def compat_of_version(version: Mapping[str, Any]) -> dict[str, Any]:
    """What a daemon older than ``/v1/compat`` says of itself, as a compat document: its
    IPC API only, no ranges."""
    return {"daemon": version.get("daemon_version", "?"), "ipc_api": version.get("ipc_api")}


def compat_checked(doc: dict[str, Any], client: str,
                   version: str | None = None) -> dict[str, Any]:
    """``doc``, or ``IncompatibleDaemon`` saying why ``client`` at ``version`` (by default
    this release) does not fit."""
    version = version or tidemesh.__version__
    why = compat_mod.misfit(doc, client, version)
    if why is None:
        return doc
    kind, message = why
    advice = ("use a tidemesh of the daemon's IPC API" if kind == "ipc_api" else
              "upgrade (or downgrade) tidemesh so that the daemon and its clients match")
    raise IncompatibleDaemon(f"{message}: {advice}", kind=kind, daemon=doc.get("daemon"),
                             client=client, client_version=version)


def health() -> Call[dict[str, Any]]:
    return Call("GET", "/v1/health", _body)


def metrics() -> Call[str]:
    return Call("GET", "/v1/metrics", lambda r: str(r.body))


def send(message: Mapping[str, Any], idempotency_key: str | None) -> Call[wire.SendResult]:
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
    return Call("POST", "/v1/send", _body, dict(message), headers)


def send_many(messages: Iterable[Mapping[str, Any]]) -> Call[list[wire.BatchResult]]:
    return Call("POST", "/v1/send_batch", lambda r: r.body["results"],
                {"sends": [dict(m) for m in messages]})


def outbox_list(status: str | None, limit: int, before: str | None) -> Call[wire.OutboxPage]:
    return Call("GET", "/v1/outbox" + _query(limit=limit, status=status, before=before), _body)


def outbox_inspect(row_id: str) -> Call[dict[str, Any]]:
    return Call("GET", f"/v1/outbox/{quote(row_id, safe='')}", _body)


def outbox_requeue(row_id: str, new_client_message_id: str | None,
                   patch_payload: Mapping[str, Any] | None) -> Call[wire.RequeueResult]:
    body: dict[str, Any] = {"id": row_id}
    if new_client_message_id:
        body["new_client_message_id"] = new_client_message_id
    if patch_payload is not None:
        body["patch_payload"] = dict(patch_payload)
    return Call("POST", "/v1/outbox/requeue", _body, body)


def prune(which: Literal["outbox", "inbox"], dry_run: bool) -> Call[wire.PruneResult]:
    return Call("POST", f"/v1/{which}/prune", _body, {"dry_run": dry_run})


def inbox(after: int | None, limit: int, topic: str | None, sender: str | None,
          consumer: str | None, q: str | None = None) -> Call[wire.InboxPage]:
    query = _query(after=after, limit=limit, topic=topic, from_=sender, consumer=consumer, q=q)
    return Call("GET", "/v1/inbox" + query, _body)


def ack(consumer: str, up_to: int) -> Call[wire.AckResult]:
    return Call("POST", "/v1/inbox/ack", _body, {"consumer": consumer, "up_to": up_to})


def membership(kind: Kind, action: str, name: str, create: bool) -> Call[dict[str, Any]]:
    body: dict[str, Any] = {"name": name, **({"create": True} if create else {})}
    return Call("POST", f"/v1/{_GROUP[kind]}/{action}", _body, body)


def memberships(kind: Kind) -> Call[wire.Memberships]:
    return Call("GET", f"/v1/{_GROUP[kind]}", _body)


def peers() -> Call[dict[str, Any]]:
    return Call("GET", "/v1/peers", _body)


def session_register(name: str) -> Call[dict[str, Any]]:
    return Call("POST", "/v1/sessions/register", _body, {"name": name})


def sessions() -> Call[list[dict[str, Any]]]:
    return Call("GET", "/v1/sessions", lambda r: list(r.body["sessions"]))


def session_remove(name: str) -> Call[dict[str, Any]]:
    return Call("POST", "/v1/sessions/remove", _body, {"name": name})


def profile(patch: Mapping[str, Any] | None) -> Call[dict[str, Any]]:
    if patch:
        return Call("POST", "/v1/profile", _body, dict(patch))
    return Call("GET", "/v1/profile", _body)


def backup(passphrase: str) -> Call[bytes]:
    return Call("POST", "/v1/backup", lambda r: base64.b64decode(r.body["bundle"]),
                {"passphrase": passphrase})


def rotate_token() -> Call[dict[str, Any]]:
    return Call("POST", "/v1/token/rotate", _body, {})


# A share or get answers once the whole file has moved (100 MiB in seconds to minutes).
FILE_TIMEOUT_S = 3600.0


def _absolute(path: str | os.PathLike[str]) -> str:
    """The daemon reads and writes files as its own process: a relative path is the caller's."""
    return os.path.abspath(os.fspath(path))


def file_share(path: str | os.PathLike[str], to: str | Mapping[str, str], message: str | None,
               persistent: bool) -> Call[dict[str, Any]]:
    body: dict[str, Any] = {"path": _absolute(path), "to": to if isinstance(to, str) else dict(to)}
    if message is not None:
        body["message"] = message
    if persistent:
        body["persistent"] = True
    return Call("POST", "/v1/file/share", _body, body, timeout=FILE_TIMEOUT_S)


def file_get(file_id: str, out: str | os.PathLike[str] | None) -> Call[dict[str, Any]]:
    """With ``out`` the JSON answer; without, the answer's bytes are read as a stream."""
    where = None if out is None else _absolute(out)
    return Call("GET", "/v1/file/get" + _query(id=file_id, out=where), _body,
                timeout=FILE_TIMEOUT_S)


def file_list(limit: int) -> Call[dict[str, Any]]:
    return Call("GET", "/v1/file/list" + _query(limit=limit), _body)


def events(cursor: Cursor) -> Call[Response]:
    """The stream's request; its body is read line by line, not by ``answer``."""
    return Call("GET", "/v1/events", lambda r: r, headers=cursor.headers())
