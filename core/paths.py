"""Where the daemon keeps its files (pure: computed from the environment it is given).

``TIDEMESH_HOME=DIR`` puts everything for mesh M under ``DIR/daemon/M/`` so tests and several
daemons never collide. Without it the XDG base directories are used: config, data, state
(logs) and runtime (socket, token, port, lock) each get a ``tidemesh/daemon/M`` folder.
Without XDG_RUNTIME_DIR the runtime folder is under ``/tmp/tidemesh-UID``, which another
user could make first: the daemon and the clients check it (``core.ownership``).

A mesh name becomes a folder name, so it must fit ``NAME`` (``check_name``) before any path
is built from it: ``daemon_paths`` refuses any other, whichever way the name came in (an
invite, a backup bundle, ``--mesh``, the environment, the broker). Session names keep to the
same pattern; topic and queue names have the wire's, which holds no ``/`` and no leading dot.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tidemesh.core.errors import InvalidName, InvalidRequest

DEFAULT_MESH = "default"
# The one pattern of a name that becomes a path part: no separator, no leading dot (so never
# "." or ".."), nothing a unit name or a shell would trip on, short enough for sun_path.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
NAME_RULE = ("1-64 characters: letters, digits, '.', '_', '-', starting with a letter or "
             "digit")

# sun_path is 108 bytes on Linux and 104 on macOS, counting the terminating NUL.
MAX_SOCKET_PATH = 103


@dataclass(frozen=True, slots=True)
class DaemonPaths:
    config_dir: Path
    data_dir: Path
    state_dir: Path
    runtime_dir: Path
    # The folder the runtime folder's chain starts from: XDG_RUNTIME_DIR, its /tmp fallback
    # or TIDEMESH_HOME. It and each folder below it must be private to the user (ownership).
    runtime_base: Path | None = None

    @property
    def runtime_chain_base(self) -> Path:
        return self.runtime_base if self.runtime_base is not None else self.runtime_dir

    @property
    def config_file(self) -> Path:
        return self.config_dir / "daemon.toml"

    @property
    def hooks_dir(self) -> Path:
        return self.config_dir / "hooks"

    @property
    def socket(self) -> Path:
        return self.runtime_dir / "sock"

    @property
    def token_file(self) -> Path:
        return self.runtime_dir / "local_token"

    @property
    def port_file(self) -> Path:
        return self.runtime_dir / "http.port"

    @property
    def lock_file(self) -> Path:
        return self.runtime_dir / "daemon.lock"

    @property
    def log_file(self) -> Path:
        return self.state_dir / "daemon.log"

    @property
    def revoked_file(self) -> Path:
        return self.data_dir / "revoked.json"

    @property
    def keypair(self) -> Path:
        return self.data_dir / "keypair.json"

    @property
    def keypair_archive(self) -> Path:
        """Rotated-out X25519 keys kept for their grace period (daemon rotate-keypair)."""
        return self.data_dir / "keypair-archive.json"

    @property
    def keypair_pending(self) -> Path:
        """The new key of a rotation under way; gone once it is finished or rolled back."""
        return self.data_dir / "keypair-pending.json"

    @property
    def ephemeral_keypair(self) -> Path:
        # An ephemeral member's key (CI): beside the socket, never in the data folder.
        return self.runtime_dir / "keypair.ephemeral.json"

    @property
    def host_fingerprint(self) -> Path:
        return self.data_dir / "host_fingerprint.json"

    @property
    def outbox_db(self) -> Path:
        return self.data_dir / "outbox.db"

    @property
    def inbox_db(self) -> Path:
        return self.data_dir / "inbox.db"

    @property
    def mesh_file(self) -> Path:
        return self.data_dir / "mesh.json"

    @property
    def folders(self) -> set[Path]:
        return {self.config_dir, self.data_dir, self.state_dir, self.runtime_dir,
                self.hooks_dir}


def is_name(name: object) -> bool:
    return isinstance(name, str) and NAME.fullmatch(name) is not None


def check_name(name: object, what: str = "mesh", field: str = "mesh") -> str:
    """``name`` when it fits ``NAME``; else ``InvalidName`` naming it (and the field)."""
    if not is_name(name):
        raise InvalidName(f"{what} name {name!r} is not a valid name: a {what} name is "
                          f"{NAME_RULE}", name=name if isinstance(name, str) else repr(name),
                          field=field)
    return str(name)


def daemon_paths(mesh: str, environ: Mapping[str, str]) -> DaemonPaths:
    check_name(mesh)   # before any path: a name is a folder name here
    home = environ.get("TIDEMESH_HOME")
    if home:
        root = Path(home).expanduser()
        base = root / "daemon" / mesh
        return DaemonPaths(base, base, base, base, root)
    user_home = Path(environ.get("HOME", "~")).expanduser()
    xdg = {
        "config": environ.get("XDG_CONFIG_HOME") or str(user_home / ".config"),
        "data": environ.get("XDG_DATA_HOME") or str(user_home / ".local" / "share"),
        "state": environ.get("XDG_STATE_HOME") or str(user_home / ".local" / "state"),
        "runtime": environ.get("XDG_RUNTIME_DIR") or f"/tmp/tidemesh-{os.getuid()}",  # noqa: S108
    }
    sub = Path("tidemesh") / "daemon" / mesh
    return DaemonPaths(
        Path(xdg["config"]) / sub,
        Path(xdg["data"]) / sub,
        Path(xdg["state"]) / sub,
        Path(xdg["runtime"]) / sub,
        Path(xdg["runtime"]),
    )


def socket_path_problem(path: Path) -> str | None:
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        return (
            f"socket path {path} is {len(os.fsencode(path))} bytes, over the "
            f"{MAX_SOCKET_PATH}-byte limit of Unix sockets; set TIDEMESH_HOME (or "
            "XDG_RUNTIME_DIR) to a shorter folder"
        )
    return None


def meshes_dir(environ: Mapping[str, str]) -> Path:
    """The folder holding one data folder per mesh (each joined one has a ``mesh.json``)."""
    return daemon_paths(DEFAULT_MESH, environ).data_dir.parent


def fleet_config_file(environ: Mapping[str, str]) -> Path:
    """The user's fleet settings (core.fleet): one file for all meshes, beside their
    folders: ``$TIDEMESH_HOME/fleet.toml``, else ``$XDG_CONFIG_HOME/tidemesh/fleet.toml``."""
    home = environ.get("TIDEMESH_HOME")
    if home:
        return Path(home).expanduser() / "fleet.toml"
    return daemon_paths(DEFAULT_MESH, environ).config_dir.parent.parent / "fleet.toml"


def runtimes_dir(environ: Mapping[str, str]) -> Path:
    """The folder holding one runtime folder (socket, lock) per mesh."""
    return daemon_paths(DEFAULT_MESH, environ).runtime_dir.parent


class MeshNotChosen(InvalidRequest):
    code = "mesh_not_chosen"


def choose_mesh(asked: str | None, joined: Sequence[str]) -> str:
    """Which mesh a command means: the one asked for (``--mesh``, ``TIDEMESH_DAEMON_MESH``);
    else the only joined mesh; else ``default``, when it is joined or nothing is. With
    several joined and none asked for, guessing could send to the wrong mesh, so it refuses."""
    if asked:
        return check_name(asked)
    if len(joined) == 1:
        return joined[0]
    if not joined or DEFAULT_MESH in joined:
        return DEFAULT_MESH
    raise MeshNotChosen(f"several meshes are joined ({', '.join(sorted(joined))}); "
                        "say which with --mesh or TIDEMESH_DAEMON_MESH")
