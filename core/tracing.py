"""A span per hop of a message, exported over OTLP/HTTP when ``[metrics] otel_endpoint`` is
set and the ``otel`` extra (``opentelemetry-sdk``, ``opentelemetry-exporter-otlp-proto-http``)
is installed; otherwise a no-op that imports nothing.

Each hop calls ``span(name, parents, attributes)`` as a context manager around its work.
``parents`` are the traceparents of the messages the hop handles:

- one message: the span is a child of its traceparent (a root when it has none), and
  ``onward(tp)`` gives the traceparent to pass on, naming this span, so the next hop is its
  child and one message's hops form one causal chain;
- several (a batch, a frame, a transaction): one span for all of them, a root of its own
  trace with a link to each message's traceparent (at most ``MAX_LINKS``), and ``onward``
  returns each traceparent as it came. A span per item would cost a 100-send batch about
  100 span starts and exports; the links cost one span.

Off, ``span`` returns one shared object whose methods do nothing and ``onward`` gives back
what it is given: the hops behave exactly as without tracing.

The exporter works on its own thread (the SDK's BatchSpanProcessor): nothing here awaits
the network. Spans carry ids, counts and outcomes, never bodies, meta or keys.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from tidemesh.core.settings import ConfigError, Setting
from tidemesh.core.trace import traceparent_problem

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span as OtelSpan
    from opentelemetry.trace import SpanContext

log = structlog.get_logger(__name__)

Attribute = str | int | float | bool
# The SDK's own default cap (OTEL_SPAN_LINK_COUNT_LIMIT); a bigger batch links its first ones.
MAX_LINKS = 128
TRACES_PATH = "/v1/traces"
_USERINFO = re.compile(r"//[^@/]*@")
SHUTDOWN_S = 2.0   # the longest an exit waits for the last spans to go out

# Declared once, in the daemon's and the broker's tables alike.
SETTINGS: tuple[Setting, ...] = (
    Setting("metrics.otel_endpoint", str, "", "OTLP/HTTP receiver spans are exported to "
            "(e.g. http://127.0.0.1:4318; /v1/traces is added); empty: no tracing. Needs the "
            "otel extra (pip install 'tidemesh[otel]')."),
    Setting("metrics.otel_export_delay_ms", int, 5000, "Longest a finished span waits before "
            "it is exported (with others, in one request); the rest go at exit."),
)


class Hop(Protocol):
    def onward(self, traceparent: str | None) -> str | None:
        """The traceparent to pass on for a message this hop handled."""

    def set(self, key: str, value: Attribute) -> None:
        """An attribute learnt during the hop (an id the store gave, a status)."""


class _Off:
    """The hop when tracing is off: nothing recorded, the traceparent passed on unchanged."""

    __slots__ = ()

    def __enter__(self) -> _Off:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def onward(self, traceparent: str | None) -> str | None:
        return traceparent

    def set(self, key: str, value: Attribute) -> None:
        return None


OFF = _Off()


class _Exporting:
    """The OpenTelemetry SDK behind ``span``; built by ``install`` only."""

    def __init__(self, provider: TracerProvider) -> None:
        from opentelemetry import context, trace

        self.provider = provider
        self.tracer = provider.get_tracer("tidemesh")
        self._trace = trace
        self._empty = context.Context()

    @contextmanager
    def span(self, name: str, parents: Sequence[str | None],
             attributes: Mapping[str, Attribute]) -> Iterator[Hop]:
        trace = self._trace
        links: list[Any] = []
        ctx = self._empty
        if len(parents) == 1:
            parent = _context(parents[0])
            if parent is not None:
                ctx = trace.set_span_in_context(trace.NonRecordingSpan(parent))
        else:
            links = [trace.Link(c) for c in map(_context, parents[:MAX_LINKS]) if c is not None]
        otel = self.tracer.start_span(name, context=ctx, links=links,
                                      attributes=dict(attributes))
        hop = _Recording(otel, own=len(parents) == 1)
        try:
            yield hop
        except BaseException as exc:
            # The class only: an error's message may quote what it refused.
            otel.set_status(trace.Status(trace.StatusCode.ERROR, type(exc).__name__))
            raise
        finally:
            otel.end()

    def shutdown(self, within_s: float) -> None:
        """Export what the batch processor still holds, waiting at most ``within_s``: the
        SDK retries an unreachable receiver for up to 30 s, which must not hold up an exit."""
        done = threading.Thread(target=self.provider.shutdown, name="otel-shutdown", daemon=True)
        done.start()
        done.join(within_s)


class _Recording:
    __slots__ = ("_otel", "_own")

    def __init__(self, otel: OtelSpan, own: bool) -> None:
        self._otel, self._own = otel, own

    def onward(self, traceparent: str | None) -> str | None:
        if not self._own:
            return traceparent
        c = self._otel.get_span_context()
        return f"00-{c.trace_id:032x}-{c.span_id:016x}-{int(c.trace_flags):02x}"

    def set(self, key: str, value: Attribute) -> None:
        self._otel.set_attribute(key, value)


def _context(traceparent: str | None) -> SpanContext | None:
    """A traceparent as a remote span context; None for none or a malformed one (every
    path checks it on the way in, but a trace must never fail a message)."""
    if traceparent is None or traceparent_problem(traceparent) is not None:
        return None
    from opentelemetry.trace import SpanContext, TraceFlags

    return SpanContext(int(traceparent[3:35], 16), int(traceparent[36:52], 16), is_remote=True,
                       trace_flags=TraceFlags(int(traceparent[53:55], 16)))


_exporting: _Exporting | None = None


def span(name: str, parents: Sequence[str | None],
         attributes: Mapping[str, Attribute] | None = None) -> AbstractContextManager[Hop]:
    """A context manager giving the hop's ``Hop`` (``OFF`` when tracing is off)."""
    if _exporting is None:
        return OFF
    return _exporting.span(name, parents, attributes or {})


def enabled() -> bool:
    return _exporting is not None


def check_settings(endpoint: str, export_delay_ms: int) -> None:
    """ConfigError for an endpoint that is no OTLP/HTTP address or a delay under 1 ms."""
    if endpoint and not endpoint.startswith(("http://", "https://")):
        raise ConfigError("metrics.otel_endpoint must be an http:// or https:// URL (an "
                          "OTLP/HTTP receiver, e.g. http://127.0.0.1:4318)",
                          field="metrics.otel_endpoint")
    if export_delay_ms < 1:
        raise ConfigError("metrics.otel_export_delay_ms must be >= 1",
                          field="metrics.otel_export_delay_ms")


def traces_url(endpoint: str) -> str:
    """The receiver's traces URL: ``endpoint`` itself when it names one, else with /v1/traces."""
    base = endpoint.rstrip("/")
    return base if base.endswith(TRACES_PATH) else base + TRACES_PATH


def _shown(url: str) -> str:
    """``url`` as logs may show it: without user and password."""
    return _USERINFO.sub("//", url, count=1)


def install(endpoint: str, service: str, version: str, export_delay_ms: int,
            resource: Mapping[str, Attribute] | None = None) -> bool:
    """Export spans to ``endpoint`` from now on (the composition root calls it once). Returns
    whether tracing is on: off for an empty endpoint, and off with a warning when the
    ``otel`` extra is not installed."""
    global _exporting
    if not endpoint:
        return False
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        log.warning("tracing_disabled", reason="otel_extra_missing", endpoint=_shown(endpoint),
                    error=str(exc),
                    hint="install the otel extra: pip install 'tidemesh[otel]'")
        return False
    # shutdown() below ends it, bounded; the SDK's own exit hook would wait unbounded.
    provider = TracerProvider(resource=Resource.create({
        "service.name": service, "service.version": version, "process.pid": os.getpid(),
        **(resource or {})}), shutdown_on_exit=False)
    provider.add_span_processor(BatchSpanProcessor(
        OTLPSpanExporter(endpoint=traces_url(endpoint)), schedule_delay_millis=export_delay_ms))
    _exporting = _Exporting(provider)
    log.info("tracing_started", endpoint=_shown(traces_url(endpoint)), service=service)
    return True


def shutdown(within_s: float = SHUTDOWN_S) -> None:
    """Export what is still buffered and stop (the composition root, at exit)."""
    global _exporting
    if _exporting is not None:
        exporting, _exporting = _exporting, None
        exporting.shutdown(within_s)
