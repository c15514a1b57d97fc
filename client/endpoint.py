"""Where a daemon listens and how to authenticate to it (pure: no connection is opened).

A daemon has two listeners (docs/ipc.md): its Unix socket, gated by the socket's mode and
needing no token, and loopback TCP, needing ``Authorization: Bearer <local_token>``. The
token is read from its file at each request, so a client made before the daemon first
started (which writes the file) still works.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from tidemesh.client.errors import DaemonNotRunning
from tidemesh.core.paths import choose_mesh, daemon_paths, meshes_dir

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True, slots=True)
class Endpoint:
    socket_path: Path | None = None
    port: int | None = None
    token_file: Path | None = None
    mesh: str | None = None
    # The daemon's record that this member was revoked (core.paths); its presence changes
    # what "nothing answers" tells the caller to do.
    revoked_file: Path | None = None

    def __post_init__(self) -> None:
        if (self.socket_path is None) == (self.port is None):
            raise ValueError("give either socket_path or port (with token_file), not both")
        if self.port is not None and self.token_file is None:
            raise ValueError("a TCP endpoint needs token_file (the daemon's local_token)")

    @classmethod
    def for_mesh(cls, mesh: str | None = None, *, tcp: bool = False,
                 environ: Mapping[str, str] | None = None) -> Endpoint:
        """The mesh's daemon, found as the CLI finds it (TIDEMESH_HOME, else XDG folders);
        without a name, the mesh the CLI would choose (``default_mesh``)."""
        env = os.environ if environ is None else environ
        mesh = mesh or default_mesh(env)
        paths = daemon_paths(mesh, env)
        if not tcp:
            return cls(socket_path=paths.socket, mesh=mesh, revoked_file=paths.revoked_file)
        try:
            port = int(paths.port_file.read_text("ascii").strip())
        except (OSError, ValueError) as exc:
            raise _not_running(f"no daemon publishes a TCP port in {paths.port_file}", mesh,
                               paths.revoked_file) from exc
        return cls(port=port, token_file=paths.token_file, mesh=mesh,
                   revoked_file=paths.revoked_file)

    @property
    def where(self) -> str:
        return str(self.socket_path) if self.socket_path else f"{LOOPBACK}:{self.port}"

    @property
    def base_url(self) -> str:
        return "http://localhost" if self.socket_path else f"http://{LOOPBACK}:{self.port}"

    def headers(self) -> dict[str, str]:
        """Authentication for this listener: none on the socket, the bearer token on TCP."""
        if self.token_file is None:
            return {}
        try:
            token = self.token_file.read_text("ascii").strip()
        except OSError as exc:
            raise _not_running(f"cannot read the daemon's token {self.token_file}: {exc}",
                               self.mesh, self.revoked_file) from exc
        return {"Authorization": f"Bearer {token}"}

    def not_running(self, exc: BaseException) -> DaemonNotRunning:
        """The one error for "nothing answers here", with how to start a daemon."""
        if isinstance(exc, FileNotFoundError | ConnectionRefusedError):
            what = f"no daemon answers on {self.where}"
        else:
            what = f"the daemon on {self.where} did not answer: {str(exc) or type(exc).__name__}"
        return _not_running(what, self.mesh, self.revoked_file)


def _not_running(what: str, mesh: str | None, revoked_file: Path | None) -> DaemonNotRunning:
    if revoked_file is not None and revoked_file.exists():
        return DaemonNotRunning(what, revoked=True, hint="tidemesh daemon join NEW_INVITE"
                                + (f" --mesh {mesh}" if mesh and mesh != "default" else ""))
    return DaemonNotRunning(what, hint=start_hint(mesh))


class Located:
    """How both clients are made: where the daemon is, and how long one call may take."""

    def __init__(self, socket_path: str | Path | None = None, *, port: int | None = None,
                 token_file: str | Path | None = None, mesh: str | None = None,
                 timeout: float = 10.0) -> None:
        self.endpoint = Endpoint(Path(socket_path) if socket_path is not None else None, port,
                                 Path(token_file) if token_file is not None else None, mesh)
        self.timeout = timeout

    @classmethod
    def for_mesh(cls, mesh: str | None = None, *, tcp: bool = False, timeout: float = 10.0,
                 environ: Mapping[str, str] | None = None) -> Self:
        """The daemon of ``mesh`` on this host (``TIDEMESH_HOME``, else the XDG folders);
        without a name, the mesh the CLI would choose: the only joined one (``default_mesh``)."""
        e = Endpoint.for_mesh(mesh, tcp=tcp, environ=environ)
        located = cls(e.socket_path, port=e.port, token_file=e.token_file, mesh=e.mesh,
                      timeout=timeout)
        located.endpoint = e   # with the revocation record's path
        return located


def joined_meshes(environ: Mapping[str, str] | None = None) -> list[str]:
    """The meshes this user has joined on this host, by name."""
    root = meshes_dir(os.environ if environ is None else environ)
    try:
        return sorted(d.name for d in root.iterdir() if (d / "mesh.json").is_file())
    except OSError:
        return []


def default_mesh(environ: Mapping[str, str] | None = None) -> str:
    """``TIDEMESH_DAEMON_MESH``, else the only joined mesh, else ``default``; several joined
    and none named is ``MeshNotChosen``."""
    env = os.environ if environ is None else environ
    return choose_mesh(env.get("TIDEMESH_DAEMON_MESH"), joined_meshes(env))


def start_hint(mesh: str | None) -> str:
    return "tidemesh daemon up" + (f" --mesh {mesh}" if mesh and mesh != "default" else "")
