"""Thin handlers: decode and validate, call a service, encode. No SQL and no rules here."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import time
from collections.abc import Awaitable
from functools import cache
from importlib import resources
from typing import Any
from urllib.parse import quote

import orjson
from aiohttp import web

from tidemesh.core import compat, metrics, numbers, tracing
from tidemesh.core.errors import InvalidRequest
from tidemesh.core.send import Destination, SendRequest, parse_send_request
from tidemesh.daemon.api.exchange import Answer, Parsed, json_answer
from tidemesh.daemon.api.keys import (
    BACKUP,
    CAPABILITIES,
    DISK,
    FILES,
    INBOX,
    MEMBERSHIP,
    OUTBOX,
    PRESENCE,
    RETENTION,
    STATE,
)
from tidemesh.daemon.api.naming import batch_named, named
from tidemesh.daemon.api.responses import batch_item, scoped_outcome, send_response
from tidemesh.daemon.api.validation import checked, parse_json
from tidemesh.daemon.membership import token_rotation
from tidemesh.daemon.records import BatchItem, Page, SendKind, SendOutcome
from tidemesh.daemon.service.outbox import OutboxService

_STATUSES = ("pending", "inflight", "done", "dead", "aborted")


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


def _int_param(request: web.Request, name: str, default: int, lo: int, hi: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    return numbers.bounded(raw, name, lo, hi)


async def get_version(request: web.Request) -> web.Response:
    state = request.app[STATE]
    info = state.info
    inbox = request.app.get(INBOX)
    # A program can tell whether ?q= will answer before it asks ([inbox] fts_enabled).
    search = ["inbox_search"] if inbox is not None and inbox.search_enabled else []
    return _json({
        "daemon_version": info.version,
        "ipc_api": compat.IPC_API,
        "ipc_features": ["version", "compat", "health", "send", "send_batch", "outbox", "inbox",
                         "consumers", "events", "metrics", "files", *search],
        "schema_version": info.schema_version,
        "mesh": info.mesh,
        "broker_features": state.link.broker_features,
        "broker_features_negotiated": state.link.broker_features_negotiated,
    })


async def get_compat(request: web.Request) -> web.Response:
    state = request.app[STATE]
    return _json(compat.document(state.info.version, state.link.broker_version))


async def get_health(request: web.Request) -> web.Response:
    state = request.app[STATE]
    counts, lag_ms = await request.app[OUTBOX].snapshot()
    info = state.info
    loop = state.loop()
    writes = request.app[INBOX].write_health
    return _json({
        "healthy": state.healthy and loop["state"] == "ok" and writes.healthy,
        "loop": loop,
        "inbox_writes": writes.view(),
        "connected": state.link.connected,
        # "clone_suspected" when the broker says another host presents this member's key.
        "link_state": "clone_suspected" if state.link.clone_suspected
        else state.link.broker_state,
        "clone_suspected": state.link.clone_suspected,
        "lag_ms": lag_ms,
        "queue_depth": counts,
        "inflight": counts.get("inflight", 0),
        "mesh": info.mesh,
        "member_pubkey": info.member_pubkey,
        "uptime_s": round(time.monotonic() - info.started_monotonic, 3),
        "schema_version": info.schema_version,
        "daemon_version": info.version,
        "broker_version": state.link.broker_version,
        "broker_url": state.link.broker_url,
        "pid": os.getpid(),
        "disk": request.app[DISK].view(),
        "environment": info.environment,
    })


def _send_request(data: Any, header_id: str | None = None,
                  traceparent: str | None = None) -> SendRequest:
    """A send body validated against its schema and parsed, once."""
    return parse_send_request(checked("send_request.schema.json", data), header_id, traceparent)


def _given(data: dict[str, Any], header: str | None) -> str | None:
    """The traceparent the caller gave (header, else field); None when the daemon made it."""
    return header if header is not None else data.get("traceparent")


def _traced(req: SendRequest, hop: tracing.Hop) -> SendRequest:
    """``req`` carrying the accept span's traceparent (the same request when tracing is off)."""
    onward = hop.onward(req.traceparent)
    return req if onward is req.traceparent else dataclasses.replace(req, traceparent=onward)


def _submit(outbox: OutboxService, req: SendRequest, data: dict[str, Any],
            header: str | None) -> Awaitable[SendOutcome]:
    """One send into the outbox; with tracing on, inside its accept span."""
    if not tracing.enabled():   # the hot path pays one call when tracing is off
        return outbox.submit(req)
    return _submit_traced(outbox, req, _given(data, header))


async def _submit_traced(outbox: OutboxService, req: SendRequest,
                         given: str | None) -> SendOutcome:
    """The accept span is a child of the caller's trace context (a root when the caller
    gave none); the row keeps the span's traceparent, so the send to the broker is its child."""
    with tracing.span("tidemesh.daemon.accept", (given,),
                      {"tidemesh.kind": req.to.kind.value}) as hop:
        out = await outbox.submit(_traced(req, hop))
        hop.set("tidemesh.client_message_id", out.client_message_id)
        hop.set("tidemesh.outcome", out.kind.value)
        return out


async def post_send(app: web.Application, req: Parsed) -> Answer:
    """POST /v1/send, on aiohttp and on the Unix socket's send lane alike. With a hook's
    reply token it sees only the rows its token made."""
    data, header = parse_json(req.body), req.headers.get("traceparent")
    sreq = await named(app, _send_request(data, req.headers.get("idempotency-key"), header))
    out = await _submit(app[OUTBOX], sreq, data, header)
    token = req.reply_token
    if token is not None:
        caps = app[CAPABILITIES]
        out = scoped_outcome(out, caps.owns(token, out.row.id))
        if out.kind is SendKind.NEW:
            caps.made(token, out.row.id)
    status, body = send_response(out)
    return json_answer(body, status)


def _batch_item(data: Any) -> BatchItem:
    """One send of a batch, or the 400 /v1/send would have answered it with."""
    try:
        return _send_request(data)
    except InvalidRequest as exc:
        return exc


async def post_send_batch(app: web.Application, req: Parsed) -> Answer:
    """POST /v1/send_batch, on aiohttp and on the send lane alike: 1-1000 sends, each
    answered as /v1/send would, in one 200. An Idempotency-Key header is refused."""
    if "idempotency-key" in req.headers:
        raise InvalidRequest("a batch takes no Idempotency-Key header; give each send its own "
                             "client_message_id", field="Idempotency-Key")
    data = checked("send_batch_request.schema.json", parse_json(req.body))
    items = await batch_named(app, [_batch_item(d) for d in data["sends"]])
    with tracing.span("tidemesh.daemon.accept", _batch_parents(data["sends"], items),
                      {"tidemesh.batch_size": len(items)}) as hop:
        if len(items) == 1 and isinstance(items[0], SendRequest):
            items[0] = _traced(items[0], hop)
        outcomes = await app[OUTBOX].submit_many(items)
    return json_answer({"results": [batch_item(o) for o in outcomes]})


def _batch_parents(sends: list[dict[str, Any]], items: list[BatchItem]) -> list[str | None]:
    """A batch span's parents: a lone send's given traceparent, or each send's to link."""
    if not tracing.enabled():
        return []
    if len(items) == 1 and isinstance(items[0], SendRequest):
        return [_given(sends[0], None)]
    return [it.traceparent for it in items if isinstance(it, SendRequest)]


async def get_outbox(request: web.Request) -> web.Response:
    status = request.query.get("status")
    if status == "failed":
        status = "dead"
    if status is not None and status not in _STATUSES:
        raise InvalidRequest(f"status must be one of {', '.join(_STATUSES)} or failed",
                             field="status")
    limit = _int_param(request, "limit", 50, 1, 1000)
    return _json(await request.app[OUTBOX].list_rows(status, limit, request.query.get("before")))


async def get_outbox_row(request: web.Request) -> web.Response:
    return _json(await request.app[OUTBOX].inspect(request.match_info["id"]))


async def post_outbox_requeue(request: web.Request) -> web.Response:
    data = checked("requeue_request.schema.json", parse_json(await request.read()))
    patch = None
    if "patch_payload" in data:
        if "client_message_id" in data["patch_payload"]:
            raise InvalidRequest("patch_payload must not carry client_message_id; use "
                                 "new_client_message_id", field="patch_payload.client_message_id")
        patch = parse_send_request(data["patch_payload"])
    result = await request.app[OUTBOX].requeue(
        data["id"], data.get("new_client_message_id"), patch, data.get("aborted_by", "operator")
    )
    return _json(result)


async def _dry_run(request: web.Request) -> bool:
    raw = await request.read()
    # No body is the defaults; anything sent must be the JSON the schema names.
    data = checked("prune_request.schema.json", parse_json(raw)) if raw else {}
    return bool(data.get("dry_run", False))


async def post_outbox_prune(request: web.Request) -> web.Response:
    return _json(await request.app[RETENTION].prune_outbox(await _dry_run(request)))


async def post_inbox_prune(request: web.Request) -> web.Response:
    return _json(await request.app[RETENTION].prune_inbox(await _dry_run(request)))


@cache
def _openapi_body() -> bytes:
    return (resources.files("tidemesh.schemas") / "openapi.json").read_bytes()


async def get_openapi(request: web.Request) -> web.Response:
    # The committed document, which a test keeps equal to the route table and schemas/.
    body = await asyncio.to_thread(_openapi_body)
    return web.Response(body=body, content_type="application/json")


async def get_metrics(request: web.Request) -> web.Response:
    state = request.app[STATE]
    state.outbox.counts, state.outbox.lag_ms = await request.app[OUTBOX].snapshot()
    return web.Response(body=metrics.render(state.registry),
                        headers={"Content-Type": metrics.CONTENT_TYPE_LATEST})


async def get_inbox(request: web.Request) -> web.Response:
    q = request.query
    after = _int_param(request, "after", 0, 0, numbers.MAX_ID) if "after" in q else None
    page = Page(after, _int_param(request, "limit", 100, 1, 1000), q.get("topic"), q.get("from"),
                _search_query(q.get("q")))
    consumer = q.get("consumer")
    if consumer is None:
        served = await request.app[INBOX].page(page)
        response = _json(served)
        if served["more"]:   # the byte budget ended the page: where the next one starts
            response.headers["Link"] = (
                f"<{request.rel_url.update_query(after=served['next_after'])}>; rel=\"next\"")
        return response
    if after is not None:
        raise InvalidRequest("a named consumer reads after its own cursor; drop `after`",
                             field="after")
    if page.q is not None:
        raise InvalidRequest("a named consumer reads every entry in order; drop `q`",
                             field="q")
    _check_consumer_name(consumer)
    return _json(await request.app[INBOX].consumer_read(consumer, page))


# Bounds the work of parsing one search (FTS5 parses it on the reader's thread).
MAX_SEARCH_QUERY = 1024


def _search_query(text: str | None) -> str | None:
    if text is None:
        return None
    if not text.strip():
        raise InvalidRequest("q is empty; give the words to search for", field="q")
    if len(text) > MAX_SEARCH_QUERY:
        raise InvalidRequest(f"q is longer than {MAX_SEARCH_QUERY} characters", field="q")
    return text


def _check_consumer_name(name: str) -> None:
    if not (0 < len(name) <= 128 and name.isprintable() and name.isascii()):
        raise InvalidRequest("consumer must be 1-128 printable ASCII characters",
                             field="consumer")


async def post_inbox_ack(request: web.Request) -> web.Response:
    data = checked("inbox_ack_request.schema.json", parse_json(await request.read()))
    _check_consumer_name(data["consumer"])
    return _json(await request.app[INBOX].consumer_ack(data["consumer"], data["up_to"]))


def _kind(request: web.Request) -> str:
    return "topic" if request.path.startswith("/v1/topics") else "queue"


async def post_membership(request: web.Request) -> web.Response:
    """/v1/topics/subscribe|unsubscribe|create and /v1/queues/consume|leave."""
    data = checked("membership_request.schema.json", parse_json(await request.read()))
    svc, kind, action = request.app[MEMBERSHIP], _kind(request), request.path.rsplit("/", 1)[1]
    if action == "create":
        return _json(await svc.create_topic(data["name"]))
    if action in ("subscribe", "consume"):
        return _json(await svc.join(kind, data["name"], bool(data.get("create", False))))
    return _json(await svc.leave(kind, data["name"]))


async def get_memberships(request: web.Request) -> web.Response:
    return _json(await request.app[MEMBERSHIP].list(_kind(request)))


async def get_peers(request: web.Request) -> web.Response:
    return _json(await request.app[PRESENCE].peers())


async def get_profile(request: web.Request) -> web.Response:
    return _json({"profile": await request.app[PRESENCE].profile()})


async def post_profile(request: web.Request) -> web.Response:
    data = checked("profile.schema.json", parse_json(await request.read()))
    return _json(await request.app[PRESENCE].update_profile(data))


async def post_backup(request: web.Request) -> web.Response:
    data = checked("backup_request.schema.json", parse_json(await request.read()))
    return _json(await request.app[BACKUP].make(data["passphrase"]))


async def post_token_rotate(request: web.Request) -> web.Response:
    raw = await request.read()
    if raw:
        checked("token_rotate_request.schema.json", parse_json(raw))
    state = request.app[STATE]
    if state.token_file is None:
        raise InvalidRequest("this daemon has no token file to rotate")
    now = time.monotonic()
    until = token_rotation.rotate(state, state.token_file, now)
    return _json({"rotated": True, "token_file": str(state.token_file),
                  "previous_valid_s": round(until - now, 3)})


async def post_file_share(request: web.Request) -> web.Response:
    data = checked("file_share_request.schema.json", parse_json(await request.read()))
    to = data["to"]
    dest = await request.app[PRESENCE].resolved(
        Destination.parse(to) if isinstance(to, str)
        else Destination.checked(to["kind"], to["ref"]))
    shared = await request.app[FILES].share(data["path"], dest, data.get("message"),
                                            bool(data.get("persistent", False)))
    status, announcement = send_response(shared.outcome)
    return _json({"file": shared.file.view(), "announcement": announcement,
                  "resumed_from": shared.resumed_from, "sent_chunks": shared.sent_chunks},
                 status)


async def get_file(request: web.Request) -> web.StreamResponse:
    """The file to ``out`` (JSON answer), or with no ``out`` its bytes, verified first."""
    file_id = request.query.get("id")
    if not file_id:
        raise InvalidRequest("id is required: the file's id (GET /v1/file/list)", field="id")
    svc = request.app[FILES]
    fetched = await svc.get(file_id, request.query.get("out"))
    if "out" in request.query:
        return _json({"file": fetched.file.view(), "path": str(fetched.path),
                      "resumed_from": fetched.resumed_from})
    resp = web.StreamResponse(headers={
        "Content-Type": "application/octet-stream",
        "Content-Length": str(fetched.file.size),
        "X-Tidemesh-File-Sha256": fetched.file.sha256,
        "Content-Disposition": f"attachment; filename*=UTF-8''{quote(fetched.file.name)}"})
    # Closed however the stream ends (a caller that goes away too): its copy is removed then.
    async with contextlib.aclosing(svc.stream(fetched)) as blocks:
        await resp.prepare(request)
        async for block in blocks:
            await resp.write(block)
    await resp.write_eof()
    return resp


async def get_file_list(request: web.Request) -> web.Response:
    return _json(await request.app[FILES].list(_int_param(request, "limit", 100, 1, 1000)))
