"""Both metrics endpoints after real traffic: parseable, with the spec §10 histograms, and
clean under ``promtool check metrics`` apart from the names the spec fixes."""

from __future__ import annotations

import re
import shutil
import subprocess
import urllib.request
from pathlib import Path

from prometheus_client import Metric
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import unavailable
from tests.e2e.harness import Mesh, two_on_topic, wait_for

DAEMON_HISTOGRAMS = {
    "cm_daemon_ipc_duration_seconds": {"endpoint"},
    "cm_daemon_send_batch_size": {"mesh"},
    "cm_daemon_db_batch_rows": {"db"},
}
BROKER_HISTOGRAMS = {"cm_broker_accept_duration_seconds": set(),
                     "cm_broker_accept_batch_size": set(),
                     "cm_broker_accept_frames": set()}

# Names the spec (claudemesh §10) fixes that promtool's lint objects to; docs/operations.md
# lists the same. Anything else promtool reports fails the test.
PROMTOOL_EXCEPTIONS = {
    # "metric names should not contain abbreviated units": the spec's name;
    # cm_daemon_outbox_age_seconds carries the same value in seconds.
    "cm_daemon_lag_ms",
}


def _families(text: str) -> dict[str, Metric]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def _check_histograms(text: str, wanted: dict[str, set[str]]) -> None:
    families = _families(text)
    for name, labels in wanted.items():
        family = families.get(name)
        assert family is not None, f"{name} missing"
        assert family.type == "histogram"
        samples = family.samples
        kinds = {s.name.removeprefix(name) for s in samples}
        assert {"_bucket", "_count", "_sum"} <= kinds, (name, kinds)
        count = sum(s.value for s in samples if s.name == f"{name}_count")
        assert count > 0, f"{name} observed nothing"
        for s in samples:
            assert labels <= set(s.labels), (name, s.labels)


def _promtool(text: str) -> list[str]:
    """promtool's complaints, one per line, minus those about the spec's fixed names."""
    res = subprocess.run(["promtool", "check", "metrics"], input=text, text=True,
                         capture_output=True, timeout=60, check=False)
    lines = [ln for ln in (res.stdout + res.stderr).splitlines() if ln.strip()]
    return [ln for ln in lines
            if not any(ln.startswith(f"{name} ") for name in PROMTOOL_EXCEPTIONS)]


async def test_both_endpoints_expose_the_histograms(mesh: Mesh, short_tmp: Path) -> None:
    a, b = await two_on_topic(mesh, short_tmp)
    async with a.session() as s:
        async with s.post("/v1/topics/subscribe", json={"name": "ops", "create": True}) as r:
            assert r.status == 200, await r.text()
        for i in range(5):
            async with s.post("/v1/send", json={"to": "topic:ops", "body": f"m{i}"},
                              headers={"Idempotency-Key": f"k-{i}"}) as r:
                assert r.status == 202
                row = await r.json()
        async with s.get(f"/v1/outbox/{row['outbox_id']}") as r:
            assert r.status == 200
    await wait_for(lambda: _all_done(a))

    daemon_text = a.client.metrics()
    with urllib.request.urlopen(f"http://127.0.0.1:{mesh.broker.port}/metrics",
                                timeout=10) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain")
        broker_text = resp.read().decode()

    _check_histograms(daemon_text, DAEMON_HISTOGRAMS)
    _check_histograms(broker_text, BROKER_HISTOGRAMS)
    ipc = _families(daemon_text)["cm_daemon_ipc_duration_seconds"]
    endpoints = {s.labels.get("endpoint") for s in ipc.samples}
    assert {"/v1/send", "/v1/outbox/{id}"} <= endpoints  # route templates, not raw paths
    ages = _families(daemon_text)["cm_daemon_outbox_age_seconds"]
    assert ages.samples[0].labels == {"mesh": "m"}
    assert "cm_daemon_disk_pct" in _families(daemon_text)
    _check_help(daemon_text)
    await wait_for(lambda: "cm_daemon_recv_total{" in b.client.metrics())
    _check_help(b.client.metrics())
    _check_help(broker_text)
    families = _families(daemon_text)
    # One name for one thing: both per-database gauges label the database `kind`.
    for name in ("cm_daemon_disk_pct", "cm_daemon_db_bytes"):
        assert {frozenset(s.labels) for s in families[name].samples} == {
            frozenset({"mesh", "kind"})}, name

    if shutil.which("promtool") is None:
        unavailable("promtool is not installed (Debian: apt-get install prometheus)")
    assert _promtool(daemon_text) == []
    assert _promtool(broker_text) == []


def _check_help(text: str) -> None:
    """A help text says what the series is: it cites no section of a document outside the
    repository, and a "by LABEL" it claims is a label the series has."""
    for family in _families(text).values():
        assert "§" not in family.documentation, (family.name, family.documentation)
        said = re.findall(r"\bby (\w+)\b", family.documentation)
        labels = {label for s in family.samples for label in s.labels} - {"le", "quantile"}
        for word in said if labels else ():   # a series with no samples yet shows none
            if word in {"kind", "reason", "status", "endpoint", "db", "mesh", "hook"}:
                assert word in labels, (family.name, family.documentation, labels)


async def _all_done(d: object) -> bool:
    rows = d.outbox_rows()  # type: ignore[attr-defined]
    return bool(rows) and {r["status"] for r in rows} == {"done"}
