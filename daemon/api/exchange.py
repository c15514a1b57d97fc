"""A request as both HTTP stacks of the Unix socket hand it to a route, and the answer a route
gives back: the one shape of a route that aiohttp and the send lane (``send_lane``) share.

A route written as an ``Answerer`` (``routes.Route.answer``) is a plain function of the app
and a ``Parsed`` request to an ``Answer``: aiohttp calls it through ``aiohttp_handler``, the
lane frames the request itself and calls the same function. It raises ``TidemeshError`` for a
refusal, which each stack renders through the one envelope, ``error_answer``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from tidemesh.core.errors import RateLimited, TidemeshError

JSON_TYPE = "application/json; charset=utf-8"


# Not frozen: a frozen dataclass's __init__ sets each field through object.__setattr__, a
# cost per request on the lane's path.
@dataclass(slots=True)
class Parsed:
    """One request, framed. ``headers``: lower-cased names, the first value of each name
    counting (as aiohttp's ``headers.get``). ``reply_token``: a hook's reply token the
    middleware found valid for this request (never on the lane: it hands those over)."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes
    transport: str
    reply_token: str | None = None


@dataclass(slots=True)
class Answer:
    """A route's status, header fields (no framing ones: each stack adds Content-Length,
    Date and Connection) and body."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes


App = Any  # web.Application; typed loosely so the lane can pass the app it was built with
Answerer = Callable[[App, Parsed], Awaitable[Answer]]


def first_headers(fields: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Header fields as ``Parsed.headers``: the first of each name, lower-cased."""
    headers: dict[str, str] = {}
    for name, value in fields:
        headers.setdefault(name.lower(), value)
    return headers


JSON_HEADERS = (("Content-Type", JSON_TYPE),)


def json_answer(body: Any, status: int = 200, *extra: tuple[str, str]) -> Answer:
    return Answer(status, (*JSON_HEADERS, *extra) if extra else JSON_HEADERS,
                  orjson.dumps(body))


def retry_after(ms: int) -> str:
    """Retry-After's whole seconds (RFC 9110 §10.2.3): rounded up, at least 1."""
    return str(max(1, -(-ms // 1000)))


def error_answer(err: TidemeshError) -> Answer:
    """The one error envelope: ``{"error": {...}}`` with the error's status, and
    ``Retry-After`` on a 429 ``rate_limited``."""
    if isinstance(err, RateLimited):
        return json_answer(err.to_body(), err.http_status,
                           ("Retry-After", retry_after(err.retry_after_ms)))
    return json_answer(err.to_body(), err.http_status)


def response(answer: Answer) -> web.Response:
    """An answer as aiohttp's response."""
    return web.Response(status=answer.status, headers=answer.headers, body=answer.body)
