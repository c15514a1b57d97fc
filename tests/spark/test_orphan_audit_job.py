"""The orphan audit end to end: broker-written stores, damaged by hand, audited by the job."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.spark.broker_stores import (
    NOW,
    TTL_DAYS,
    Damage,
    Filled,
    Finding,
    fill,
    scalar,
)
from tests.spark.conftest import audit_config

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from tidemesh.spark.jobs.orphan_audit import AuditOutcome

pytestmark = pytest.mark.spark

KINDS = ("dedupe_without_message", "message_without_dedupe", "message_without_history",
         "history_without_message", "delivery_without_message")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite://{tmp_path / 'broker.db'}"
    return str(request.getfixturevalue("pg_database"))


def _audit(spark: SparkSession, url: str, out: Path) -> AuditOutcome:
    from tidemesh.spark.jobs.orphan_audit import run_audit

    cfg = audit_config(url, out, dedupe_retention_days=TTL_DAYS)
    return run_audit(spark, cfg, clock=lambda: NOW)


def _found(spark: SparkSession, out: Path) -> list[Finding]:
    report = json.loads((out / "report.json").read_text())
    rows = spark.read.parquet(str(out / report["orphans"])).collect()
    return [(r["kind"], r["mesh_id"], r["row_key"]) for r in rows]


def _plant(filled: Filled) -> set[Finding]:
    """Every kind of damage, spread over both meshes, plus some the audit must not judge."""
    d = Damage(filled)
    expected = (d.drop_message_keep_dedupe("a1") | d.drop_dedupe("a2") | d.drop_history("a3")
                | d.repoint_delivery("a_dm2") | d.drop_dedupe("a_dm")
                | d.leave_history_only("b1") | d.drop_message_only("b_dm")
                | d.drop_history("b_q") | d.repoint_delivery("b_dm2"))
    d.drop_message_only("fresh")    # after the watermark: in flight, not judged
    return expected


def test_audit_planted_orphans_found_exactly_per_mesh(
    spark: SparkSession, store_url: str, tmp_path: Path
) -> None:
    from tidemesh.core.exitcodes import Exit

    filled = fill(store_url)
    expected = _plant(filled)
    out = tmp_path / "out"
    outcome = _audit(spark, store_url, out)
    assert outcome.exit_code == Exit.ORPHANS_FOUND, outcome.error
    found = _found(spark, out)
    assert len(found) == len(set(found))
    assert set(found) == expected
    per_mesh = Counter((mesh, kind) for kind, mesh, _ in expected)
    report = json.loads((out / "report.json").read_text())
    assert report["meshes"] == {
        mesh: {kind: per_mesh[(mesh, kind)] for kind in KINDS}
        for mesh in filled.meshes.values()
    }
    assert report["found"] == len(expected)
    # The JSON lines hold the same rows as the Parquet file, sorted; the report's sample
    # is their head.
    lines = [json.loads(x) for x in (out / report["orphans_jsonl"]).read_text().splitlines()]
    assert {(r["kind"], r["mesh_id"], r["row_key"]) for r in lines} == set(found)
    assert lines == sorted(lines, key=lambda r: (r["kind"], r["mesh_id"], r["source_table"],
                                                 r["row_key"]))
    assert report["sample"] == lines[:20]
    prom = (out / "tidemesh_orphan_audit.prom").read_text()
    alpha = filled.meshes["alpha"]
    alpha_total = sum(n for (mesh, _), n in per_mesh.items() if mesh == alpha)
    assert f'cm_broker_dedupe_orphan_found{{mesh_id="{alpha}"}} {float(alpha_total)}\n' in prom
    assert 'cm_broker_dedupe_orphan_check_total{result="orphans_found"} 1.0\n' in prom


def test_audit_clean_store_with_retention_reports_nothing(
    spark: SparkSession, store_url: str, tmp_path: Path
) -> None:
    from tidemesh.core.exitcodes import Exit

    filled = fill(store_url)      # includes pruned messages and expired dedupe rows
    # The legitimate states are really there, so "nothing found" means something.
    assert scalar(store_url, "SELECT count(*) FROM client_message_dedupe"
                             " WHERE history_available = false") == 2
    assert scalar(store_url, "SELECT count(*) FROM topic_message WHERE client_message_id"
                             " NOT IN (SELECT client_message_id FROM client_message_dedupe)") == 1
    out = tmp_path / "out"
    outcome = _audit(spark, store_url, out)
    assert outcome.exit_code == Exit.OK, outcome.error
    report = json.loads((out / "report.json").read_text())
    assert report["found"] == 0
    assert report["status"] == "clean"
    assert set(report["meshes"]) == set(filled.meshes.values())
    assert report["table_rows"]["client_message_dedupe"] > 0
    assert _found(spark, out) == []
    prom = (out / "tidemesh_orphan_audit.prom").read_text()
    for mesh in filled.meshes.values():
        assert f'cm_broker_dedupe_orphan_found{{mesh_id="{mesh}"}} 0.0\n' in prom


def _stable(report: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in report.items()
            if k not in ("run_id", "orphans", "orphans_jsonl", "started_at_ms", "finished_at_ms")}


def test_audit_rerun_replaces_outputs_and_failure_keeps_them(
    spark: SparkSession, tmp_path: Path
) -> None:
    from tidemesh.core.exitcodes import Exit

    url = f"sqlite://{tmp_path / 'broker.db'}"
    expected = _plant(fill(url))
    out = tmp_path / "out"
    first = _audit(spark, url, out)
    first_report = json.loads((out / "report.json").read_text())
    second = _audit(spark, url, out)
    second_report = json.loads((out / "report.json").read_text())
    assert first.exit_code == second.exit_code == Exit.ORPHANS_FOUND
    assert first_report["run_id"] != second_report["run_id"]
    assert _stable(first_report) == _stable(second_report)
    assert [p.name for p in (out / "runs").iterdir()] == [second_report["run_id"]]
    assert sorted(_found(spark, out)) == sorted(expected)

    failed = _audit(spark, f"sqlite://{tmp_path / 'missing.db'}", out)
    assert failed.exit_code == Exit.FAILURE
    assert not (tmp_path / "missing.db").exists()
    assert json.loads((out / "report.json").read_text()) == second_report
    assert sorted(_found(spark, out)) == sorted(expected)
    prom = (out / "tidemesh_orphan_audit.prom").read_text()
    assert 'cm_broker_dedupe_orphan_check_total{result="failed"} 1.0\n' in prom
    assert 'cm_broker_dedupe_orphan_check_total{result="orphans_found"} 2.0\n' in prom
    assert "cm_broker_dedupe_orphan_found{" in prom      # the last good counts stay visible
