"""structlog set-up for the broker: JSON lines off a TTY, console on one. Called from main only."""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog

from tidemesh.core import logfilters


def configure(level: str = "info", fmt: str = "auto", stream: TextIO | None = None) -> None:
    out = stream or sys.stderr
    use_json = fmt == "json" or (fmt == "auto" and not out.isatty())
    # Tracebacks without frame locals, secrets out, one connection's repeats bounded
    # (core/logfilters).
    processors: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        logfilters.Repeats(),
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        logfilters.TRACEBACKS if use_json else structlog.dev.set_exc_info,
        logfilters.redact,
        structlog.processors.JSONRenderer() if use_json else structlog.dev.ConsoleRenderer(
            exception_formatter=logfilters.CONSOLE_TRACEBACKS),
    ]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping().get(level.upper(), logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=True,
    )
