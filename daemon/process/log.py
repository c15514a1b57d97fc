"""structlog set-up for the daemon: where lines go, their format, and a level SIGHUP can change.

JSON lines off a TTY, console on one. Without ``log.file`` they go to stderr, which is the
journal under systemd; with it (a detached daemon, or launchd, which has no journal) they go
to a size-rotated file. Called from ``main`` only.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any, TextIO, cast

import structlog

from tidemesh.core import logfilters

# Set by systemd (INVOCATION_ID, JOURNAL_STREAM) and launchd (XPC_SERVICE_NAME) for the
# processes they start.
SERVICE_MANAGER_VARIABLES = ("INVOCATION_ID", "JOURNAL_STREAM", "XPC_SERVICE_NAME")


def under_service_manager(environ: Mapping[str, str]) -> str | None:
    """The variable showing a service manager started us, or None."""
    for name in SERVICE_MANAGER_VARIABLES:
        if environ.get(name, "0") not in ("", "0"):
            return name
    return None


class RotatingFile:
    """A text sink rolled over by size: ``path``, ``path.1`` … ``path.N``, oldest dropped.

    Rolls only between writes, and structlog writes one whole line per call, so a line is
    never split across two files.
    """

    def __init__(self, path: Path, max_bytes: int, backups: int) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        self._file = self._open()
        self._size = self._file.tell()

    def _open(self) -> TextIO:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        return open(fd, "a", encoding="utf-8")

    def write(self, text: str) -> int:
        size = len(text.encode("utf-8"))
        if self._size and self._size + size > self.max_bytes:
            self._roll()
        self._file.write(text)
        self._size += size
        return len(text)

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def _roll(self) -> None:
        self._file.close()
        for n in range(self.backups - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{n}")
            if older.exists():
                older.replace(self.path.with_name(f"{self.path.name}.{n + 1}"))
        if self.backups > 0:
            self.path.replace(self.path.with_name(f"{self.path.name}.1"))
        else:
            self.path.unlink(missing_ok=True)
        self._file = self._open()
        self._size = 0


# structlog's method names that are not stdlib level names.
_METHOD_LEVELS = {"exception": logging.ERROR, "warn": logging.WARNING, "msg": logging.INFO}


def _level_of(name: str) -> int:
    return _METHOD_LEVELS.get(name) or logging.getLevelNamesMapping().get(name.upper(),
                                                                         logging.INFO)


class _LevelGate:
    """Drops events below a level that can change while loggers are cached (SIGHUP)."""

    def __init__(self, level: str) -> None:
        self.threshold = logging.INFO
        self.set(level)

    def set(self, level: str) -> None:
        self.threshold = _level_of(level.lower())

    def __call__(self, _logger: Any, method: str, event: MutableMapping[str, Any]
                 ) -> MutableMapping[str, Any]:
        if _level_of(method) < self.threshold:
            raise structlog.DropEvent
        return event


_gate = _LevelGate("info")
_sink: RotatingFile | None = None


def set_level(level: str) -> None:
    """Change the level of every logger, cached or not."""
    _gate.set(level)


def configure(level: str = "info", fmt: str = "auto", stream: TextIO | None = None,
              file: str | None = None, max_bytes: int = 100 * 2**20, backups: int = 5) -> None:
    global _sink
    if _sink is not None:
        _sink.close()
        _sink = None
    if file is not None:
        _sink = RotatingFile(Path(file), max_bytes, backups)
        out = cast(TextIO, _sink)
        use_json = fmt != "console"
    else:
        out = stream or sys.stderr
        use_json = fmt == "json" or (fmt == "auto" and not out.isatty())
    _gate.set(level)
    processors: list[structlog.typing.Processor] = [
        _gate,
        structlog.contextvars.merge_contextvars,
        logfilters.Repeats(),
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    # Tracebacks without frame locals, then secrets out (core/logfilters).
    if use_json:
        processors += [logfilters.TRACEBACKS, logfilters.redact,
                       structlog.processors.JSONRenderer()]
    else:
        processors += [logfilters.redact, structlog.dev.ConsoleRenderer(
            exception_formatter=logfilters.CONSOLE_TRACEBACKS)]
    structlog.configure(
        processors=processors,
        logger_factory=structlog.WriteLoggerFactory(out),
        cache_logger_on_first_use=True,
    )
