"""How an orphan-audit report reads to an operator: pure text from the report and its rows.

Shared by the audit job (which prints it when a run ends) and ``tidemesh audit show`` (which
reads a published run without Spark), so both say the same thing the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

COLUMNS = (("kind", "kind"), ("mesh", "mesh_id"), ("table", "source_table"),
           ("row", "row_key"), ("message", "broker_message_id"),
           ("sender", "sender_pubkey"), ("client id", "client_message_id"))


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


def render(report: Mapping[str, Any], rows: Sequence[Mapping[str, Any]], *,
           shown_limit: int) -> str:
    """The status line, the totals by kind, then up to ``shown_limit`` offending rows."""
    found = int(report.get("found", 0))
    lines = [f"audit {report.get('run_id', '?')}: {report.get('status', '?')}, "
             f"{found} orphan{'s' if found != 1 else ''} in {report.get('store', '?')}"]
    totals = {k: v for k, v in dict(report.get("totals", {})).items() if v}
    if totals:
        lines.append("  " + ", ".join(f"{k} {v}" for k, v in sorted(totals.items())))
    if "rows_checked" in report:   # reports of older runs lack it
        young = int(report.get("rows_too_young", 0))
        lines.append(f"  checked {report['rows_checked']} rows; {young} newer than the "
                     "watermark (inside the grace window) wait for the next run")
    shown = list(rows[:shown_limit])
    if shown:
        lines.append("")
        lines.extend(_table(shown))
        if found > len(shown):
            lines.append(f"... and {found - len(shown)} more "
                         "(tidemesh audit show --json prints every row)")
    return "\n".join(lines)


def _table(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    cells = [[name for name, _ in COLUMNS]]
    cells += [[_cell(row.get(key)) for _, key in COLUMNS] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(COLUMNS))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
            for r in cells]
