"""The per-mesh ``hooks/`` folder: its executables and ``hooks.toml``, read at start-up.

A hook runs only when its file is executable *and* hooks.toml has an enabled table for it:
dropping a file into the folder is not enough (spec §6: hooks.toml is mandatory).
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from tidemesh.core.hooks import HookConfig, HookPlan, is_hook_name, parse_config, plan_of
from tidemesh.core.settings import ConfigError

CONFIG_NAME = "hooks.toml"


def executables(folder: Path) -> list[str]:
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir()
                  if is_hook_name(p.name) and p.is_file() and os.access(p, os.X_OK))


def read_config(folder: Path) -> dict[str, HookConfig]:
    path = folder / CONFIG_NAME
    if not path.exists():
        return {}
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from exc
    return parse_config(doc)


def load_plan(folder: Path, enabled: bool = True) -> HookPlan:
    """What may run; raises ConfigError for a hooks.toml that cannot be trusted."""
    return plan_of(read_config(folder), executables(folder), enabled)


def hook_files(folder: Path) -> list[str]:
    """Every file named like a hook, executable or not."""
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if is_hook_name(p.name) and p.is_file())


def describe(folder: Path) -> list[dict[str, Any]]:
    """Every hook named by a file or a table, and whether it would run (`hooks list`)."""
    configs = read_config(folder)
    files = set(hook_files(folder))
    runnable = set(executables(folder))
    rows = []
    for name in sorted(files | set(configs)):
        cfg = configs.get(name)
        state = ("no file" if name not in files else "not executable" if name not in runnable
                 else "no hooks.toml table" if cfg is None
                 else "enabled" if cfg.enabled else "disabled")
        row: dict[str, Any] = {"name": name, "state": state}
        if cfg is not None:
            # hooks.toml may say 30 or 30.0; one number, one type.
            row.update(timeout_s=float(cfg.timeout_s), output_size_limit=cfg.output_size_limit,
                       allow_reply=cfg.allow_reply, network_policy=cfg.network_policy.value,
                       redact_payload=list(cfg.redact_payload))
        rows.append(row)
    return rows
