"""Outbox max-age math (spec §4.9), from the broker's advertised dedupe window."""

from __future__ import annotations

import math
from dataclasses import dataclass

MIN_RETENTION_DAYS = 3
PERMANENT_DEFAULT_HOURS = 168
PERMANENT_CAP_HOURS = 720


class MaxAgeError(ValueError):
    """The configured or advertised values cannot give a safe max age."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code


@dataclass(frozen=True, slots=True)
class DedupeWindow:
    mode: str                      # "retention_scoped" | "permanent"
    retention_days: int | None     # required when retention_scoped


def max_age_hours(
    window: DedupeWindow, configured_hours: int = PERMANENT_DEFAULT_HOURS,
    override_hours: int | None = None,
) -> int:
    """Hours an outbox row may wait before it goes ``dead`` with ``max_age_exceeded``."""
    if window.mode == "permanent":
        base = min(configured_hours, PERMANENT_CAP_HOURS)
        return override_hours if override_hours is not None else base
    days = window.retention_days
    if days is None or days < MIN_RETENTION_DAYS:
        raise MaxAgeError(
            "feature_param_below_floor",
            f"dedupe_retention_days={days} is below the floor of {MIN_RETENTION_DAYS}",
        )
    margin = max(24, math.ceil(days * 0.1 * 24))
    derived = max(72, days * 24 - margin)
    if override_hours is None:
        return derived
    if override_hours > days * 24 - 1:
        raise MaxAgeError(
            "outbox_max_age_above_dedupe_window",
            f"max_age_hours_override={override_hours} exceeds the broker's dedupe window "
            f"of {days * 24} h",
        )
    return override_hours
