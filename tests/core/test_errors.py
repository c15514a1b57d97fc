"""Every class of the error tree, walked from the classes themselves: its wire body comes
back as the same class (``from_body``), the SDK raises that class for the daemon's answer
(``send`` and each ``send_many`` result), and the CLI exits with the code the table in
docs/cli.md gives for it."""

from __future__ import annotations

import importlib
import json
import pkgutil
import re
from pathlib import Path

import pytest

from tidemesh.cli.output import exit_code_for
from tidemesh.client import calls
from tidemesh.core.errors import TidemeshError, error_classes, from_body
from tidemesh.core.exitcodes import Exit

ROOT = Path(__file__).resolve().parents[2]

# What the CLI exits with for each code: a new class fails this test until it is decided.
EXPECTED_EXIT = {
    "internal": Exit.FAILURE, "invalid_request": Exit.REJECTED,
    "idempotency_key_mismatch": Exit.REJECTED, "token_in_query": Exit.REJECTED,
    "invalid_config": Exit.USAGE, "mesh_not_chosen": Exit.REJECTED,
    "invalid_frame": Exit.REJECTED, "unauthorized": Exit.REJECTED,
    "forbidden": Exit.REJECTED, "send_vetoed": Exit.REJECTED, "member_revoked": Exit.REVOKED,
    "not_found": Exit.REJECTED, "unknown_destination": Exit.REJECTED,
    "unknown_member": Exit.REJECTED, "ambiguous_member": Exit.REJECTED,
    "method_not_allowed": Exit.REJECTED, "conflict": Exit.CONFLICT,
    "idempotency_key_reused": Exit.CONFLICT, "payload_too_large": Exit.REJECTED,
    "daemon_busy": Exit.REJECTED, "rate_limited": Exit.REJECTED,
    "unavailable": Exit.FAILURE, "insufficient_storage": Exit.FAILURE,
    "daemon_not_running": Exit.NOT_RUNNING, "daemon_not_answering": Exit.NOT_ANSWERING,
    "service_install_failed": Exit.FAILURE, "usage_error": Exit.USAGE,
    "mesh_name_bound": Exit.USAGE, "not_joined": Exit.CONFLICT, "not_private": Exit.USAGE,
    "backup_unusable": Exit.REJECTED, "backup_wrong_passphrase": Exit.REJECTED,
    "backup_damaged": Exit.REJECTED, "backup_schema_too_new": Exit.REJECTED,
    "restore_refused": Exit.REJECTED, "incompatible_daemon": Exit.FEATURE_UNAVAILABLE,
    "file_too_large": Exit.REJECTED, "file_integrity_failed": Exit.FAILURE,
    "unsafe_target": Exit.REJECTED, "invalid_name": Exit.USAGE,
}


def _import_everything() -> None:
    """Import every module of every package, so that every class defined anywhere is seen
    (the Spark jobs need PySpark, which tests do not install)."""
    for top in ("core", "storage", "daemon", "broker", "client", "cli", "spark"):
        pkg = importlib.import_module(f"tidemesh.{top}")
        for mod in pkgutil.walk_packages(pkg.__path__, f"tidemesh.{top}."):
            try:
                importlib.import_module(mod.name)
            except ModuleNotFoundError as exc:
                if exc.name != "pyspark":
                    raise


_import_everything()
CLASSES = error_classes()


def _documented_exit_codes() -> set[int]:
    text = (ROOT / "docs" / "cli.md").read_text()
    table = text.split("## Exit codes (CLI and daemon)")[1].split("\n## ")[0]
    return {int(m) for m in re.findall(r"^\| (\d+) \|", table, re.MULTILINE)}


def test_every_code_is_one_class_and_has_a_decided_exit() -> None:
    codes = [c.code for c in CLASSES]
    assert len(codes) == len(set(codes)), "two classes share a wire code"
    assert set(codes) == set(EXPECTED_EXIT)
    assert {"send_vetoed", "rate_limited"} <= set(codes)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.code)
def test_each_class_survives_the_wire_the_sdk_and_the_cli(cls: type[TidemeshError]) -> None:
    err = cls("what went wrong", detail_a=1, detail_b="two")
    body = err.to_body()
    assert body["error"]["code"] == cls.code
    back = from_body(cls.http_status, json.loads(json.dumps(body)))
    assert type(back) is cls
    assert (back.code, back.message, back.http_status) == (cls.code, err.message,
                                                           cls.http_status)
    assert back.to_body() == body
    # The SDK: a daemon's answer with this body raises this class (a send_many result is
    # read by the same from_body, above).
    with pytest.raises(cls) as raised:
        calls.send({"to": "topic:ops", "body": "x"}, None).answer(
            cls.http_status, "application/json", json.dumps(body).encode())
    assert type(raised.value) is cls and raised.value.to_body() == body
    # The CLI's exit code, one of the documented rows.
    code = exit_code_for(back)
    assert code == EXPECTED_EXIT[cls.code]
    assert int(code) in _documented_exit_codes()


def test_every_exit_code_is_documented() -> None:
    assert {int(e) for e in Exit} == _documented_exit_codes()
