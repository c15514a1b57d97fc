"""Where an audit run's results land, and how they replace the previous run's.

Owns the output folder::

    <out>/report.json                   the last good run: counts, watermark, run id, paths
    <out>/runs/<run_id>/orphans.parquet the offending rows of that run (FINDINGS schema)
    <out>/runs/<run_id>/orphans.jsonl   the same rows as JSON lines, read without Spark
    <out>/runs/<run_id>/report.json     the same report, next to its rows
    <out>/state.json                    check counters carried from run to run
    <out>/tidemesh_orphan_audit.prom    the Prometheus textfile (or audit.textfile)

A run writes its rows under ``runs/.staging-<run_id>``, renames that folder into place, and
only then replaces ``report.json`` with ``os.replace`` (atomic on one filesystem). A run that
dies before that leaves the previous report and the rows it points at untouched; the next good
run deletes every other folder under ``runs/``, so outputs are replaced, never accumulated.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tidemesh.core.metrics import CallbackCounter, CallbackGauge, CollectorRegistry, render

TEXTFILE_NAME = "tidemesh_orphan_audit.prom"
RESULTS = ("clean", "orphans_found", "failed")
FINDINGS_JSONL = "orphans.jsonl"
# The report carries the first rows so that an operator sees ids without reading Parquet.
SAMPLE_ROWS = 20
FINDING_ORDER = ("kind", "mesh_id", "source_table", "row_key")


@dataclass(frozen=True, slots=True)
class OutputPaths:
    root: Path
    textfile: Path

    @classmethod
    def under(cls, out: str, textfile: str | None) -> OutputPaths:
        root = Path(out)
        return cls(root, Path(textfile) if textfile else root / TEXTFILE_NAME)

    @property
    def report(self) -> Path:
        return self.root / "report.json"

    @property
    def state(self) -> Path:
        return self.root / "state.json"

    @property
    def runs(self) -> Path:
        return self.root / "runs"

    def staging(self, run_id: str) -> Path:
        return self.runs / f".staging-{run_id}"

    def run(self, run_id: str) -> Path:
        return self.runs / run_id


def write_atomic(path: Path, text: str) -> None:
    """Write a file so a reader sees the old content or the new, never a torn one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with tmp.open("w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def publish_run(paths: OutputPaths, run_id: str, report: Mapping[str, Any]) -> None:
    """Move a finished staging folder into place, point report.json at it, drop older runs."""
    staged, final = paths.staging(run_id), paths.run(run_id)
    write_atomic(staged / "report.json", _dumps(report))
    os.replace(staged, final)
    write_atomic(paths.report, _dumps(report))
    for other in paths.runs.iterdir():
        if other.name != run_id:
            shutil.rmtree(other, ignore_errors=True)


def write_findings_jsonl(rows: Iterable[Any], path: Path, sample_rows: int
                         ) -> list[dict[str, Any]]:
    """Every offending row as one JSON line (what ``tidemesh audit show`` reads without
    Spark); returns the first ``sample_rows`` of them for the report."""
    sample: list[dict[str, Any]] = []
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for row in rows:
            item = row.asDict() if hasattr(row, "asDict") else dict(row)
            fh.write(json.dumps(item, sort_keys=True) + "\n")
            if len(sample) < sample_rows:
                sample.append(item)
        fh.flush()
        os.fsync(fh.fileno())
    return sample


def discard_staging(paths: OutputPaths, run_id: str) -> None:
    shutil.rmtree(paths.staging(run_id), ignore_errors=True)


def bump_check_total(paths: OutputPaths, result: str) -> dict[str, int]:
    """Add one to the run counter for ``result``; Prometheus counters must never go back."""
    totals = {name: 0 for name in RESULTS}
    try:
        saved = json.loads(paths.state.read_text(encoding="utf-8"))
        totals.update({k: int(v) for k, v in saved.get("check_total", {}).items()
                       if k in totals})
    except (FileNotFoundError, ValueError, AttributeError):
        pass          # first run, or a state file from a crash mid-write: start again at 0
    totals[result] += 1
    write_atomic(paths.state, _dumps({"check_total": totals}))
    return totals


def render_textfile(
    check_total: Mapping[str, int],
    counts: Mapping[str, Mapping[str, int]] | None,
    kinds: Iterable[str],
    finished_at_ms: int,
    watermark_ms: int | None,
) -> str:
    """The Prometheus textfile; ``counts`` (mesh -> kind -> found) is None after a failure."""
    reg = CollectorRegistry()
    CallbackCounter("cm_broker_dedupe_orphan_check_total",
                    "Orphan audit runs, by result (clean, orphans_found, failed).", ["result"],
                    lambda: [({"result": r}, float(n)) for r, n in check_total.items()], reg)
    CallbackGauge("cm_broker_dedupe_orphan_check_last_run_timestamp_seconds",
                  "When the last orphan audit run ended.", [],
                  lambda: [({}, finished_at_ms / 1000)], reg)
    if counts is None or watermark_ms is None:
        return render(reg).decode()
    kind_list = list(kinds)
    CallbackGauge("cm_broker_dedupe_orphan_check_watermark_seconds",
                  "Input watermark of the last good run: rows before it were judged.", [],
                  lambda: [({}, watermark_ms / 1000)], reg)
    CallbackGauge("cm_broker_dedupe_orphan_found",
                  "Orphaned rows of any kind found per mesh by the last good run.", ["mesh_id"],
                  lambda: [({"mesh_id": m}, float(sum(k.values())))
                           for m, k in sorted(counts.items())], reg)
    CallbackGauge("cm_broker_dedupe_orphan_found_by_kind",
                  "Orphaned rows per mesh and kind found by the last good run.",
                  ["mesh_id", "kind"],
                  lambda: [({"mesh_id": m, "kind": kind}, float(by_kind.get(kind, 0)))
                           for m, by_kind in sorted(counts.items()) for kind in kind_list], reg)
    return render(reg).decode()


def _dumps(obj: Mapping[str, Any]) -> str:
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"
