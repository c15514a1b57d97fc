"""``keypair-archive.json``: the X25519 halves of rotated-out member keys, kept for
``[crypto] key_grace_period_days`` so that DMs sealed to them before (or just after) a
rotation still open (docs/threat-model.md, "Key rotation").

The file: ``{"schema_version": 1, "max_archived_keys": 8, "keys": [{key_id, ed25519_pubkey,
x25519_pubkey, x25519_privkey, created_at, rotated_out_at, expires_at}]}``, 0600, written whole
(``private.write_atomically``). At most 8 keys: archiving a ninth force-expires the oldest.
An expired key is deleted from the file (no secure-delete promise: the file system may keep
old blocks). A file that does not parse is moved aside (``*.malformed-<time>``) and the
daemon goes on with an empty archive: DMs sealed to those keys then fail to open, each
saying so, which beats a member that cannot start.

``parse``/``add``/``expire``/``open_dm`` are pure; ``load``/``save`` touch the file.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import structlog
from nacl.public import PrivateKey
from nacl.signing import SigningKey

from tidemesh.core.sealing import Opened, UnsealError, unseal, unseal_with
from tidemesh.daemon.process.private import write_atomically

log = structlog.get_logger(__name__)
SCHEMA_VERSION = 1
MAX_KEYS = 8
DAY_MS = 86_400_000


class MalformedArchive(ValueError):
    """The archive file is not one this daemon can read."""


class StaleKey(UnsealError):
    """The DM was sealed to a rotated-out key whose grace period ended."""


@dataclass(frozen=True, slots=True)
class ArchivedKey:
    key_id: str              # the ed25519 public key's first 16 hex digits
    ed25519_pubkey: str
    x25519_pubkey: str
    x25519_privkey: str
    created_at: int          # ms: when the key was archived
    rotated_out_at: int
    expires_at: int

    @classmethod
    def of(cls, key: SigningKey, now_ms: int, grace_days: int) -> ArchivedKey:
        private = key.to_curve25519_private_key()
        pub = bytes(key.verify_key).hex()
        return cls(pub[:16], pub, bytes(private.public_key).hex(), bytes(private).hex(),
                   now_ms, now_ms, now_ms + grace_days * DAY_MS)

    def private(self) -> PrivateKey:
        return PrivateKey(bytes.fromhex(self.x25519_privkey))


@dataclass(frozen=True, slots=True)
class Archive:
    keys: tuple[ArchivedKey, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "max_archived_keys": MAX_KEYS,
                "keys": [asdict(k) for k in self.keys]}

    def holds(self, ed25519_pubkey: str) -> bool:
        return any(k.ed25519_pubkey == ed25519_pubkey for k in self.keys)

    def live(self, now_ms: int) -> list[ArchivedKey]:
        return [k for k in self.keys if k.expires_at > now_ms]


def parse(data: Any) -> Archive:
    """The archive in ``data`` (the file's JSON); ``MalformedArchive`` says what is wrong."""
    if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION:
        raise MalformedArchive("not a keypair archive of schema_version 1")
    raw = data.get("keys")
    if not isinstance(raw, list):
        raise MalformedArchive("keys is not a list")
    try:
        keys = tuple(ArchivedKey(**k) for k in raw)
        for k in keys:
            PrivateKey(bytes.fromhex(k.x25519_privkey))
            if not all(isinstance(v, int) for v in (k.created_at, k.rotated_out_at,
                                                    k.expires_at)):
                raise MalformedArchive(f"key {k.key_id} has a time that is not an integer")
    except (TypeError, ValueError) as exc:
        raise MalformedArchive(f"a key entry is malformed: {exc}") from exc
    if len({k.key_id for k in keys}) != len(keys):
        raise MalformedArchive("two entries have one key_id")
    return Archive(keys)


def add(archive: Archive, key: ArchivedKey) -> tuple[Archive, list[ArchivedKey]]:
    """``archive`` with ``key`` (once: archiving it again changes nothing), and the oldest
    keys it force-expired to stay within ``MAX_KEYS``."""
    if archive.holds(key.ed25519_pubkey):
        return archive, []
    keys = sorted((*archive.keys, key), key=lambda k: (k.rotated_out_at, k.key_id))
    forced = keys[:-MAX_KEYS] if len(keys) > MAX_KEYS else []
    return Archive(tuple(keys[len(forced):])), forced


def expire(archive: Archive, now_ms: int) -> tuple[Archive, list[ArchivedKey]]:
    """The archive without its keys past their grace, and those keys."""
    gone = [k for k in archive.keys if k.expires_at <= now_ms]
    return Archive(tuple(k for k in archive.keys if k.expires_at > now_ms)), gone


def open_dm(current: SigningKey, archive: Archive, now_ms: int, sender: str, ref: str,
            sealed: bytes) -> tuple[Opened, bool]:
    """Open a DM with the current key first, then each archived key in its grace; the bool
    says an archived key opened it. A DM addressed to a key that is neither the current one
    nor a live archived one raises ``StaleKey``, naming why."""
    try:
        return unseal(current, sender, sealed), False
    except UnsealError as first:
        for k in archive.live(now_ms):
            try:
                return unseal_with(k.private(), sender, sealed), True
            except UnsealError:
                continue
        if ref != bytes(current.verify_key).hex():
            raise StaleKey(
                f"sealed to the rotated-out key {ref[:16]}…, whose grace period "
                "([crypto] key_grace_period_days) ended or which is not in "
                "keypair-archive.json: it cannot be opened any more") from first
        raise


def load(path: Path) -> Archive:
    """The archive on disk; none is an empty one, a malformed one is moved aside."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return Archive()
    try:
        return parse(json.loads(text))
    except (json.JSONDecodeError, MalformedArchive) as exc:
        aside = path.with_name(f"{path.name}.malformed-{int(time.time())}")
        path.rename(aside)
        log.error("key_archive_quarantined", path=str(path), moved_to=str(aside),
                  error=str(exc), hint="DMs sealed to the keys it held cannot be opened; "
                  "restore the file from a backup to open them")
        return Archive()


def save(path: Path, archive: Archive) -> None:
    write_atomically(path, json.dumps(archive.to_json(), indent=2).encode("utf-8"))


def cleanup(path: Path, now_ms: int) -> list[ArchivedKey]:
    """Delete the archived keys past their grace (the daily sweep and ``daemon
    archive-cleanup``); returns them."""
    archive, gone = expire(load(path), now_ms)
    if gone:
        save(path, archive)
        for k in gone:
            log.info("archived_key_expired", key_id=k.key_id, expires_at=k.expires_at)
    return gone


def summary(keys: Sequence[ArchivedKey]) -> list[dict[str, Any]]:
    """What a report shows of archived keys: never the private half."""
    return [{"key_id": k.key_id, "ed25519_pubkey": k.ed25519_pubkey,
             "rotated_out_at": k.rotated_out_at, "expires_at": k.expires_at} for k in keys]
