"""A small Prometheus registry: counters, gauges, and the text exposition format."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

Labels = tuple[tuple[str, str], ...]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: Labels) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels) + "}"


@dataclass(slots=True)
class Counter:
    name: str
    help: str
    values: dict[Labels, float] = field(default_factory=dict)

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        self.values[key] = self.values.get(key, 0.0) + amount

    def get(self, **labels: str) -> float:
        return self.values.get(tuple(sorted(labels.items())), 0.0)


@dataclass(slots=True)
class Gauge:
    """A gauge read when scraped: ``collect`` returns (labels, value) pairs."""

    name: str
    help: str
    collect: Callable[[], Iterable[tuple[dict[str, str], float]]]


class Registry:
    def __init__(self) -> None:
        self._counters: dict[str, Counter] = {}
        self._gauges: dict[str, Gauge] = {}

    def counter(self, name: str, help: str) -> Counter:
        if name in self._counters or name in self._gauges:
            raise ValueError(f"metric {name} registered twice")
        c = self._counters[name] = Counter(name, help)
        return c

    def gauge(
        self, name: str, help: str, collect: Callable[[], Iterable[tuple[dict[str, str], float]]]
    ) -> None:
        if name in self._counters or name in self._gauges:
            raise ValueError(f"metric {name} registered twice")
        self._gauges[name] = Gauge(name, help, collect)

    def render(self) -> str:
        lines: list[str] = []
        for c in self._counters.values():
            lines += [f"# HELP {c.name} {c.help}", f"# TYPE {c.name} counter"]
            lines += [f"{c.name}{_labels(k)} {_num(v)}" for k, v in sorted(c.values.items())]
        for g in self._gauges.values():
            lines += [f"# HELP {g.name} {g.help}", f"# TYPE {g.name} gauge"]
            for labels, value in g.collect():
                lines.append(f"{g.name}{_labels(tuple(sorted(labels.items())))} {_num(value)}")
        return "\n".join(lines) + "\n"


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))
