"""Where a daemon listens and how to authenticate to it (pure: no connection is opened).

A daemon has two listeners (docs/ipc.md): its Unix socket, gated by the socket's mode and
needing no token, and loopback TCP, needing ``Authorization: Bearer <local_token>``. A
client reads the token from its file when it first needs it (so one made before the daemon
first started still works) and again after a 401: `daemon rotate-token` replaced it.

Before a request is sent, the socket (or the token and port files) and the folders they are
in must belong to this user (``core.ownership``): another user who made the runtime folder
first could otherwise listen in the daemon's place. A refusal is ``NotPrivate``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from tidemesh.client.errors import DaemonNotRunning
from tidemesh.core.ownership import NotPrivate, chain_problem, socket_problem, token_problem
from tidemesh.core.paths import choose_mesh, daemon_paths, is_name, meshes_dir

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True, slots=True)
class Endpoint:
    socket_path: Path | None = None
    port: int | None = None
    token_file: Path | None = None
    mesh: str | None = None
    # Where the folders that must be private start (the runtime base); None: only the
    # folder of the socket or token itself.
    private_from: Path | None = None
    # The daemon's record that this member was revoked (core.paths); its presence changes
    # what "nothing answers" tells the caller to do.
    revoked_file: Path | None = None
    # Where the daemon publishes its TCP port (found by mesh): a restarted daemon picks a new
    # one (ipc.http_port = 0), which ``moved`` reads again.
    port_file: Path | None = None

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
        base = paths.runtime_chain_base
        if not tcp:
            return cls(socket_path=paths.socket, mesh=mesh, private_from=base,
                       revoked_file=paths.revoked_file)
        _check_folders(base, paths.runtime_dir)
        try:
            port = int(paths.port_file.read_text("ascii").strip())
        except (OSError, ValueError) as exc:
            raise _not_running(f"no daemon publishes a TCP port in {paths.port_file}", mesh,
                               paths.revoked_file) from exc
        return cls(port=port, token_file=paths.token_file, mesh=mesh, private_from=base,
                   revoked_file=paths.revoked_file, port_file=paths.port_file)

    def moved(self) -> Endpoint | None:
        """This endpoint at the port its daemon publishes now, when that is another one (the
        daemon restarted); None when it has not moved or cannot be read."""
        if self.port_file is None:
            return None
        try:
            port = int(self.port_file.read_text("ascii").strip())
        except (OSError, ValueError):
            return None
        return None if port == self.port else dataclasses.replace(self, port=port)

    @property
    def where(self) -> str:
        return str(self.socket_path) if self.socket_path else f"{LOOPBACK}:{self.port}"

    @property
    def base_url(self) -> str:
        return "http://localhost" if self.socket_path else f"http://{LOOPBACK}:{self.port}"

    def check_socket(self) -> None:
        """Raise ``NotPrivate`` unless the socket and its folders are this user's. A missing
        socket passes: connecting then says that no daemon answers."""
        path = self.socket_path
        if path is None:
            return
        _check_folders(self.private_from or path.parent, path.parent)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise NotPrivate(f"cannot check the daemon's socket {path}: {exc}") from exc
        if problem := socket_problem(path, st, os.geteuid()):
            raise NotPrivate(f"refusing to talk to {path}: {problem}", socket=str(path))

    def headers(self) -> dict[str, str]:
        """Authentication for this listener, the token read from its file now."""
        token = self.read_token()
        return {} if token is None else {"Authorization": f"Bearer {token}"}

    def read_token(self) -> str | None:
        """The bearer token from its file; None on the socket, which needs none. A token
        file that is not this user's with mode 0600 is refused (``NotPrivate``)."""
        if self.token_file is None:
            return None
        _check_folders(self.private_from or self.token_file.parent, self.token_file.parent)
        try:
            fd = os.open(self.token_file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as exc:
            raise _not_running(f"cannot read the daemon's token {self.token_file}: {exc}",
                               self.mesh, self.revoked_file) from exc
        with os.fdopen(fd, "rb") as f:
            if problem := token_problem(self.token_file, os.fstat(fd), os.geteuid()):
                raise NotPrivate(f"refusing the daemon's token: {problem}",
                                 token_file=str(self.token_file))
            return f.read(4096).decode("ascii", "replace").strip()

    def not_running(self, exc: BaseException) -> DaemonNotRunning:
        """The one error for "nothing answers here", with how to start a daemon."""
        if isinstance(exc, FileNotFoundError | ConnectionRefusedError):
            what = f"no daemon answers on {self.where}"
        else:
            what = f"the daemon on {self.where} did not answer: {str(exc) or type(exc).__name__}"
        return _not_running(what, self.mesh, self.revoked_file)


def _not_running(what: str, mesh: str | None, revoked_file: Path | None) -> DaemonNotRunning:
    if revoked_file is not None and revoked_file.exists():
        return DaemonNotRunning(what, revoked=True,
                                hint="tidemesh daemon join NEW_INVITE --move-aside"
                                + (f" --mesh {mesh}" if mesh and mesh != "default" else ""))
    return DaemonNotRunning(what, hint=start_hint(mesh))


def _check_folders(base: Path, leaf: Path) -> None:
    if not os.path.lexists(leaf):
        return   # nothing there: the connection will say that no daemon answers
    if problem := chain_problem(base, leaf):
        raise NotPrivate(f"refusing the daemon's runtime folder: {problem}", folder=str(leaf))


class Located:
    """How both clients are made: where the daemon is, and how long one call may take."""

    def __init__(self, socket_path: str | Path | None = None, *, port: int | None = None,
                 token_file: str | Path | None = None, mesh: str | None = None,
                 timeout: float = 10.0) -> None:
        self.endpoint = Endpoint(Path(socket_path) if socket_path is not None else None, port,
                                 Path(token_file) if token_file is not None else None, mesh)
        self.timeout = timeout
        self._token: str | None = None

    def auth_headers(self, fresh: bool = False) -> dict[str, str]:
        """Authentication for this listener: none on the socket, the bearer token on TCP,
        read from its file on first use and again when ``fresh`` (after a 401)."""
        if self.endpoint.token_file is None:
            return {}
        if fresh or self._token is None:
            self._token = self.endpoint.read_token()
        return {"Authorization": f"Bearer {self._token}"}

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
    """The meshes this user has joined on this host, by name (a folder whose name is no
    mesh name was not made by a join: left out, as daemon_paths would refuse it)."""
    root = meshes_dir(os.environ if environ is None else environ)
    try:
        return sorted(d.name for d in root.iterdir()
                      if is_name(d.name) and (d / "mesh.json").is_file())
    except OSError:
        return []


def default_mesh(environ: Mapping[str, str] | None = None) -> str:
    """``TIDEMESH_DAEMON_MESH``, else the only joined mesh, else ``default``; several joined
    and none named is ``MeshNotChosen``."""
    env = os.environ if environ is None else environ
    return choose_mesh(env.get("TIDEMESH_DAEMON_MESH"), joined_meshes(env))


def start_hint(mesh: str | None) -> str:
    return "tidemesh daemon up" + (f" --mesh {mesh}" if mesh and mesh != "default" else "")
