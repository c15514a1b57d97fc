"""What every process's log leaves out (DESIGN §11): frame locals, secrets, floods.

- ``TRACEBACKS`` renders an exception as a dict with no frame locals, at most
  ``MAX_FRAMES`` frames. structlog's ``dict_tracebacks`` shows every frame's locals: a
  request's locals held the local token, and a 1,000-deep value rendered once per frame made
  megabytes per exception. ``CONSOLE_TRACEBACKS`` is the same rule on a TTY (structlog's
  console default, rich, shows locals too).
- ``Redact`` replaces the values of secret-named keys (tokens, Authorization, invites,
  private keys, signatures) at any depth of the event, replaces any string that contains a
  secret the process registered (``add_secret``: the daemon's local token) or a bearer
  credential, and cuts long strings to ``MAX_STRING`` characters.
- ``Repeats`` bounds what one connection can make us write: an event bound to a
  connection (a ``conn`` key, from ``structlog.contextvars``) is written ``first`` times,
  then only at the 2nd, 4th, 8th … repeat with a ``repeated`` count.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import MutableMapping
from typing import Any

import structlog
from structlog.tracebacks import ExceptionDictTransformer

MAX_FRAMES = 20
MAX_STRING = 4096
REDACTED = "[redacted]"

TRACEBACKS = structlog.processors.ExceptionRenderer(
    ExceptionDictTransformer(show_locals=False, max_frames=MAX_FRAMES))
CONSOLE_TRACEBACKS = structlog.dev.plain_traceback

_SECRET_KEY = re.compile(
    r"token|authorization|secret|signature|private|passphrase|password|seed|signing_key"
    r"|cookie|^invite(_text|_url|_code)?$", re.IGNORECASE)
_BEARER = re.compile(r"(?i)(bearer\s+)\S+")
# Containers inside an event this deep are replaced whole: an event is a few levels at most.
_MAX_DEPTH = 6


class Redact:
    """A structlog processor; one per process, holding the secrets it must never write."""

    def __init__(self) -> None:
        self.secrets: set[str] = set()

    def add_secret(self, value: str) -> None:
        if len(value) >= 8:  # a short value would blank out ordinary words
            self.secrets.add(value)

    def __call__(self, _logger: Any, _method: str, event: MutableMapping[str, Any]
                 ) -> MutableMapping[str, Any]:
        for key, value in event.items():
            event[key] = self._clean(key, value, 0)
        return event

    def _clean(self, key: Any, value: Any, depth: int) -> Any:
        if isinstance(key, str) and _SECRET_KEY.search(key) and value is not None:
            return REDACTED
        if isinstance(value, str):
            return self._text(value)
        if isinstance(value, dict | list | tuple):
            if depth >= _MAX_DEPTH:
                return "[nested too deep]"
            if isinstance(value, dict):
                return {k: self._clean(k, v, depth + 1) for k, v in value.items()}
            return [self._clean(None, v, depth + 1) for v in value]
        return value

    def _text(self, text: str) -> str:
        if len(text) > MAX_STRING:
            text = f"{text[:MAX_STRING]}… [{len(text) - MAX_STRING} more characters]"
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        return _BEARER.sub(r"\1" + REDACTED, text) if "earer" in text else text


redact = Redact()


class Repeats:
    """A structlog processor: the same event of one connection, written a bounded number of
    times. Remembers the last ``keys`` (connection, event) pairs."""

    def __init__(self, first: int = 5, keys: int = 4096) -> None:
        self.first = first
        self.keys = keys
        self._seen: OrderedDict[tuple[Any, str], int] = OrderedDict()

    def __call__(self, _logger: Any, _method: str, event: MutableMapping[str, Any]
                 ) -> MutableMapping[str, Any]:
        conn = event.get("conn")
        if conn is None:
            return event
        key = (conn, str(event.get("event")))
        count = self._seen.pop(key, 0) + 1
        self._seen[key] = count
        if len(self._seen) > self.keys:
            self._seen.popitem(last=False)
        if count <= self.first:
            return event
        if count & (count - 1):  # not a power of two
            raise structlog.DropEvent
        event["repeated"] = count
        return event
