"""The Grafana dashboard queries only what a live broker and daemon export: every metric an
expression names, and every label it groups by, is on their ``/metrics`` after traffic."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.harness import Mesh, two_on_topic, wait_for

DASHBOARD = Path(__file__).resolve().parents[2] / "packaging" / "grafana" / "tidemesh.json"
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"),
            "summary": ("_count", "_sum")}


def _exported(*texts: str) -> dict[str, set[str]]:
    """Each series name a scrape can show (suffixes included), with the labels it carries;
    a labelled counter nothing has counted yet still counts by its HELP and TYPE lines."""
    names: dict[str, set[str]] = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            for suffix in SUFFIXES.get(family.type, ("",)):
                names.setdefault(family.name + suffix, set())
            for s in family.samples:
                names.setdefault(s.name, set()).update(set(s.labels) - {"le"})
    return names


def _expressions(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def _check(expr: str, exported: dict[str, set[str]]) -> None:
    named = re.findall(r"\b(cm_[a-z_]+)", expr)
    assert named, expr
    for name in named:
        assert name in exported, f"{name} is not exported ({expr})"
    grouped = {g.strip() for by in re.findall(r"by \(([^)]*)\)", expr) for g in by.split(",")}
    carried = set().union(*(exported[n] for n in named)) | {"le"}
    if any(exported[n] for n in named):   # labels show only once a series has samples
        assert grouped <= carried, (expr, grouped - carried)


async def test_every_panel_queries_exported_series(mesh: Mesh, short_tmp: Path) -> None:
    a, b = await two_on_topic(mesh, short_tmp)
    async with a.session() as s:
        for i in range(3):
            async with s.post("/v1/send", json={"to": "topic:ops", "body": f"m{i}"},
                              headers={"Idempotency-Key": f"g-{i}"}) as r:
                assert r.status == 202, await r.text()
    await wait_for(lambda: "cm_daemon_recv_total{" in b.client.metrics())
    url = f"http://127.0.0.1:{mesh.broker.port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:
        broker_text = resp.read().decode()
    exported = _exported(broker_text, a.client.metrics(), b.client.metrics())

    dashboard = json.loads(DASHBOARD.read_text())
    expressions = _expressions(dashboard)
    assert len(expressions) >= 20
    for expr in expressions:
        _check(expr, exported)
    # Both endpoints are on the board, not just one of them.
    assert any("cm_broker_" in e for e in expressions)
    assert any("cm_daemon_" in e for e in expressions)


def test_a_misspelt_series_is_caught() -> None:
    exported = {"cm_broker_accept_total": {"status"}}
    _check("sum by (status) (rate(cm_broker_accept_total[1m]))", exported)
    for bad in ("rate(cm_broker_accepted_total[1m])",
                "sum by (reason) (rate(cm_broker_accept_total[1m]))"):
        try:
            _check(bad, exported)
        except AssertionError:
            continue
        raise AssertionError(f"{bad} passed")
