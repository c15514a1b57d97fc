"""The fleet rules without any daemon: settings checked, one more daemon refused at the
limit with the count and the setting, the budget's 507."""

from __future__ import annotations

import pytest

from tidemesh.core import fleet
from tidemesh.core.errors import InsufficientStorage
from tidemesh.core.settings import ConfigError


def test_defaults_are_ten_daemons_and_no_budget() -> None:
    s, _ = fleet.load({}, {})
    assert (s.fleet_max_daemons, s.fleet_total_disk_budget) == (10, None)


def test_environment_overrides_the_file_and_nonsense_is_refused() -> None:
    s, _ = fleet.load({"fleet": {"max_daemons": 3}}, {"TIDEMESH_FLEET_MAX_DAEMONS": "4"})
    assert s.fleet_max_daemons == 4
    for bad in ({"fleet": {"max_daemons": 0}}, {"fleet": {"total_disk_budget": -1}},
                {"fleet": {"maximum": 1}}):
        with pytest.raises(ConfigError):
            fleet.load(bad, {})


def test_the_next_daemon_is_refused_at_the_limit_naming_count_and_setting() -> None:
    meshes = [f"m{i}" for i in range(10)]
    assert fleet.start_refusal(meshes[:9], 10, "f.toml", "/run/t") is None
    said = fleet.start_refusal(meshes, 10, "f.toml", "/run/t")
    assert said is not None and "fleet.max_daemons (10, f.toml)" in said
    # Worded as counted: per tidemesh home (its runtime folder), naming the meshes.
    assert "10 daemons already run from this tidemesh home (counted in /run/t: m0, m1" in said
    assert "of this user" not in said


def test_the_budget_is_reached_at_its_value() -> None:
    assert not fleet.over_budget(99, 100) and fleet.over_budget(100, 100)
    assert not fleet.over_budget(10**12, None)
    err = fleet.budget_exceeded(120, 100)
    assert isinstance(err, InsufficientStorage) and err.http_status == 507
    assert err.details["reason"] == "fleet_disk_budget" and "fleet.total_disk_budget" in err.message
