"""Logging of the ``tidemesh`` command itself: library warnings to stderr, never stdout.

Commands print their results on stdout, so ``--json`` output stays parseable; what the
daemon's or broker's code logs while a command runs it in-process (the cold path, join,
operator commands) goes to stderr at ``TIDEMESH_CLI_LOG_LEVEL`` (warning) and up. Processes
the command starts (``daemon up``, ``broker up``) configure their own logging.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any, TextIO

import structlog

from tidemesh.core import logfilters


def configure_logging(level: str, stream: TextIO) -> None:
    # A processor, not a filtering wrapper class: ``daemon up`` and ``broker up`` run in this
    # process and reconfigure structlog's processors only; a wrapper class set here would
    # outlive that and silence their info logs.
    floor = logging.getLevelNamesMapping().get(level.upper(), logging.WARNING)

    def gate(_logger: Any, method: str, event: MutableMapping[str, Any]
             ) -> MutableMapping[str, Any]:
        if logging.getLevelNamesMapping().get(method.upper(), logging.INFO) < floor:
            raise structlog.DropEvent
        return event

    structlog.configure(
        processors=[gate, structlog.processors.add_log_level,
                    structlog.processors.TimeStamper(fmt="iso", utc=True),
                    logfilters.redact,
                    structlog.dev.ConsoleRenderer(
                        colors=False, exception_formatter=logfilters.CONSOLE_TRACEBACKS)],
        logger_factory=structlog.WriteLoggerFactory(stream),
        cache_logger_on_first_use=True,
    )
