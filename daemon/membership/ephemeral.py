"""An ephemeral member (a daemon in CI, spec §16): its key lives as long as the daemon.

``daemon join`` in an ephemeral environment writes the new key to the runtime folder
(``keypair.ephemeral.json``), never to the data folder. The daemon that starts claims it
(writes its pid into it). When that daemon stops (SIGTERM, `daemon down`) it leaves the mesh
at the broker (``member_leave``, as `daemon leave` does) and removes the key and
``mesh.json``; the next job joins again with its invite. A key still claimed when a daemon
starts was left by one that was killed (kill -9, OOM): that start leaves and removes it
first, so a runner keeps no mesh identity beyond a job and the broker keeps no member of it
when it can be reached.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import structlog
from nacl.signing import SigningKey

from tidemesh.core.environment import Effective
from tidemesh.core.errors import Unavailable
from tidemesh.core.paths import DaemonPaths
from tidemesh.daemon.membership import identity
from tidemesh.daemon.membership.departure import leave_broker
from tidemesh.daemon.membership.join import MeshConfig, bound_to
from tidemesh.daemon.process import config, environment

log = structlog.get_logger("tidemesh.daemon")

# How long leaving the mesh may take when a daemon stops or cleans up after a killed one.
LEAVE_TIMEOUT_S = 5.0


def environment_of(paths: DaemonPaths, environ: Mapping[str, str],
                   persistent: bool | None = None, kind: str | None = None) -> Effective:
    """The environment a daemon of these paths would run in (its daemon.toml, ``environ``,
    a --persistent/--ephemeral flag, an --environment flag): `daemon join` makes the key the
    daemon will use, `daemon up` checks it could link with it."""
    settings, _ = config.load(config.read_file(paths.config_file), environ,
                              {"identity.persistent": persistent, "environment.kind": kind})
    return environment.effective(settings, environ)


def link_refusal(paths: DaemonPaths, run_pubkey: str | None) -> str | None:
    """Why an ephemeral daemon running with ``run_pubkey`` (None: a fresh key) could never
    reach the broker of its joined mesh, or None. Such a daemon would serve, accept sends and
    call itself healthy while no broker knows its key, so it is not started: the reason names
    the way out."""
    mesh = bound_to(paths)
    if mesh is None or mesh.member_pubkey == run_pubkey:
        return None
    kept = _persistent_pubkey(paths)
    if kept == mesh.member_pubkey:
        return (f"mesh {mesh.mesh} was joined with a persistent key (`daemon join "
                "--persistent`), and this daemon is ephemeral (CI, or identity.persistent = "
                "false): it would run with a fresh key the broker does not know; start it with "
                "--persistent to use the joined key, or join again without --persistent")
    return (f"this ephemeral daemon's key is not the member key of mesh {mesh.mesh} "
            "(mesh.json); run `tidemesh daemon join INVITE` in this environment (it makes the "
            "ephemeral key), then start the daemon")


def start_refusal(paths: DaemonPaths, persistent: bool) -> str | None:
    """``link_refusal`` for a daemon not started yet: the key it would take (``take``)."""
    if persistent:
        return None
    try:
        found = identity.load_ephemeral(paths.ephemeral_keypair)
    except (ValueError, KeyError):
        found = None
    if found is not None and found.claimed_by is not None:
        # A killed daemon's key: the start retires it (and mesh.json with it) first.
        return None
    return link_refusal(paths, found.keypair.public_hex if found is not None else None)


def _persistent_pubkey(paths: DaemonPaths) -> str | None:
    """The public half of the data folder's key, if one is there and readable."""
    try:
        return str(json.loads(paths.keypair.read_text(encoding="utf-8"))["ed25519_public"])
    except (OSError, ValueError, KeyError):
        return None


async def retire_leftover(paths: DaemonPaths, why: str) -> dict[str, Any] | None:
    """Retire the ephemeral key found in the runtime folder, if any (daemon stopped)."""
    found = identity.load_ephemeral(paths.ephemeral_keypair)
    return None if found is None else await retire(paths, found.keypair, why)


def take(paths: DaemonPaths) -> tuple[identity.EphemeralKey | None, identity.Keypair]:
    """The leftover key of a killed daemon (to retire first), and the key to run with: the
    one `daemon join` left unclaimed, now claimed; else a new one kept in memory only (not a
    member of any mesh: nothing to clean up)."""
    try:
        found = identity.load_ephemeral(paths.ephemeral_keypair)
    except (ValueError, KeyError) as exc:
        # Half a key (a disk filled mid-write) identifies nobody: nothing to leave with.
        log.warning("ephemeral_keypair_unreadable", path=str(paths.ephemeral_keypair),
                    error=str(exc))
        paths.ephemeral_keypair.unlink(missing_ok=True)
        found = None
    if found is not None and found.claimed_by is None:
        identity.save_ephemeral(paths.ephemeral_keypair, found.keypair.signing_key,
                                claimed_by=os.getpid())
        return None, found.keypair
    return found, identity.Keypair(SigningKey.generate())


async def retire(paths: DaemonPaths, key: identity.Keypair, why: str,
                 timeout_s: float = LEAVE_TIMEOUT_S) -> dict[str, Any]:
    """Remove the key file (and mesh.json when ``key`` is the joined member), then leave the
    mesh with the key held in memory. Logs ``ephemeral_identity_removed``; a broker that
    cannot be reached is said (``left: false``): the key must not outlive the job whatever
    happens, so the files go first (a stop cut short by the watchdog still removed them)."""
    mesh = bound_to(paths)
    joined = mesh is not None and mesh.member_pubkey == key.public_hex
    outcome: dict[str, Any] = {"pubkey": key.public_hex, "why": why, "left": False}
    with contextlib.suppress(FileNotFoundError):
        paths.ephemeral_keypair.unlink()
    if joined:
        assert mesh is not None
        paths.mesh_file.unlink(missing_ok=True)
        outcome.update(await _leave(mesh, key, timeout_s))
        _record_left(paths, key.public_hex, why)
    log.info("ephemeral_identity_removed", **outcome)
    if joined and not outcome["left"] and "already" not in outcome:
        log.warning("ephemeral_member_not_left", pubkey=key.public_hex,
                    hint="the broker could not be reached; the member stays until an "
                         "operator runs `tidemesh broker member revoke`")
    return outcome


async def _leave(mesh: MeshConfig, key: identity.Keypair, timeout_s: float) -> dict[str, Any]:
    try:
        answer = await leave_broker(mesh, key.signing_key, timeout_s)
    except Unavailable as exc:
        return {"left": False, "error": exc.message}
    return {"left": bool(answer.get("left", True)), **{k: v for k, v in answer.items()
                                                        if k == "already"}}


def _record_left(paths: DaemonPaths, pubkey: str, why: str) -> None:
    """Say, beside where mesh.json was, that this mesh's ephemeral member left: a later send
    then explains why nothing is joined instead of naming the default mesh's socket."""
    with contextlib.suppress(OSError):
        left_file(paths).write_text(json.dumps(
            {"pubkey": pubkey, "why": why, "left_at": int(time.time() * 1000)}))


def left_file(paths: DaemonPaths) -> Path:
    return paths.mesh_file.with_name("left.json")


def left_record(paths: DaemonPaths) -> dict[str, Any] | None:
    """What ``_record_left`` wrote, if this mesh is not joined again since."""
    if paths.mesh_file.exists():
        return None
    try:
        found = json.loads(left_file(paths).read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None
