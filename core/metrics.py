"""Prometheus metrics through prometheus_client, one ``CollectorRegistry`` per process.

Never the library's global default registry: tests run several daemons and brokers in one
process. Counters and histograms are prometheus_client's own; a gauge read when scraped
(``CallbackGauge``) is a small collector, since its label values are only known then.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["BATCH_BUCKETS", "CONTENT_TYPE_LATEST", "CallbackCounter", "CallbackGauge",
           "CollectorRegistry",
           "Samples", "render"]

Samples = Callable[[], Iterable[tuple[dict[str, str], float]]]

# Rows or sends per batch: powers of two up to the largest group commit (512) and beyond.
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class CallbackGauge(Collector):
    """A gauge whose ``collect`` callback returns (labels, value) pairs when scraped."""

    family: type[GaugeMetricFamily] | type[CounterMetricFamily] = GaugeMetricFamily

    def __init__(self, name: str, help: str, labelnames: Iterable[str], samples: Samples,
                 registry: CollectorRegistry) -> None:
        self.name = name
        self.help = help
        self.labelnames = sorted(labelnames)  # the order the hand-written renderer used
        self.samples = samples
        registry.register(self)

    def describe(self) -> list[Metric]:
        return [self.family(self.name, self.help, labels=self.labelnames)]

    def collect(self) -> Iterator[Metric]:
        family = self.family(self.name, self.help, labels=self.labelnames)
        for labels, value in self.samples():
            family.add_metric([labels[k] for k in self.labelnames], value)
        yield family


class CallbackCounter(CallbackGauge):
    """A counter kept elsewhere (a state file carried from run to run), read when rendered."""

    family = CounterMetricFamily


def render(registry: CollectorRegistry) -> bytes:
    """The text exposition format, served with ``CONTENT_TYPE_LATEST``."""
    return generate_latest(registry)
