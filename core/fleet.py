"""One user's daemons on one host taken together (spec §7 ``[fleet]``): how many may run and
how many bytes their data may take. Pure: callers read ``fleet.toml`` and count.

The settings are the user's, not a mesh's, so they live in one file beside the per-mesh
folders (``core.paths.fleet_config_file``), not in any ``daemon.toml``: a per-mesh value
would let each mesh claim its own budget for the whole fleet.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tidemesh.core.errors import InsufficientStorage
from tidemesh.core.settings import ConfigError, Resolved, Setting, build

SETTINGS: tuple[Setting, ...] = (
    Setting("fleet.max_daemons", int, 10, "Most daemons running at once from this tidemesh "
            "home (one per mesh; counted in its runtime folder, so another TIDEMESH_HOME counts "
            "apart); one more `daemon up` is refused."),
    Setting("fleet.total_disk_budget", int, None, "Bytes the data of all this user's meshes "
            "on this host may take (databases and their WAL); past it retention sweeps at once "
            "and new sends get 507. Unset: no budget.", optional=True),
)


@dataclass(frozen=True, slots=True)
class FleetSettings:
    fleet_max_daemons: int
    fleet_total_disk_budget: int | None


def load(file_data: Mapping[str, Any], environ: Mapping[str, str]
         ) -> tuple[FleetSettings, dict[str, Resolved]]:
    settings, resolved = build(FleetSettings, SETTINGS, file_data, environ, {})
    if settings.fleet_max_daemons < 1:
        raise ConfigError("fleet.max_daemons must be at least 1", field="fleet.max_daemons")
    budget = settings.fleet_total_disk_budget
    if budget is not None and budget < 1:
        raise ConfigError("fleet.total_disk_budget must be a positive number of bytes",
                          field="fleet.total_disk_budget")
    return settings, resolved


def start_refusal(running: Sequence[str], max_daemons: int, where: str, counted_in: str
                  ) -> str | None:
    """Why one more daemon may not start, or None. ``running`` names the meshes of the
    others, counted in the runtime folder ``counted_in``: daemons of another tidemesh home
    (another ``TIDEMESH_HOME``) are not counted, so the words say where they were counted."""
    if len(running) < max_daemons:
        return None
    return (f"{len(running)} daemons already run from this tidemesh home (counted in "
            f"{counted_in}: {', '.join(running)}), the most fleet.max_daemons "
            f"({max_daemons}, {where}) allows; daemons of other homes (another TIDEMESH_HOME) "
            "are not counted; stop one (`tidemesh daemon ps`, `daemon down --mesh M`) or "
            "raise the setting")


def over_budget(used_bytes: int, budget: int | None) -> bool:
    return budget is not None and used_bytes >= budget


def budget_exceeded(used_bytes: int, budget: int) -> InsufficientStorage:
    """The 507 a send gets while the fleet is over its disk budget."""
    return InsufficientStorage(
        f"this user's meshes take {used_bytes} bytes on this host, at or past "
        f"fleet.total_disk_budget ({budget}); new sends are refused until retention or an "
        "operator frees space, nothing was stored, and messages are still being received",
        reason="fleet_disk_budget", used_bytes=used_bytes, budget_bytes=budget,
        setting="fleet.total_disk_budget")
