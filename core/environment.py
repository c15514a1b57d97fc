"""Which environment a daemon runs in (host, container or CI) and the defaults that follow.

Spec §16's table: on a host the daemon also listens on loopback TCP, keeps its member keypair
and runs hooks; in a container it serves the Unix socket only (a TCP port is reachable from
other containers sharing the network namespace); in CI it serves the socket only, runs no
hooks and is ephemeral (its keypair lives as long as the process: a shared runner must not
keep a mesh identity after the job). A setting given explicitly always wins over the
environment's default.

Pure: the caller passes the environment variables and a reader of the marker files.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

HOST, CONTAINER, CI = "host", "container", "ci"
KINDS = (HOST, CONTAINER, CI)
AUTO = "auto"

# Environment variables that CI systems set. `install-service` refuses there (a service would
# outlive the job) and a daemon there is ephemeral.
CI_VARIABLES = ("CI", "GITHUB_ACTIONS", "GITLAB_CI", "BUILDKITE", "CIRCLECI", "JENKINS_URL",
                "TF_BUILD", "TEAMCITY_VERSION")
_FALSE = {"", "0", "false", "no", "off"}

KUBERNETES_VARIABLE = "KUBERNETES_SERVICE_HOST"
# Files a container runtime puts in the container's root: Docker's and Podman's.
CONTAINER_FILES = ("/.dockerenv", "/run/.containerenv")
CGROUP_FILE = "/proc/1/cgroup"
# cgroup paths of PID 1 under the usual runtimes (cgroup v1; under v2 the path is "/").
_CGROUP_MARKS = re.compile(r"docker|kubepods|containerd|libpod|lxc|crio|garden")

WARN_PERSISTENT_IN_CI = "persistent_keypair_in_ci_environment"


def ci_environment(environ: Mapping[str, str]) -> str | None:
    """The first CI variable set to something other than a false value, or None."""
    for name in CI_VARIABLES:
        if environ.get(name, "").strip().lower() not in _FALSE:
            return name
    return None


def container_marker(environ: Mapping[str, str],
                     read: Callable[[str], str | None]) -> str | None:
    """What says this is a container (a variable, a file, PID 1's cgroup), or None.

    ``read(path)`` returns a file's text, or None when it does not exist or cannot be read."""
    if environ.get(KUBERNETES_VARIABLE, "").strip():
        return KUBERNETES_VARIABLE
    for path in CONTAINER_FILES:
        if read(path) is not None:
            return path
    cgroup = read(CGROUP_FILE)
    if cgroup is not None and _CGROUP_MARKS.search(cgroup):
        return CGROUP_FILE
    return None


@dataclass(frozen=True, slots=True)
class Detected:
    kind: str        # host | container | ci
    reason: str      # what decided it, for logs and /v1/health


def detect(pinned: str, environ: Mapping[str, str],
           read: Callable[[str], str | None]) -> Detected:
    """``pinned`` is the setting environment.kind: auto, or one of KINDS. CI wins over a
    container (a CI job often runs in one, and CI's defaults include the container's)."""
    if pinned in KINDS:
        return Detected(pinned, "environment.kind")
    if pinned != AUTO:
        raise ValueError(f"environment.kind must be auto, host, container or ci, not {pinned!r}")
    if (name := ci_environment(environ)) is not None:
        return Detected(CI, f"CI variable {name}")
    if (marker := container_marker(environ, read)) is not None:
        return Detected(CONTAINER, marker)
    return Detected(HOST, "no CI variable or container marker")


@dataclass(frozen=True, slots=True)
class Defaults:
    tcp_enabled: bool
    hooks_enabled: bool
    persistent: bool


DEFAULTS: Mapping[str, Defaults] = {
    HOST: Defaults(tcp_enabled=True, hooks_enabled=True, persistent=True),
    CONTAINER: Defaults(tcp_enabled=False, hooks_enabled=True, persistent=True),
    CI: Defaults(tcp_enabled=False, hooks_enabled=False, persistent=False),
}

# The settings an environment's defaults stand in for, with the Defaults field of each.
SETTINGS = (("ipc.tcp_enabled", "tcp_enabled"), ("hooks.enabled", "hooks_enabled"),
            ("identity.persistent", "persistent"))


@dataclass(frozen=True, slots=True)
class Effective:
    """The environment and what it made of the three settings it has defaults for."""

    kind: str
    reason: str
    tcp_enabled: bool
    hooks_enabled: bool
    persistent: bool
    changed: tuple[str, ...]     # settings left unset that differ from a host's default
    warnings: tuple[str, ...]    # log events the choices call for

    def view(self) -> dict[str, Any]:
        """As /v1/health and `daemon status --json` show it."""
        return {"kind": self.kind, "reason": self.reason, "tcp_enabled": self.tcp_enabled,
                "hooks_enabled": self.hooks_enabled, "persistent_keypair": self.persistent,
                "changed": list(self.changed)}


def settle(detected: Detected, explicit: Mapping[str, bool | None]) -> Effective:
    """Each of SETTINGS from ``explicit`` (by name) when set, else the environment's default."""
    defaults, host = DEFAULTS[detected.kind], DEFAULTS[HOST]
    values: dict[str, bool] = {}
    changed = []
    for name, attr in SETTINGS:
        given = explicit.get(name)
        values[attr] = getattr(defaults, attr) if given is None else given
        if given is None and getattr(defaults, attr) != getattr(host, attr):
            changed.append(name)
    warnings = ((WARN_PERSISTENT_IN_CI,)
                if detected.kind == CI and explicit.get("identity.persistent") else ())
    return Effective(detected.kind, detected.reason, values["tcp_enabled"],
                     values["hooks_enabled"], values["persistent"], tuple(changed), warnings)
