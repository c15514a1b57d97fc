"""Split a migration script into statements (``executescript`` would commit mid-migration)."""

from __future__ import annotations

import sqlite3


def split_statements(script: str) -> list[str]:
    """Return the complete statements of ``script`` in order, comments kept with them."""
    out: list[str] = []
    buf: list[str] = []
    for line in script.splitlines(keepends=True):
        buf.append(line)
        text = "".join(buf)
        if sqlite3.complete_statement(text):
            if text.strip():
                out.append(text.strip())
            buf = []
    rest = "".join(buf).strip()
    if rest and not all(ln.strip().startswith("--") or not ln.strip() for ln in rest.splitlines()):
        raise ValueError(f"incomplete SQL statement at end of script: {rest[:80]!r}")
    return out
