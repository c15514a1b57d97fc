"""The route table of the IPC surface, one literal, under the versioned ``/v1/`` prefix.

Each entry names the JSON Schemas of its request and responses; ``openapi.py`` builds the
OpenAPI document from this table, and a test checks that every route has its schemas.

A route is either an aiohttp handler or an ``answer`` (``exchange.Answerer``): a function of
the parsed request that both HTTP stacks call. The Unix socket's send lane takes exactly the
answer routes (``LANE``); aiohttp serves them everywhere else (TCP, and every connection the
lane hands over) through ``aiohttp_handler``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tidemesh.daemon.api import events, handlers, sessions
from tidemesh.daemon.api.exchange import Answerer, Parsed, first_headers, response
from tidemesh.daemon.api.keys import REPLY_TOKEN
from tidemesh.daemon.api.middleware import transport_of

ERROR = "error.schema.json"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def aiohttp_handler(answer: Answerer) -> Handler:
    """An answer route as aiohttp's handler: the request parsed as the lane parses it."""
    async def handle(request: web.Request) -> web.StreamResponse:
        parsed = Parsed(request.method, request.path, first_headers(request.headers.items()),
                        await request.read(), transport_of(request), request.get(REPLY_TOKEN))
        return response(await answer(request.app, parsed))
    return handle


@dataclass(frozen=True, slots=True)
class Route:
    method: str
    path: str
    handler: Handler | None
    summary: str
    request: str | None = None
    # False when the handler also accepts no body at all (the prune routes: {} by default).
    request_required: bool = True
    responses: dict[int, str | None] = field(default_factory=dict)
    content_type: str = "application/json"
    # Path parameter -> the regex its segment must match (else the default: any segment).
    params: dict[str, str] = field(default_factory=dict)
    # Query parameter -> its OpenAPI description (all optional strings on the wire).
    query: dict[str, str] = field(default_factory=dict)
    # The route as a function of the parsed request, for both stacks (``handler`` None).
    answer: Answerer | None = None

    @property
    def function(self) -> Callable[..., Any]:
        """The code that answers the route (its name is the OpenAPI operation id)."""
        fn = self.answer or self.handler
        assert fn is not None, self.path
        return fn

    @property
    def router_path(self) -> str:
        path = self.path
        for name, regex in self.params.items():
            path = path.replace(f"{{{name}}}", f"{{{name}:{regex}}}")
        return path


TABLE: tuple[Route, ...] = (
    Route("GET", "/v1/version", handlers.get_version, "Daemon version and features",
          responses={200: "version_response.schema.json"}),
    Route("GET", "/v1/compat", handlers.get_compat,
          "The versions this daemon works with: brokers (and the features it requires of "
          "them), CLIs and SDKs",
          responses={200: "compat_response.schema.json"}),
    Route("GET", "/v1/health", handlers.get_health, "Health, queue depth, connection",
          responses={200: "health_response.schema.json"}),
    Route("POST", "/v1/send", None, "Accept one send (the 11-row table)", answer=handlers.post_send,
          request="send_request.schema.json",
          responses={202: "send_response.schema.json", 200: "send_response.schema.json",
                     400: ERROR, 409: ERROR, 413: ERROR, 429: ERROR, 503: ERROR, 507: ERROR}),
    Route("POST", "/v1/send_batch", None,
          "Accept 1-1000 sends in one outbox transaction, each as /v1/send would; one result "
          "each, in order", answer=handlers.post_send_batch,
          request="send_batch_request.schema.json",
          responses={200: "send_batch_response.schema.json",
                     400: ERROR, 413: ERROR, 429: ERROR, 503: ERROR, 507: ERROR}),
    Route("GET", "/v1/outbox", handlers.get_outbox, "List outbox rows, newest first",
          responses={200: "outbox_list_response.schema.json", 400: ERROR}),
    # Not "requeue" or "prune": those paths are POSTs below; a GET there is a 405, not a lookup.
    Route("GET", "/v1/outbox/{id}", handlers.get_outbox_row, "One outbox row and its chain",
          responses={200: "outbox_row.schema.json", 404: ERROR},
          params={"id": "(?!(?:requeue|prune)$)[^/]+"}),
    Route("POST", "/v1/outbox/requeue", handlers.post_outbox_requeue,
          "Abort a dead or pending row and queue it again under a fresh id",
          request="requeue_request.schema.json",
          responses={200: "requeue_response.schema.json", 400: ERROR, 404: ERROR, 409: ERROR}),
    Route("POST", "/v1/outbox/prune", handlers.post_outbox_prune,
          "Delete the done, aborted and dead rows retention lets go now (dry_run: count only)",
          request="prune_request.schema.json", request_required=False,
          responses={200: "prune_response.schema.json", 400: ERROR, 503: ERROR, 507: ERROR}),
    Route("GET", "/v1/inbox", handlers.get_inbox,
          "Inbox page (after/limit/topic/from, q: search the text bodies), or a named "
          "consumer's entries (?consumer=)",
          responses={200: "inbox_response.schema.json", 400: ERROR},
          query={"after": "Entries after this seq (not with consumer)",
                 "limit": "1-1000 entries (default 100)",
                 "topic": "Only entries posted to this topic",
                 "from": "Only entries from this sender's member key (hex)",
                 "consumer": "Read as this durable named consumer, after its cursor",
                 "q": "Only entries whose text body matches this SQLite FTS5 query "
                      "(1-1024 characters; not with consumer). An unreadable query is a 400 "
                      "naming q; so is any q when [inbox] fts_enabled is off"}),
    Route("POST", "/v1/inbox/ack", handlers.post_inbox_ack,
          "Advance a named consumer's cursor (after the program persisted its outcome)",
          request="inbox_ack_request.schema.json",
          responses={200: "inbox_ack_response.schema.json", 400: ERROR}),
    Route("POST", "/v1/inbox/prune", handlers.post_inbox_prune,
          "Delete the inbox entries and events retention lets go now (dry_run: count only)",
          request="prune_request.schema.json", request_required=False,
          responses={200: "prune_response.schema.json", 400: ERROR, 503: ERROR, 507: ERROR}),
    Route("GET", "/v1/events", events.get_events,
          "Server-Sent Events, resumable with Last-Event-ID or ?since=",
          responses={200: None, 400: ERROR, 429: ERROR}, content_type="text/event-stream"),
    *(Route("POST", f"/v1/{group}/{action}", handlers.post_membership, summary,
            request="membership_request.schema.json",
            responses={200: "membership_response.schema.json", 400: ERROR, 404: ERROR,
                       409: ERROR, 503: ERROR})
      for group, action, summary in (
          ("topics", "create", "Create a topic on the broker"),
          ("topics", "subscribe", "Subscribe this member to a topic (create: true to make it)"),
          ("topics", "unsubscribe", "Unsubscribe this member from a topic"),
          ("queues", "consume", "Become a competing consumer of a queue"),
          ("queues", "leave", "Stop consuming a queue"))),
    Route("GET", "/v1/topics", handlers.get_memberships, "Topics this member subscribes to",
          responses={200: "membership_list.schema.json"}),
    Route("GET", "/v1/queues", handlers.get_memberships, "Queues this member consumes",
          responses={200: "membership_list.schema.json"}),
    Route("GET", "/v1/peers", handlers.get_peers,
          "Members connected to the broker now, with their profiles (kept from the "
          "broker's presence snapshot and changes, else asked of it)",
          responses={200: "peers_response.schema.json", 409: ERROR, 503: ERROR}),
    Route("GET", "/v1/profile", handlers.get_profile, "This member's profile",
          responses={200: "profile_response.schema.json"}),
    Route("POST", "/v1/profile", handlers.post_profile,
          "Change fields of this member's profile (null removes one); published to the broker",
          request="profile.schema.json",
          responses={200: "profile_response.schema.json", 400: ERROR, 503: ERROR}),
    Route("POST", "/v1/sessions/register", sessions.post_session_register,
          "Keep messages for an agent session from now on (its push and read cursors)",
          request="session_request.schema.json",
          responses={200: "session.schema.json", 400: ERROR}),
    Route("GET", "/v1/sessions", sessions.get_sessions,
          "The agent sessions this daemon keeps messages for, how far each was pushed and read",
          responses={200: "sessions_response.schema.json"}),
    Route("POST", "/v1/sessions/remove", sessions.post_session_remove,
          "Forget an agent session: its cursors go and its entries are no longer held for it",
          request="session_request.schema.json",
          responses={200: "session_removed.schema.json", 400: ERROR, 404: ERROR}),
    Route("POST", "/v1/file/share", handlers.post_file_share,
          "Share a local file: upload it to the broker in chunks (sealed for a DM), then "
          "announce it like /v1/send; a retry resumes and announces once",
          request="file_share_request.schema.json",
          responses={202: "file_share_response.schema.json",
                     200: "file_share_response.schema.json", 400: ERROR, 404: ERROR,
                     409: ERROR, 413: ERROR, 503: ERROR, 507: ERROR}),
    Route("GET", "/v1/file/get", handlers.get_file,
          "Fetch a file shared with (or by) this member, verified against its SHA-256: to "
          "out (resumes a cut-off get), or with no out as the answer's bytes",
          responses={200: "file_get_response.schema.json", 400: ERROR, 404: ERROR,
                     502: ERROR, 503: ERROR, 507: ERROR},
          query={"id": "The file's id (required)",
                 "out": "Absolute path to write the file to; without it the bytes are the "
                        "answer (application/octet-stream)"}),
    Route("GET", "/v1/file/list", handlers.get_file_list,
          "Files this member shared or was announced, newest first",
          responses={200: "file_list_response.schema.json", 400: ERROR},
          query={"limit": "1-1000 files (default 100)"}),
    Route("POST", "/v1/backup", handlers.post_backup,
          "A passphrase-sealed backup of this member's identity and configuration (never the "
          "outbox or inbox), as `tidemesh daemon backup` writes it",
          request="backup_request.schema.json",
          responses={200: "backup_response.schema.json", 400: ERROR}),
    Route("POST", "/v1/token/rotate", handlers.post_token_rotate,
          "Write a new local bearer token; the previous one is accepted for ipc.token_grace_s",
          request="token_rotate_request.schema.json", request_required=False,
          responses={200: "token_rotate_response.schema.json", 400: ERROR}),
    Route("GET", "/v1/openapi.json", handlers.get_openapi,
          "This OpenAPI document, self-contained (schemas under components)",
          responses={200: None}),
    Route("GET", "/v1/metrics", handlers.get_metrics, "Prometheus text",
          responses={200: None}, content_type="text/plain"),
)



def _handler(route: Route) -> Handler:
    if route.answer is not None:
        return aiohttp_handler(route.answer)
    assert route.handler is not None, route.path
    return route.handler


ROUTES: list[web.RouteDef] = [web.route(r.method, r.router_path, _handler(r)) for r in TABLE]


def _lane(table: tuple[Route, ...]) -> dict[tuple[bytes, bytes], tuple[str, Answerer]]:
    """(method, path) -> (path, answer) of the routes the send lane frames itself: every
    answer route (a fixed path: the lane matches exactly, it has no router)."""
    lane = {}
    for r in table:
        if r.answer is not None:
            assert "{" not in r.path, r.path
            lane[r.method.encode(), r.path.encode()] = (r.path, r.answer)
    return lane


LANE = _lane(TABLE)
