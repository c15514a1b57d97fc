"""``daemon rotate-keypair``: the member moves to a new ed25519 key (and so a new X25519 key),
as a small recorded state machine that a crash at any step leaves recoverable
(docs/operations.md, "A key leaked: rotate it").

The steps, each recorded on disk before the next one starts:

1. ``pending_written``: the new key goes to ``keypair-pending.json`` (0600, atomic);
2. ``broker_rotated``: the broker learns it in one ``key_rotate`` signed by both keys
   (idempotent: asking again after a lost answer hears ``already``);
3. ``archived``: the old key's X25519 half goes to ``keypair-archive.json`` for the grace;
4. ``promoted``: ``keypair.json`` holds the new key, then ``mesh.json`` names it;
5. ``done``: the pending file is removed.

Until step 2 commits the broker knows only the old key, after it only the new one: the member
always has exactly one working key. Whoever finds a pending file (the next ``rotate-keypair``
or ``daemon up``) decides with ``next_action`` from what is on disk and which key the broker
accepts a hello from: a rotation the broker made is finished; one it never saw is carried on
by ``rotate-keypair`` and rolled back by ``daemon up``. ``next_action`` is pure; ``Rotation``
does the I/O. The daemon is stopped throughout (the CLI stops it first): its key signs every
hello and seals every DM in the outbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import structlog
from nacl.signing import SigningKey

from tidemesh.core import features, handshake
from tidemesh.core.errors import Conflict, NotJoined, TidemeshError, Unavailable
from tidemesh.core.failover import BrokerRotation
from tidemesh.core.paths import DaemonPaths
from tidemesh.daemon.link.dial import dial_first
from tidemesh.daemon.link.websocket import BrokerLink, HandshakeRejected, LinkError
from tidemesh.daemon.membership import identity, keyarchive
from tidemesh.daemon.membership.join import MeshConfig
from tidemesh.storage.lock import AlreadyRunning, InstanceLock

log = structlog.get_logger(__name__)
SCHEMA_VERSION = 1
ROTATED_OUT = "key_rotated_out"


class Knows(StrEnum):
    """Which of the two keys the broker accepts a hello from."""

    UNASKED = "unasked"
    NEW = "new"
    OLD = "old"
    NEITHER = "neither"           # both refused: rotated to a third key, or revoked
    UNREACHABLE = "unreachable"


class Action(StrEnum):
    PROBE = "probe"               # ask the broker which key it knows
    ROTATE = "rotate"             # send key_rotate
    ARCHIVE = "archive"           # the old key's X25519 half into the archive
    PROMOTE = "promote"           # keypair.json and mesh.json name the new key
    CLEAR = "clear"               # finished: the pending file goes
    ROLL_BACK = "roll_back"       # the broker never learned the new key: the pending file goes
    WAIT = "wait"                 # undecided while the broker cannot be reached
    LOST = "lost"                 # the broker accepts neither key
    DONE = "done"                 # nothing pending


@dataclass(frozen=True, slots=True)
class State:
    """What decides the next step: the files, and what the broker said (``Knows``)."""

    pending_new: str | None       # the pending file's new key, None when there is none
    current: str                  # keypair.json's key
    mesh_pubkey: str              # mesh.json's member_pubkey
    archived_old: bool            # the archive holds the pending file's old key
    broker: Knows = Knows.UNASKED
    forward: bool = True          # rotate-keypair carries a rotation on; daemon up rolls back


def next_action(s: State) -> Action:
    if s.pending_new is None:
        return Action.DONE
    if s.current == s.pending_new:      # promoted: only mesh.json and the pending file left
        return Action.PROMOTE if s.mesh_pubkey != s.pending_new else Action.CLEAR
    return {
        Knows.UNASKED: Action.PROBE,
        Knows.NEW: Action.PROMOTE if s.archived_old else Action.ARCHIVE,
        Knows.OLD: Action.ROTATE if s.forward else Action.ROLL_BACK,
        Knows.NEITHER: Action.LOST,
        Knows.UNREACHABLE: Action.WAIT,
    }[s.broker]


@dataclass(frozen=True, slots=True)
class Pending:
    old_pubkey: str
    new_key: SigningKey
    started_at: int

    @property
    def new_pubkey(self) -> str:
        return bytes(self.new_key.verify_key).hex()

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "old_pubkey": self.old_pubkey,
                "new_pubkey": self.new_pubkey, "new_seed": bytes(self.new_key).hex(),
                "started_at": self.started_at}

    @classmethod
    def of_json(cls, data: dict[str, Any]) -> Pending:
        if data.get("schema_version") != SCHEMA_VERSION:
            raise TidemeshError("keypair-pending.json has an unknown schema_version")
        return cls(data["old_pubkey"], SigningKey(bytes.fromhex(data["new_seed"])),
                   int(data["started_at"]))


def reached(step: str) -> None:
    """Each recorded step; the crash tests stop the process here (tests/daemon/rigged_daemon)."""
    log.info("key_rotation_step", step=step)


def pending_dms(paths: DaemonPaths) -> int:
    """Outbox DMs not yet answered by the broker: sealed by the old key, they would reach
    their recipients from the new one, which cannot open them."""
    if not paths.outbox_db.exists():
        return 0
    conn = sqlite3.connect(f"file:{paths.outbox_db}?mode=ro", uri=True)
    try:
        row = conn.execute("SELECT COUNT(*) FROM outbox WHERE dest_kind = 'dm'"
                           " AND status IN ('pending', 'inflight')").fetchone()
    finally:
        conn.close()
    return int(row[0])


class Rotation:
    """One run of the state machine over a stopped daemon's files."""

    def __init__(self, paths: DaemonPaths, grace_days: int, timeout_s: float = 20.0,
                 forward: bool = True) -> None:
        self.paths = paths
        self.grace_days = grace_days
        self.timeout_s = timeout_s
        self.forward = forward
        self.mesh = MeshConfig.load(paths.mesh_file)
        self.report: dict[str, Any] = {"mesh": self.mesh.mesh, "resumed": False}

    # -- the files ------------------------------------------------------------------------

    def pending(self) -> Pending | None:
        try:
            data = json.loads(self.paths.keypair_pending.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        return Pending.of_json(data)

    def state(self, broker: Knows) -> State:
        pending = self.pending()
        current, _ = identity.load_or_create_keypair(self.paths.keypair)
        mesh_pubkey = json.loads(self.paths.mesh_file.read_text(encoding="utf-8"))[
            "member_pubkey"]
        archived = pending is not None and keyarchive.load(
            self.paths.keypair_archive).holds(pending.old_pubkey)
        return State(pending.new_pubkey if pending else None, current.public_hex, mesh_pubkey,
                     archived, broker, self.forward)

    def begin(self) -> None:
        """Record a new key as pending (step 1), unless a rotation is pending already."""
        if self.pending() is not None:
            self.report["resumed"] = True
            return
        waiting = pending_dms(self.paths)
        if waiting:
            raise Conflict(f"{waiting} DMs wait in the outbox, sealed with the current key; "
                           "start the daemon until `tidemesh outbox` shows them sent, then "
                           "rotate (sent after the rotation, their recipients could not open "
                           "them)", reason="dms_pending")
        current, _ = identity.load_or_create_keypair(self.paths.keypair)
        pending = Pending(current.public_hex, SigningKey.generate(), _now_ms())
        identity.write_private(self.paths.keypair_pending, pending.to_json())
        reached("pending_written")

    # -- the run --------------------------------------------------------------------------

    async def run(self) -> Action:
        """Carry the machine on until it is done or cannot go on; the last action."""
        broker = Knows.UNASKED
        while True:
            s = self.state(broker)
            action = next_action(s)
            log.info("key_rotation_action", action=str(action), broker=str(broker))
            if action in (Action.DONE, Action.WAIT, Action.LOST):
                return action
            broker = await self._do(action, broker)
            if action in (Action.CLEAR, Action.ROLL_BACK):
                return action

    async def _do(self, action: Action, broker: Knows) -> Knows:
        pending = self.pending()
        assert pending is not None
        if action is Action.PROBE:
            return await self._probe(pending)
        if action is Action.ROTATE:
            return await self._rotate(pending)
        if action is Action.ARCHIVE:
            self._archive(pending)
            reached("archived")
        elif action is Action.PROMOTE:
            self._promote(pending)
        elif action is Action.CLEAR:
            self.paths.keypair_pending.unlink()
            self.report.update(old_pubkey=pending.old_pubkey, new_pubkey=pending.new_pubkey)
            log.info("key_rotated", old_pubkey=pending.old_pubkey,
                     new_pubkey=pending.new_pubkey)
            reached("done")
        elif action is Action.ROLL_BACK:
            self.paths.keypair_pending.unlink()
            self.report.update(rolled_back=True, pubkey=pending.old_pubkey)
            log.warning("key_rotation_rolled_back", old_pubkey=pending.old_pubkey,
                        hint="the broker never learned the new key; the old one stays. "
                             "Run `tidemesh daemon rotate-keypair` again to rotate")
        return broker

    async def _connect(self, key: SigningKey) -> BrokerLink:
        return await asyncio.wait_for(
            dial_first(BrokerRotation.of(self.mesh.broker_urls), self.mesh.mesh_id, key),
            self.timeout_s)

    async def _probe(self, pending: Pending) -> Knows:
        """Which key the broker accepts: the new one first (then nothing is left to ask)."""
        old, _ = identity.load_or_create_keypair(self.paths.keypair)
        for key, knows in ((pending.new_key, Knows.NEW), (old.signing_key, Knows.OLD)):
            try:
                link = await self._connect(key)
            except HandshakeRejected:
                continue
            except (LinkError, TimeoutError, OSError) as exc:
                log.warning("key_rotation_broker_unreachable", error=str(exc))
                return Knows.UNREACHABLE
            with contextlib.suppress(Exception):
                await link.close()
            return knows
        return Knows.NEITHER

    async def _rotate(self, pending: Pending) -> Knows:
        """Step 2: ``key_rotate`` over a session of the old key."""
        old, _ = identity.load_or_create_keypair(self.paths.keypair)
        try:
            link = await self._connect(old.signing_key)
        except HandshakeRejected as exc:
            # Rotated out meanwhile (our own earlier attempt): ask which key it knows.
            return Knows.UNASKED if exc.reason == ROTATED_OUT else Knows.NEITHER
        except (LinkError, TimeoutError, OSError) as exc:
            raise Unavailable(f"cannot reach the mesh's broker to rotate the key: {exc}; "
                              "nothing changed there (run rotate-keypair again)") from exc
        try:
            if features.KEY_ROTATION not in link.supported:
                raise Unavailable(f"the broker at {link.url} does not support key rotation "
                                  f"(feature {features.KEY_ROTATION} missing); upgrade it. "
                                  "Nothing changed", reason="feature_unavailable")
            signed = handshake.sign_rotation(old.signing_key, pending.new_key,
                                             self.mesh.mesh_id)
            answer = await asyncio.wait_for(link.rotate_key(signed), self.timeout_s)
        except (LinkError, TimeoutError) as exc:
            # The broker may have committed: the next run asks it which key it knows.
            raise Unavailable(f"the broker did not confirm the rotation: {exc}; run "
                              "rotate-keypair again to finish it") from exc
        finally:
            with contextlib.suppress(Exception):
                await link.close()
        if answer.get("type") == "error":
            err = answer["error"]
            raise Conflict(f"the broker refused the rotation: {err.get('code')}: "
                           f"{err.get('message')}", reason=err.get("reason"))
        self.report["broker"] = {k: v for k, v in answer.items()
                                 if k not in ("type", "id", "old_pubkey", "new_pubkey")}
        reached("broker_rotated")
        return Knows.NEW

    def _archive(self, pending: Pending) -> None:
        """Step 3: the old key's X25519 half into the archive, for the grace period."""
        old, _ = identity.load_or_create_keypair(self.paths.keypair)
        assert old.public_hex == pending.old_pubkey
        entry = keyarchive.ArchivedKey.of(old.signing_key, _now_ms(), self.grace_days)
        archive, forced = keyarchive.add(keyarchive.load(self.paths.keypair_archive), entry)
        keyarchive.save(self.paths.keypair_archive, archive)
        for k in forced:
            log.warning("archived_key_force_expired", key_id=k.key_id,
                        max_archived_keys=keyarchive.MAX_KEYS)
        self.report.update(archived=keyarchive.summary([entry])[0],
                           force_expired=keyarchive.summary(forced))

    def _promote(self, pending: Pending) -> None:
        """Step 4: keypair.json, then mesh.json, name the new key."""
        current, _ = identity.load_or_create_keypair(self.paths.keypair)
        if current.public_hex != pending.new_pubkey:
            identity.save_keypair(self.paths.keypair, pending.new_key)
            reached("promoted")
        data = json.loads(self.paths.mesh_file.read_text(encoding="utf-8"))
        data["member_pubkey"] = pending.new_pubkey
        identity.write_private(self.paths.mesh_file, data)
        reached("mesh_updated")


def _now_ms() -> int:
    return int(time.time() * 1000)


def rotate(paths: DaemonPaths, grace_days: int, timeout_s: float = 20.0) -> dict[str, Any]:
    """``daemon rotate-keypair`` (the daemon stopped): a new key, or a pending rotation
    finished; the report says what moved."""
    if not paths.mesh_file.exists() or not paths.keypair.exists():
        raise NotJoined("this mesh is not joined here (no mesh.json and keypair): nothing "
                        "to rotate")
    # Held throughout: a `daemon up` meanwhile would settle the same pending file.
    lock = InstanceLock(paths.lock_file, "a daemon (or a key rotation) for this mesh")
    paths.runtime_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        lock.acquire()
    except AlreadyRunning as exc:
        raise Conflict(f"{exc}; stop it first (`tidemesh daemon down`)") from exc
    try:
        rotation = Rotation(paths, grace_days, timeout_s, forward=True)
        rotation.begin()
        last = asyncio.run(rotation.run())
    finally:
        lock.release()
    if last is Action.WAIT:
        raise Unavailable("the broker cannot be reached; the rotation stays pending (the old "
                          "key works until the broker learns the new one): run "
                          "rotate-keypair again")
    if last is Action.LOST:
        raise Conflict("the broker accepts neither the old nor the new key (revoked, or "
                       "rotated elsewhere): see docs/operations.md, A key leaked")
    return rotation.report


def settle_at_start(paths: DaemonPaths, grace_days: int, timeout_s: float = 10.0) -> Action:
    """At ``daemon up``: finish a rotation the broker made, roll back one it never saw.
    WAIT when the broker cannot be reached (the daemon does not start then: it could not
    know which key to use)."""
    if not paths.keypair_pending.exists() or not paths.mesh_file.exists():
        return Action.DONE
    rotation = Rotation(paths, grace_days, timeout_s, forward=False)
    return asyncio.run(rotation.run())

