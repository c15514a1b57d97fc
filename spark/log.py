"""structlog set-up for Spark jobs: one JSON line per event off a TTY. Called from main only.

Spark's own JVM logging stays Spark's (log4j, level WARN via the session); this covers the
job's events, which carry the run id so a night's lines can be picked out of the journal.
"""

from __future__ import annotations

import sys

import structlog
import structlog.tracebacks


def configure_logging(fmt: str = "auto") -> None:
    as_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    last: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if as_json else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            # No locals in tracebacks: the job's frames hold the store URL, password included.
            structlog.processors.ExceptionRenderer(
                structlog.tracebacks.ExceptionDictTransformer(show_locals=False)),
            last,
        ],
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
