"""Settings declared once, resolved flag > environment > TOML file > default.

Pure given its inputs: callers read the file and the environment and pass them in.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

from tidemesh.core.errors import InvalidRequest


@dataclass(frozen=True, slots=True)
class Setting:
    name: str            # dotted: "section.key"; env is TIDEMESH_SECTION_KEY
    type: type
    default: Any
    help: str
    secret: bool = False
    optional: bool = False   # None allowed (unset)
    reloadable: bool = False  # SIGHUP applies it to a running process; else needs a restart
    # (lowest, highest) a number may be, both allowed; a value outside is refused at load.
    bounds: tuple[float, float] | None = None

    @property
    def env(self) -> str:
        return "TIDEMESH_" + self.name.replace(".", "_").upper()

    @property
    def attr(self) -> str:
        return self.name.replace(".", "_")


@dataclass(frozen=True, slots=True)
class Resolved:
    value: Any
    source: str          # "default" | "file" | "env" | "flag"


class ConfigError(InvalidRequest):
    code = "invalid_config"


def _bool(raw: Any) -> Any:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    return {"1": True, "true": True, "yes": True, "on": True,
            "0": False, "false": False, "no": False, "off": False}.get(text)


def _int(raw: Any) -> Any:
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.strip().lstrip("-").isdigit():
        return int(raw)
    return None


def _float(raw: Any) -> Any:
    if isinstance(raw, bool):
        return None
    try:
        return float(raw)
    except (TypeError, ValueError):
        return None


def _str(raw: Any) -> Any:
    return raw if isinstance(raw, str) else None


_CASTS = {bool: _bool, int: _int, float: _float, str: _str}


def _cast(setting: Setting, raw: Any, source: str) -> Any:
    if raw is None and setting.optional:
        return None
    value = _CASTS[setting.type](raw)
    if value is None:
        raise ConfigError(
            f"setting {setting.name} from {source} has value {raw!r}: "
            f"not a valid {setting.type.__name__}",
            field=setting.name,
        )
    return _bounded(setting, value, raw, source)


# SQLite's and PostgreSQL's integers stop here; a setting past it reaches neither.
_INT_MAX = (1 << 63) - 1


def _bounded(setting: Setting, value: Any, raw: Any, source: str) -> Any:
    """``value`` if it is a number within the setting's range (nan and infinity never are)."""
    if setting.type not in (int, float):
        return value
    lo, hi = setting.bounds or (-_INT_MAX, _INT_MAX)
    if math.isfinite(value) and lo <= value <= hi:
        return value
    raise ConfigError(f"setting {setting.name} from {source} has value {raw!r}: "
                      f"must be {range_text(setting)}", field=setting.name)


def range_text(setting: Setting) -> str:
    """A setting's range as the docs and errors say it."""
    if setting.bounds is None:
        return "a finite number"
    lo, hi = (int(b) if float(b).is_integer() else b for b in setting.bounds)
    return f"at least {lo}" if hi >= _INT_MAX else f"{lo} to {hi}"


def _from_file(data: Mapping[str, Any], name: str) -> tuple[bool, Any]:
    node: Any = data
    for part in name.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def resolve(
    table: tuple[Setting, ...],
    file_data: Mapping[str, Any],
    environ: Mapping[str, str],
    flags: Mapping[str, Any],
) -> dict[str, Resolved]:
    """Resolve every setting; unknown keys in the file are an error, so typos surface."""
    _reject_unknown(table, file_data)
    out: dict[str, Resolved] = {}
    for s in table:
        if flags.get(s.name) is not None:
            out[s.name] = Resolved(_cast(s, flags[s.name], "flag"), "flag")
        elif s.env in environ:
            out[s.name] = Resolved(_cast(s, environ[s.env], "env " + s.env), "env")
        else:
            found, raw = _from_file(file_data, s.name)
            out[s.name] = (
                Resolved(_cast(s, raw, "file"), "file") if found else Resolved(s.default, "default")
            )
    return out


S = TypeVar("S", bound="DataclassInstance")


def build(cls: type[S], table: tuple[Setting, ...], file_data: Mapping[str, Any],
          environ: Mapping[str, str], flags: Mapping[str, Any]) -> tuple[S, dict[str, Resolved]]:
    """Resolve ``table`` into the frozen settings class whose fields are the settings' attrs."""
    resolved = resolve(table, file_data, environ, flags)
    values = {s.attr: resolved[s.name].value for s in table}
    if {f.name for f in dataclasses.fields(cls)} != set(values):
        raise TypeError(f"{cls.__name__} fields and the SETTINGS table differ")
    return cls(**values), resolved


def _reject_unknown(table: tuple[Setting, ...], file_data: Mapping[str, Any]) -> None:
    known = {s.name for s in table}
    for section, body in file_data.items():
        keys = body.items() if isinstance(body, Mapping) else [(None, body)]
        for key, _ in keys:
            name = section if key is None else f"{section}.{key}"
            if name not in known:
                raise ConfigError(f"unknown setting {name} in config file", field=name)


REDACTED = "<redacted>"
_USERINFO = re.compile(r"^(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<user>[^:@/]*):(?P<pw>[^@/]*)@",
                       re.IGNORECASE)


def redact(setting: Setting, value: Any) -> Any:
    """What ``config show`` may print: secrets hidden, and passwords inside URLs."""
    if value is None:
        return None
    if setting.secret:
        return REDACTED
    if isinstance(value, str):
        return _USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:{REDACTED}@", value)
    return value


def toml_value(value: Any) -> str:
    """A value as it is written in the TOML file."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table(table: tuple[Setting, ...]) -> str:
    """The reference table in docs/configuration.md; a test keeps the docs equal to it."""
    rows = ["| setting | env | type | default | reload | what |", "|---|---|---|---|---|---|"]
    for s in table:
        default = "unset" if s.default is None else f"`{_cell(toml_value(s.default))}`"
        reload = "SIGHUP" if s.reloadable else "restart"
        kind = s.type.__name__ + (f", {range_text(s)}" if s.bounds is not None else "")
        rows.append(f"| `{s.name}` | `{s.env}` | {kind} | {default} | {reload} "
                    f"| {_cell(s.help)} |")
    return "\n".join(rows) + "\n"
