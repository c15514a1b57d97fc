"""Request guards and the error envelope.

``ipc`` renders every failure as ``{"error": {...}}`` and never leaks a traceback, and
enforces DESIGN §3: a token in the query is refused (400); on TCP the
Host must be loopback and no Origin may be present (403), and a bearer token is required
(401); more than ``max_inflight`` concurrent requests get 429 ``daemon_busy``, and a token over
its request budget (``ipc.rate_per_s`` sustained, ``ipc.rate_burst`` at once) gets 429
``rate_limited`` with ``Retry-After`` (``charge``). A hook's reply token
(``CAPABILITIES``) allows only POST /v1/send to its one target; anything else is 403. On TCP
an answer to a request without a valid token (a 401, any refusal before the token is
checked, the public health check) closes its connection, so connections held by someone
without the token end with their first answer (``connections``).
"""

from __future__ import annotations

import time

import structlog
from aiohttp import web
from aiohttp.typedefs import Handler

from tidemesh.core.errors import (
    Busy,
    Forbidden,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    TidemeshError,
    TokenInQuery,
    Unauthorized,
)
from tidemesh.core.hooks import capability_allows
from tidemesh.core.send import Destination
from tidemesh.daemon.api.exchange import (
    Answer,
    Answerer,
    Parsed,
    error_answer,
    response,
)
from tidemesh.daemon.api.keys import CAPABILITIES, MAX_BODY, REPLY_TOKEN, STATE, IpcState
from tidemesh.daemon.api.validation import parse_json

log = structlog.get_logger(__name__)

_LOOPBACK_HOSTS = {"", "localhost", "127.0.0.1", "[::1]", "::1"}
_STREAMING = {"/v1/events"}
_TOKEN_PARAMS = {"token", "access_token", "local_token"}
# Set on a TCP request once its token (or reply token) has been checked.
_AUTHENTICATED = web.RequestKey("authenticated", bool)
# The request budgets' keys besides a hook's reply token (its own key): every request on the
# Unix socket without a token, the local token on TCP (the previous one during its grace
# too), and TCP requests let in without one (the public health check).
UNIX, LOCAL, PUBLIC = "unix", "local", "public"
# Buckets kept before full ones are looked for and forgotten, at most once a second.
_PRUNE_ABOVE, _PRUNE_EVERY_MS = 64, 1000


def transport_of(request: web.Request) -> str:
    sockname = request.transport.get_extra_info("sockname") if request.transport else None
    return "tcp" if isinstance(sockname, tuple) else "unix"


def _host_only(host: str) -> str:
    host = host.strip().lower()
    if host.startswith("["):
        return host.split("]", 1)[0] + "]"
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _from_http(exc: web.HTTPException, max_body: int | None = None) -> TidemeshError:
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        limit = (f"the limit of {max_body} bytes (setting ipc.max_body_bytes)"
                 if max_body is not None else "the limit (setting ipc.max_body_bytes)")
        return PayloadTooLarge(f"request body is over {limit}; nothing was stored")
    if isinstance(exc, web.HTTPNotFound):
        return NotFound("no such route")
    if isinstance(exc, web.HTTPMethodNotAllowed):
        return MethodNotAllowed(f"method not allowed; use {', '.join(sorted(exc.allowed_methods))}")
    err = TidemeshError(exc.reason or "request failed")
    err.http_status = exc.status  # type: ignore[misc]
    return err


def render(err: TidemeshError) -> web.Response:
    return response(error_answer(err))


@web.middleware
async def ipc(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The one middleware: guards, the in-flight cap, the error envelope, request metrics."""
    state = request.app[STATE]
    transport = transport_of(request)
    # A connection's requests run in its one task: what it makes us log is bounded per
    # connection (core/logfilters.Repeats).
    structlog.contextvars.bind_contextvars(conn=f"ipc-{id(request.transport):x}")
    status = 500
    started = time.perf_counter()
    try:
        resp = await _answered(request, handler, transport)
        status = resp.status
        if transport == "tcp" and not request.get(_AUTHENTICATED) and not resp.prepared:
            resp.force_close()
        return resp
    finally:
        route = request.match_info.route.resource
        endpoint = route.canonical if route is not None else "unmatched"
        state.metrics.record(endpoint, status, transport, time.perf_counter() - started)


async def _answered(request: web.Request, handler: Handler, transport: str
                    ) -> web.StreamResponse:
    """The handler's response, or the error envelope of what it (or a guard) raised."""
    try:
        return await _guarded(request, handler, transport)
    except web.HTTPException as exc:
        resp = render(_from_http(exc, request.app.get(MAX_BODY)))
        if isinstance(exc, web.HTTPMethodNotAllowed):  # RFC 9110 §15.5.6: a 405 names them
            resp.headers["Allow"] = ", ".join(sorted(exc.allowed_methods))
        return resp
    except Exception as exc:
        return response(failed(exc, request.path, request.method))


async def _guarded(request: web.Request, handler: Handler, transport: str) -> web.StreamResponse:
    state = request.app[STATE]
    if request.query_string and any(k.lower() in _TOKEN_PARAMS for k in request.query):
        log.warning("ipc_token_in_query_refused", path=request.path)
        raise TokenInQuery("tokens are accepted only in the Authorization header, never the URL")
    # Most requests carry no token (every one on the Unix socket from a program): no
    # capability lookup for them.
    capability = "Authorization" in request.headers and await _check_capability(request)
    if transport == "tcp":
        _check_tcp(request, capability)
    reply = request.get(REPLY_TOKEN)
    charge(state, reply if reply is not None else
           UNIX if transport == "unix" else
           LOCAL if request.get(_AUTHENTICATED) else PUBLIC, transport)
    if request.path in _STREAMING:
        return await handler(request)
    admit(state)
    try:
        return await handler(request)
    finally:
        state.inflight -= 1


def admit(state: IpcState) -> None:
    """Count one more request in flight, or refuse it (429) at the cap."""
    if state.inflight >= state.max_inflight:
        raise Busy(f"more than {state.max_inflight} requests in flight; retry shortly")
    state.inflight += 1


def charge(state: IpcState, key: str, transport: str) -> None:
    """Take one request from ``key``'s budget, or refuse it (429 rate_limited)."""
    now_ms = int(time.monotonic() * 1000)
    wait_ms = state.buckets.take(key, state.rate, now_ms)
    if len(state.buckets) > _PRUNE_ABOVE and now_ms - state.buckets_pruned_ms >= _PRUNE_EVERY_MS:
        state.buckets_pruned_ms = now_ms
        state.buckets.prune(lambda _key: state.rate, now_ms)
    if wait_ms:
        state.metrics.rate_limited.labels(transport=transport).inc()
        rate = state.rate
        raise RateLimited(f"over {rate.per_s:g} requests/s (burst {rate.burst}) for this "
                          f"token (settings ipc.rate_per_s, ipc.rate_burst); retry after "
                          f"{wait_ms} ms", retry_after_ms=wait_ms)


async def plain_unix(app: web.Application, req: Parsed, answer: Answerer) -> Answer:
    """What this middleware does for a request with nothing to check but its budget: one on
    the Unix socket with no token and no query string, as the send lane frames them. The
    request is charged to ``UNIX``, admitted under the in-flight cap, answered, a failure
    rendered as the error envelope, and counted in the request metrics. Never raises."""
    state = app[STATE]
    started = time.perf_counter()
    try:
        charge(state, UNIX, req.transport)
        admit(state)
        try:
            answered = await answer(app, req)
        finally:
            state.inflight -= 1
    except Exception as exc:
        answered = failed(exc, req.path, req.method)
    state.metrics.record(req.path, answered.status, req.transport, time.perf_counter() - started)
    return answered


def failed(exc: Exception, path: str, method: str) -> Answer:
    """The error envelope of what a guard or route raised (call inside ``except``: a crash
    is logged with its traceback)."""
    if isinstance(exc, TidemeshError):
        logged(exc, path)
        return error_answer(exc)
    return error_answer(crashed(path, method))


def logged(exc: TidemeshError, path: str) -> None:
    """A 5xx is the daemon's trouble, not the caller's: it goes to the log."""
    if exc.http_status >= 500:
        log.warning("ipc_request_failed", path=path, code=exc.code, error=exc.message)


def crashed(path: str, method: str) -> TidemeshError:
    """The 500 for an exception no handler expected (call inside ``except``: logs it)."""
    log.exception("ipc_handler_crashed", path=path, method=method)
    return TidemeshError("internal error; see the daemon log")


def _bearer(request: web.Request) -> str | None:
    auth = request.headers.get("Authorization", "")
    return auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") else None


async def _check_capability(request: web.Request) -> bool:
    """True when the request carries a hook's reply token that allows it; raises 403 when
    it carries one that does not (expired, another route, another target)."""
    caps = request.app.get(CAPABILITIES)
    token = _bearer(request)
    if caps is None or token is None or not caps.is_capability(token):
        return False
    scope = caps.scope_of(token)
    if scope is None:
        raise Forbidden("this reply token has expired", reason="capability_expired")
    to = None
    if request.method == "POST" and request.path == "/v1/send":
        to = _destination(await request.read())
    if not capability_allows(scope, request.method, request.path, to):
        raise Forbidden(f"this reply token allows only POST /v1/send to {scope.label}",
                        reason="capability_scope", scope=scope.label)
    caps.used(token)
    request[REPLY_TOKEN] = token
    return True


def _destination(body: bytes) -> tuple[str, str] | None:
    """The (kind, ref) a send body names; None when it names none."""
    try:
        raw = parse_json(body).get("to")
        dest = (Destination.parse(raw) if isinstance(raw, str)
                else Destination.checked(raw["kind"], raw["ref"]))
    except (TidemeshError, AttributeError, KeyError, TypeError, ValueError):
        return None
    return dest.kind.value, dest.ref


def _check_tcp(request: web.Request, capability: bool = False) -> None:
    state = request.app[STATE]
    if _host_only(request.headers.get("Host", "")) not in _LOOPBACK_HOSTS:
        raise Forbidden("Host header is not a loopback name", header="Host")
    if "Origin" in request.headers or "Referer" in request.headers:
        raise Forbidden("requests from web pages are refused (Origin/Referer present)",
                        header="Origin")
    if capability:
        request[_AUTHENTICATED] = True
        return
    auth = request.headers.get("Authorization", "")
    if auth.startswith("Bearer ") and state.accepts(auth.removeprefix("Bearer ").strip(),
                                                    time.monotonic()):
        request[_AUTHENTICATED] = True
        return
    if state.public_health_check and request.path == "/v1/health":
        return
    if not auth.startswith("Bearer "):
        raise Unauthorized("missing bearer token; send Authorization: Bearer <local_token>")
    raise Unauthorized("invalid bearer token; after `daemon rotate-token` read the token "
                       "file again")


