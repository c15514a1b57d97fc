"""Broker settings: precedence, validation, and every setting documented."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidemesh.broker.config import SETTINGS, load, store_url
from tidemesh.core.settings import ConfigError

DOCS = Path(__file__).resolve().parents[2] / "docs" / "broker.md"


def test_flag_beats_env_beats_file() -> None:
    s, resolved = load({"dedupe": {"retention_days": 5}}, {"TIDEMESH_DEDUPE_RETENTION_DAYS": "9"},
                       {"dedupe.retention_days": 11})
    assert s.dedupe_retention_days == 11 and resolved["dedupe.retention_days"].source == "flag"
    s, _ = load({"dedupe": {"retention_days": 5}}, {}, {})
    assert s.dedupe_retention_days == 5


@pytest.mark.parametrize("bad", [
    {"dedupe.retention_days": 2}, {"dedupe.mode": "forever"}, {"broker.listen": "nope"},
    {"limits.inline_bytes": 10}, {"server.idle_timeout_s": 10}, {"server.ping_interval_s": -1},
])
def test_invalid_settings_fail_fast(bad: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        load({}, {}, bad)


def test_default_store_is_embedded_sqlite_under_home(tmp_path: Path) -> None:
    s, _ = load({}, {}, {})
    assert store_url(s, {"TIDEMESH_HOME": str(tmp_path)}) == (
        f"sqlite:///{tmp_path / 'broker' / 'broker.db'}")


def test_every_setting_is_documented() -> None:
    text = DOCS.read_text(encoding="utf-8")
    missing = [s.name for s in SETTINGS if f"`{s.name}`" not in text]
    assert missing == []
