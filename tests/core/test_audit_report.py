from __future__ import annotations

from tidemesh.core.audit_report import render

REPORT = {"run_id": "01RUN", "status": "orphans_found", "store": "sqlite:///b.db", "found": 3,
          "totals": {"dedupe_without_message": 2, "message_without_history": 1,
                     "delivery_without_message": 0}}
ROW = {"kind": "dedupe_without_message", "mesh_id": "m1", "source_table": "client_message_dedupe",
       "row_key": "m1/pk/c1", "broker_message_id": "01MSG", "sender_pubkey": "pk",
       "client_message_id": None}


def test_render_names_status_totals_and_rows() -> None:
    text = render(REPORT, [ROW], shown_limit=20)
    head, totals, _, header, row, more = text.splitlines()
    assert head == "audit 01RUN: orphans_found, 3 orphans in sqlite:///b.db"
    assert totals == "  dedupe_without_message 2, message_without_history 1"
    assert header.split() == ["kind", "mesh", "table", "row", "message", "sender", "client", "id"]
    assert row.split() == ["dedupe_without_message", "m1", "client_message_dedupe", "m1/pk/c1",
                           "01MSG", "pk", "-"]
    assert more.startswith("... and 2 more")


def test_render_clean_run_is_one_line() -> None:
    clean = {**REPORT, "status": "clean", "found": 0, "totals": {}}
    assert render(clean, [], shown_limit=20) == \
        "audit 01RUN: clean, 0 orphans in sqlite:///b.db"


def test_render_respects_the_limit() -> None:
    text = render(REPORT, [ROW, ROW, ROW], shown_limit=1)
    assert text.count("m1/pk/c1") == 1 and "... and 2 more" in text
