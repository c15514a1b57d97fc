"""Request guards and the error envelope.

``ipc`` renders every failure as ``{"error": {...}}`` and never leaks a traceback, and
enforces DESIGN §3: a token in the query is refused (400); on TCP the
Host must be loopback and no Origin may be present (403), and a bearer token is required
(401); more than ``max_inflight`` concurrent requests get 429.
"""

from __future__ import annotations

import hmac
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
    TidemeshError,
    TokenInQuery,
    Unauthorized,
)
from tidemesh.daemon.api.keys import STATE

log = structlog.get_logger(__name__)

_LOOPBACK_HOSTS = {"", "localhost", "127.0.0.1", "[::1]", "::1"}
_STREAMING = {"/v1/events"}
_TOKEN_PARAMS = {"token", "access_token", "local_token"}


def transport_of(request: web.Request) -> str:
    sockname = request.transport.get_extra_info("sockname") if request.transport else None
    return "tcp" if isinstance(sockname, tuple) else "unix"


def _host_only(host: str) -> str:
    host = host.strip().lower()
    if host.startswith("["):
        return host.split("]", 1)[0] + "]"
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _from_http(exc: web.HTTPException) -> TidemeshError:
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        return PayloadTooLarge("request body is larger than the limit; nothing was stored")
    if isinstance(exc, web.HTTPNotFound):
        return NotFound("no such route")
    if isinstance(exc, web.HTTPMethodNotAllowed):
        return MethodNotAllowed(f"method not allowed; use {', '.join(sorted(exc.allowed_methods))}")
    err = TidemeshError(exc.reason or "request failed")
    err.http_status = exc.status  # type: ignore[misc]
    return err


def render(err: TidemeshError) -> web.Response:
    return web.json_response(err.to_body(), status=err.http_status)


@web.middleware
async def ipc(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The one middleware: guards, the in-flight cap, the error envelope, request metrics."""
    state = request.app[STATE]
    transport = transport_of(request)
    status = 500
    started = time.perf_counter()
    try:
        resp = await _guarded(request, handler, transport)
        status = resp.status
        return resp
    except TidemeshError as exc:
        status = exc.http_status
        if exc.http_status >= 500:
            log.warning("ipc_request_failed", path=request.path, code=exc.code, error=exc.message)
        return render(exc)
    except web.HTTPException as exc:
        err = _from_http(exc)
        status = err.http_status
        resp = render(err)
        if isinstance(exc, web.HTTPMethodNotAllowed):  # RFC 9110 §15.5.6: a 405 names them
            resp.headers["Allow"] = ", ".join(sorted(exc.allowed_methods))
        return resp
    except Exception:
        log.exception("ipc_handler_crashed", path=request.path, method=request.method)
        return render(TidemeshError("internal error; see the daemon log"))
    finally:
        route = request.match_info.route.resource
        endpoint = route.canonical if route is not None else "unmatched"
        state.metrics.requests.labels(endpoint=endpoint, status=str(status),
                                      transport=transport).inc()
        state.metrics.duration.labels(endpoint=endpoint).observe(time.perf_counter() - started)


async def _guarded(request: web.Request, handler: Handler, transport: str) -> web.StreamResponse:
    state = request.app[STATE]
    if request.query_string and any(k.lower() in _TOKEN_PARAMS for k in request.query):
        log.warning("ipc_token_in_query_refused", path=request.path)
        raise TokenInQuery("tokens are accepted only in the Authorization header, never the URL")
    if transport == "tcp":
        _check_tcp(request)
    if request.path in _STREAMING:
        return await handler(request)
    if state.inflight >= state.max_inflight:
        raise Busy(f"more than {state.max_inflight} requests in flight; retry shortly")
    state.inflight += 1
    try:
        return await handler(request)
    finally:
        state.inflight -= 1


def _check_tcp(request: web.Request) -> None:
    state = request.app[STATE]
    if _host_only(request.headers.get("Host", "")) not in _LOOPBACK_HOSTS:
        raise Forbidden("Host header is not a loopback name", header="Host")
    if "Origin" in request.headers or "Referer" in request.headers:
        raise Forbidden("requests from web pages are refused (Origin/Referer present)",
                        header="Origin")
    if state.public_health_check and request.path == "/v1/health":
        return
    auth = request.headers.get("Authorization", "")
    if not auth.startswith("Bearer "):
        raise Unauthorized("missing bearer token; send Authorization: Bearer <local_token>")
    if not hmac.compare_digest(auth.removeprefix("Bearer ").strip().encode(), state.token.encode()):
        raise Unauthorized("invalid bearer token")


