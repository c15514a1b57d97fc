"""core/tracing: off it is one no-op that imports nothing; on, a lone message's hop is a
child of its traceparent and passes on its own, a batch's hop is one span linked to each."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from tidemesh.core import tracing
from tidemesh.core.settings import ConfigError
from tidemesh.core.trace import traceparent_problem

T1 = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
T2 = "00-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-bbbbbbbbbbbbbbbb-00"


def test_off_every_hop_is_the_one_no_op_and_passes_the_traceparent_on() -> None:
    assert not tracing.enabled()
    assert tracing.install("", "tidemesh-daemon", "0", 5000) is False
    with tracing.span("tidemesh.daemon.accept", [T1], {"tidemesh.kind": "topic"}) as hop:
        hop.set("tidemesh.status", 201)
        assert hop.onward(T1) is T1
        assert hop.onward(None) is None
    assert tracing.span("x", [T1, T2]) is tracing.OFF


def _run(code: str) -> str:
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)
    return res.stdout.strip() + res.stderr


def test_off_the_processes_import_no_opentelemetry() -> None:
    out = _run("import sys\n"
               "import tidemesh.daemon.main, tidemesh.broker.main\n"
               "from tidemesh.core import tracing\n"
               "tracing.install('', 'tidemesh-daemon', '0', 5000)\n"
               "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))")
    assert out.splitlines()[0] == "[]"


def test_an_endpoint_without_the_extra_is_a_warning_and_no_tracing() -> None:
    out = _run("import sys\n"
               "sys.modules['opentelemetry.exporter.otlp.proto.http.trace_exporter'] = None\n"
               "from tidemesh.core import tracing\n"
               "print(tracing.install('http://u:pw@127.0.0.1:9', 'tidemesh-broker', '0', 5000),"
               " tracing.enabled())")
    assert "False False" in out.splitlines()
    assert "tracing_disabled" in out and "tidemesh[otel]" in out
    assert "pw" not in out and "http://127.0.0.1:9" in out


@pytest.mark.parametrize(("endpoint", "delay", "field"), [
    ("127.0.0.1:4318", 5000, "metrics.otel_endpoint"),
    ("grpc://127.0.0.1:4317", 5000, "metrics.otel_endpoint"),
    ("http://127.0.0.1:4318", 0, "metrics.otel_export_delay_ms"),
])
def test_a_bad_setting_is_a_config_error_naming_it(endpoint: str, delay: int, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        tracing.check_settings(endpoint, delay)
    assert err.value.details["field"] == field


def test_the_traces_path_is_added_once() -> None:
    assert tracing.traces_url("http://c:4318") == "http://c:4318/v1/traces"
    assert tracing.traces_url("http://c:4318/") == "http://c:4318/v1/traces"
    assert tracing.traces_url("http://c:4318/v1/traces") == "http://c:4318/v1/traces"
    tracing.check_settings("", 5000)
    tracing.check_settings("https://c", 1)


@pytest.fixture
def exported() -> Iterator[InMemorySpanExporter]:
    """Tracing on, into memory (the OTLP exporter is the test of tests/e2e/test_otel.py)."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracing._exporting = tracing._Exporting(provider)
    try:
        yield memory
    finally:
        tracing.shutdown()


def test_a_lone_message_hop_is_a_child_and_passes_its_own_span_on(
    exported: InMemorySpanExporter
) -> None:
    with tracing.span("tidemesh.broker.accept", [T1], {"tidemesh.mesh": "m"}) as hop:
        onward = hop.onward(T1)
        hop.set("tidemesh.status", 201)
    (span,) = exported.get_finished_spans()
    assert span.parent is not None and span.parent.span_id == int(T1[36:52], 16)
    assert span.context.trace_id == int(T1[3:35], 16)
    assert onward == f"00-{T1[3:35]}-{span.context.span_id:016x}-01"
    assert dict(span.attributes or {}) == {"tidemesh.mesh": "m", "tidemesh.status": 201}


def test_a_hop_given_no_traceparent_starts_the_trace(exported: InMemorySpanExporter) -> None:
    with tracing.span("tidemesh.daemon.accept", [None]) as hop:
        onward = hop.onward(None)
    (span,) = exported.get_finished_spans()
    assert span.parent is None
    assert onward is not None and traceparent_problem(onward) is None
    assert onward[3:35] == f"{span.context.trace_id:032x}"


def test_a_batch_hop_is_one_span_linked_to_each_message(
    exported: InMemorySpanExporter
) -> None:
    with tracing.span("tidemesh.daemon.send", [T1, None, T2], {"tidemesh.batch_size": 3}) as hop:
        assert hop.onward(T1) is T1 and hop.onward(T2) is T2
    (span,) = exported.get_finished_spans()
    assert span.parent is None
    assert [(link.context.trace_id, link.context.span_id) for link in span.links] == [
        (int(T1[3:35], 16), int(T1[36:52], 16)), (int(T2[3:35], 16), int(T2[36:52], 16))]


def test_a_malformed_traceparent_is_no_parent_and_no_link(
    exported: InMemorySpanExporter
) -> None:
    with tracing.span("tidemesh.daemon.store", ["00-zz"]):
        pass
    with tracing.span("tidemesh.daemon.store", ["00-zz", T1]):
        pass
    lone, batch = exported.get_finished_spans()
    assert lone.parent is None
    assert [link.context.span_id for link in batch.links] == [int(T1[36:52], 16)]


def test_a_failed_hop_names_the_error_class_only(exported: InMemorySpanExporter) -> None:
    with pytest.raises(ValueError, match="secret"), tracing.span("tidemesh.daemon.hook", [T1]):
        raise ValueError("secret")
    (span,) = exported.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == "ValueError"
    assert not span.events
