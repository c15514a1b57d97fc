"""Service-manager files for the daemon and the broker, as text: systemd units and launchd plists.

Owns the unit and plist contents (restart policy, hardening, limits, environment). In a CI
environment (core.environment.ci_environment) installing a persistent service is refused by
default.
Pure: the caller finds the console script, computes the paths and writes the result; nothing
here reads the environment, touches files or runs a service manager.
"""

from __future__ import annotations

import plistlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

_UNIT_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


@dataclass(frozen=True, slots=True)
class ServiceSpec:
    """Everything a unit or plist says about one service."""

    name: str                       # systemd unit stem, e.g. tidemesh-daemon-default
    label: str                      # launchd label, e.g. dev.tidemesh.daemon.default
    description: str
    scope: str                      # "user" | "system"
    argv: tuple[str, ...]           # absolute console script first
    environment: tuple[tuple[str, str], ...] = ()
    writable: tuple[str, ...] = ()  # absolute folders the service writes (ReadWritePaths)
    runtime_directory: str | None = None   # relative to /run or $XDG_RUNTIME_DIR
    state_directory: str | None = None     # relative to /var/lib (system scope)
    user: str | None = None                # system scope: run as this account
    log_file: str | None = None            # launchd: stray stdout/stderr (crash output)
    reloads_on_sighup: bool = False        # systemd: `systemctl reload` sends SIGHUP
    final_exits: tuple[int, ...] = ()      # exit codes no restart can fix (systemd only)
    private_tmp: bool = True               # systemd: off when the service's folders are in /tmp
    limits: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_LIMITS))

    def __post_init__(self) -> None:
        if not _UNIT_NAME.match(self.name) or not _UNIT_NAME.match(self.label):
            raise ValueError(f"service name {self.name!r} may hold only letters, digits, "
                             "'.', '_' and '-'")
        if self.scope not in ("user", "system"):
            raise ValueError(f"scope must be user or system, not {self.scope!r}")
        if not self.argv or not self.argv[0].startswith("/"):
            raise ValueError("the first argument must be the absolute path of the program")

    @property
    def unit_file(self) -> str:
        return f"{self.name}.service"

    @property
    def plist_file(self) -> str:
        return f"{self.label}.plist"


# Spec §9's limits. MemoryMax caps a leak before it takes the host; the outbox is on disk,
# so a restart loses nothing. 4096 files cover 256 in-flight IPC requests, SSE streams and
# SQLite's handles with room to spare.
DEFAULT_LIMITS: Mapping[str, str] = {
    "LimitNOFILE": "4096",
    "MemoryMax": "1G",
    "TasksMax": "128",
}


def _escape(arg: str) -> str:
    """One ExecStart/Environment word: systemd expands % and $, and splits on blanks."""
    text = arg.replace("%", "%%").replace("$", "$$")
    if re.search(r"[\s\"'\\;]", text) or not text:
        text = '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


# Folders a private /tmp (PrivateTmp=yes) replaces for the service.
TMP_FOLDERS = ("/tmp", "/var/tmp")  # noqa: S108 - names them, creates nothing there


def under_tmp(path: str) -> bool:
    return any(path == t or path.startswith(t + "/") for t in TMP_FOLDERS)


def systemd_unit(spec: ServiceSpec) -> str:
    """The unit file text. Restart on failure only: exit 0 means an operator stopped it."""
    wanted_by = "default.target" if spec.scope == "user" else "multi-user.target"
    lines = [
        f"# Written by `tidemesh ... install-service` ({spec.scope} scope); regenerate rather",
        "# than edit: `install-service --dry-run` prints what it would write.",
        "[Unit]",
        f"Description={spec.description}",
        "Wants=network-online.target",
        "After=network-online.target",
        # Five failed starts within five minutes stop the restarts: a daemon that cannot
        # start (bad config, host mismatch) would otherwise spin forever.
        "StartLimitIntervalSec=300",
        "StartLimitBurst=5",
        "",
        "[Service]",
        "Type=simple",
        "ExecStart=" + " ".join(_escape(a) for a in spec.argv),
        *(["ExecReload=/bin/kill -HUP $MAINPID"] if spec.reloads_on_sighup else []),
        "Restart=on-failure",
        *([f"RestartPreventExitStatus={' '.join(map(str, spec.final_exits))}"]
          if spec.final_exits else []),
        "RestartSec=5s",
        # The drain deadline (shutdown.grace_s) is shorter, so systemd's SIGKILL is a backstop.
        "TimeoutStopSec=60s",
    ]
    if spec.user:
        lines.append(f"User={spec.user}")
    lines += [f"Environment={_escape(f'{k}={v}')}" for k, v in spec.environment]
    lines += [
        "NoNewPrivileges=yes",
        # A private /tmp would hide folders the service keeps under the host's /tmp.
        f"PrivateTmp={'yes' if spec.private_tmp else 'no'}",
        "ProtectSystem=strict",
        "ProtectHome=read-only",
    ]
    lines += [f"ReadWritePaths={_escape(p)}" for p in spec.writable]
    if spec.runtime_directory:
        lines += [f"RuntimeDirectory={spec.runtime_directory}", "RuntimeDirectoryMode=0700"]
    if spec.state_directory:
        lines += [f"StateDirectory={spec.state_directory}", "StateDirectoryMode=0700"]
    lines += [f"{k}={v}" for k, v in spec.limits.items()]
    lines += ["", "[Install]", f"WantedBy={wanted_by}", ""]
    return "\n".join(lines)


def launchd_plist(spec: ServiceSpec) -> bytes:
    """The plist. KeepAlive restarts it unless it exited 0 (the same rule as on-failure).

    launchd has no RestartPreventExitStatus, so ``final_exits`` cannot be said here: launchd
    starts such a daemon again every ThrottleInterval, and each start refuses at once (the
    daemon's revocation record), without touching the network; docs/operations.md says to
    unload the service."""
    body: dict[str, object] = {
        "Label": spec.label,
        "ProgramArguments": list(spec.argv),
        "RunAtLoad": True,
        "KeepAlive": {"SuccessfulExit": False},
        # launchd's equivalent of RestartSec: no faster than one start every 5 s.
        "ThrottleInterval": 5,
        "ProcessType": "Background",
        "SoftResourceLimits": {"NumberOfFiles": int(spec.limits.get("LimitNOFILE", "4096"))},
    }
    if spec.environment:
        body["EnvironmentVariables"] = dict(spec.environment)
    if spec.user:
        body["UserName"] = spec.user
    if spec.log_file:
        body["StandardOutPath"] = spec.log_file
        body["StandardErrorPath"] = spec.log_file
    return plistlib.dumps(body, sort_keys=True)

