"""``daemon backup`` / ``daemon restore``: a member's identity and configuration (with its
``hooks/`` folder: ``backup_hooks``) in one file sealed with a passphrase (Argon2id, then
XSalsa20-Poly1305: PyNaCl's ``pwhash`` and ``SecretBox``).

The file is a clear header line (format, KDF limits, salt, schema version, sha256 of the
sealed part) and the sealed JSON. The checksum tells a damaged or truncated file apart from
a wrong passphrase (both fail the MAC); the clear schema version lets a too-new file be
refused before any key is derived. A bundle never holds the outbox or inbox (DESIGN §11).

``seal``/``unseal`` are pure; ``collect``/``restore`` read and write the daemon's files.
Restore decides everything before it writes anything, and writes each file atomically (0600).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nacl.exceptions
import nacl.pwhash
import nacl.secret
import nacl.utils
from nacl.signing import SigningKey

import tidemesh
from tidemesh.core.errors import (
    BackupDamaged,
    BackupError,
    BackupTooNew,
    RestoreRefused,
    WrongPassphrase,
)
from tidemesh.core.paths import DaemonPaths, check_name
from tidemesh.daemon.membership import identity
from tidemesh.daemon.offline import backup_hooks
from tidemesh.daemon.process.private import write_atomically
from tidemesh.daemon.store import inbox as inbox_sql
from tidemesh.daemon.store.db import INBOX_MIGRATIONS

MAGIC = b"TIDEMESH-BACKUP\n"
# 2: the bundle carries hooks/ (backup_hooks); an older tidemesh refuses it as too new
# rather than restore a host without its pre-send veto. Version 1 bundles still restore.
SCHEMA_VERSION = 2
FORMAT = 1
# The archive of rotated-out keys (issue #27 item 1); carried when present.
ARCHIVE_FILE = "keypair-archive.json"
# Strong enough for a file that may sit on someone else's disk: 256 MiB, 3 passes.
OPSLIMIT = nacl.pwhash.argon2id.OPSLIMIT_MODERATE
MEMLIMIT = nacl.pwhash.argon2id.MEMLIMIT_MODERATE
# A header longer than this is not ours: refuse before parsing it.
_MAX_HEADER = 4096
_MIN_PASSPHRASE = 8


def check_passphrase(passphrase: bytes) -> None:
    if len(passphrase) < _MIN_PASSPHRASE:
        raise BackupError(f"the passphrase must be at least {_MIN_PASSPHRASE} bytes")


def _key(passphrase: bytes, salt: bytes, ops: int, mem: int) -> bytes:
    return bytes(nacl.pwhash.argon2id.kdf(nacl.secret.SecretBox.KEY_SIZE, passphrase, salt,
                                          opslimit=ops, memlimit=mem))


def seal(contents: dict[str, Any], passphrase: bytes, ops: int = OPSLIMIT,
         mem: int = MEMLIMIT) -> bytes:
    """The bundle file's bytes for ``contents``."""
    check_passphrase(passphrase)
    salt = nacl.utils.random(nacl.pwhash.argon2id.SALTBYTES)
    box = nacl.secret.SecretBox(_key(passphrase, salt, ops, mem))
    sealed = bytes(box.encrypt(json.dumps(contents, sort_keys=True).encode()))
    header = {"format": FORMAT, "schema_version": contents["schema_version"], "kdf": "argon2id",
              "opslimit": ops, "memlimit": mem, "salt": salt.hex(),
              "sha256": hashlib.sha256(sealed).hexdigest()}
    return MAGIC + json.dumps(header, sort_keys=True).encode() + b"\n" + sealed


def unseal(data: bytes, passphrase: bytes) -> dict[str, Any]:
    """The contents of a bundle, or the error that says which of damaged, too new or wrong
    passphrase it is."""
    if not data.startswith(MAGIC):
        raise BackupDamaged("not a tidemesh backup (its first line is not the backup marker); "
                            "the file may be damaged or truncated")
    rest = data[len(MAGIC):]
    end = rest.find(b"\n", 0, _MAX_HEADER)
    if end < 0:
        raise BackupDamaged("the backup's header is damaged or truncated")
    try:
        header = json.loads(rest[:end])
        schema, ops, mem = (int(header["schema_version"]), int(header["opslimit"]),
                            int(header["memlimit"]))
        salt, digest = bytes.fromhex(header["salt"]), str(header["sha256"])
        fmt = int(header["format"])
    except (ValueError, KeyError, TypeError) as exc:
        raise BackupDamaged(f"the backup's header is damaged: {exc}") from None
    if schema > SCHEMA_VERSION or fmt > FORMAT:
        raise BackupTooNew(f"this backup has schema version {schema} (format {fmt}); this "
                           f"tidemesh ({tidemesh.__version__}) reads up to {SCHEMA_VERSION}: "
                           "restore it with a newer tidemesh", schema_version=schema)
    # A file from elsewhere must not make restore spend more than the strongest setting
    # libsodium names (1 GiB, 4 passes) before the passphrase is even tried.
    if not (ops <= nacl.pwhash.argon2id.OPSLIMIT_SENSITIVE
            and mem <= nacl.pwhash.argon2id.MEMLIMIT_SENSITIVE
            and ops >= nacl.pwhash.argon2id.OPSLIMIT_MIN
            and mem >= nacl.pwhash.argon2id.MEMLIMIT_MIN
            and len(salt) == nacl.pwhash.argon2id.SALTBYTES):
        raise BackupDamaged("the backup's header names key-derivation limits out of range")
    sealed = rest[end + 1:]
    if hashlib.sha256(sealed).hexdigest() != digest:
        raise BackupDamaged("the backup is damaged or truncated (its checksum does not match)")
    try:
        plain = nacl.secret.SecretBox(_key(passphrase, salt, ops, mem)).decrypt(sealed)
    except nacl.exceptions.CryptoError:
        raise WrongPassphrase("wrong passphrase: the backup does not open with it") from None
    contents: dict[str, Any] = json.loads(plain)
    if int(contents.get("schema_version", 0)) != schema:
        raise BackupDamaged("the backup's sealed schema version differs from its header")
    return contents


# -- the daemon's files ------------------------------------------------------------------------


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None


def _text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None


def _memberships(db: Path) -> list[dict[str, Any]]:
    """Topic subscriptions and queue memberships as this host knows them (read-only)."""
    if not db.exists():
        return []
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return [{"kind": kind, **row} for kind in ("topic", "queue")
                for row in inbox_sql.memberships(conn, kind)]
    except sqlite3.DatabaseError:
        return []   # an unreadable inbox holds nothing a backup needs: the broker knows these
    finally:
        conn.close()


def collect(paths: DaemonPaths, mesh: str) -> dict[str, Any]:
    """What a backup holds, read from the daemon's files (a running daemon is fine)."""
    keypair = _json(paths.keypair)
    if keypair is None:
        raise BackupError(f"mesh {mesh} has no keypair at {paths.keypair}: nothing to back up")
    return {
        "schema_version": SCHEMA_VERSION,
        "created_at": int(time.time() * 1000),
        "tidemesh_version": tidemesh.__version__,
        "mesh": mesh,
        "member_pubkey": keypair.get("ed25519_public"),
        "keypair": keypair,
        "keypair_archive": _json(paths.data_dir / ARCHIVE_FILE),
        "host_fingerprint": _json(paths.host_fingerprint),
        "mesh_config": _json(paths.mesh_file),
        "daemon_config": _text(paths.config_file),
        "hooks": backup_hooks.collect(paths.hooks_dir),
        "subscriptions": _memberships(paths.inbox_db),
    }


@dataclass(frozen=True, slots=True)
class Restored:
    mesh: str
    member_pubkey: str
    written: list[str]
    host_adopted: bool
    subscriptions: int


def mesh_of(contents: dict[str, Any]) -> str:
    """The bundle's mesh name, refused unless it fits ``core.paths.NAME``: a crafted bundle
    must not name a folder out of the home."""
    return check_name(contents.get("mesh"), field="bundle.mesh")


def _check(contents: dict[str, Any]) -> None:
    """Everything restore will write, checked before it writes anything."""
    mesh_of(contents)
    try:
        seed = bytes.fromhex(contents["keypair"]["ed25519_seed"])
        key = SigningKey(seed)
        if bytes(key.verify_key).hex() != contents["member_pubkey"]:
            raise BackupDamaged("the backup's keypair does not match its member key")
        for s in contents.get("subscriptions") or []:
            if s["kind"] not in ("topic", "queue") or not isinstance(s["name"], str):
                raise BackupDamaged("the backup's subscriptions are malformed")
    except (KeyError, TypeError, ValueError) as exc:
        raise BackupDamaged(f"the backup's contents are malformed: {exc!r}") from None


def restore(contents: dict[str, Any], paths: DaemonPaths, mesh: str, current_host: str,
            new_token: str | None = None) -> Restored:
    """Write the bundle into ``paths``: the same member, this host adopted, a new token.

    Refuses (writing nothing) where a keypair or mesh config already is: a restore never
    replaces an identity."""
    _check(contents)
    hooks = backup_hooks.checked(contents.get("hooks"))
    for existing in (paths.keypair, paths.mesh_file):
        if existing.exists():
            raise RestoreRefused(f"{existing} exists: restore writes only into a home without "
                                 "this mesh's identity (leave or reset it first)",
                                 path=str(existing))
    if (refused := backup_hooks.refusal(paths.hooks_dir, hooks)) is not None:
        raise refused
    for d in paths.folders:
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
    written = []
    identity.write_private(paths.keypair, contents["keypair"])
    written.append(paths.keypair.name)
    if contents.get("keypair_archive") is not None:
        identity.write_private(paths.data_dir / ARCHIVE_FILE, contents["keypair_archive"])
        written.append(ARCHIVE_FILE)
    old_host = (contents.get("host_fingerprint") or {}).get("fingerprint")
    identity.accept_host(paths.host_fingerprint, current_host)
    written.append(paths.host_fingerprint.name)
    if contents.get("mesh_config") is not None:
        identity.write_private(paths.mesh_file, contents["mesh_config"])
        written.append(paths.mesh_file.name)
    if contents.get("daemon_config") is not None:
        write_private_text(paths.config_file, contents["daemon_config"])
        written.append(paths.config_file.name)
    written += backup_hooks.write(paths.hooks_dir, hooks)
    subs = contents.get("subscriptions") or []
    if subs:
        _write_memberships(paths.inbox_db, subs)
        written.append(paths.inbox_db.name)
    write_private_text(paths.token_file, (new_token or secrets.token_urlsafe(32)) + "\n")
    written.append(paths.token_file.name)
    return Restored(mesh, contents["member_pubkey"], written, old_host != current_host,
                    len(subs))


def write_private_text(path: Path, text: str) -> None:
    """Write a 0600 text file atomically."""
    write_atomically(path, text.encode("utf-8"))


def write_private_bytes(path: Path, data: bytes) -> None:
    """Write a 0600 file atomically; the bundle's own output."""
    write_atomically(path, data)


def _write_memberships(db: Path, subs: list[dict[str, Any]]) -> None:
    """A new inbox holding only the memberships, built beside and renamed into place (a
    rollback journal, so the database is the one file renamed)."""
    tmp = db.with_name(db.name + f".tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.close(fd)
    try:
        conn = sqlite3.connect(tmp, isolation_level=None)
        try:
            INBOX_MIGRATIONS.apply_sqlite(conn)
            conn.execute("BEGIN IMMEDIATE")
            for s in subs:
                inbox_sql.membership_add(conn, s["kind"], s["name"], int(s.get("since") or 0))
            conn.execute("COMMIT")
        finally:
            conn.close()
        os.replace(tmp, db)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def make(paths: DaemonPaths, mesh: str, passphrase: bytes) -> tuple[bytes, dict[str, Any]]:
    """The sealed bundle and a summary of what it holds (for --json and the IPC answer)."""
    contents = collect(paths, mesh)
    return seal(contents, passphrase), summary(contents)


def summary(contents: dict[str, Any]) -> dict[str, Any]:
    return {"schema_version": contents["schema_version"], "mesh": contents["mesh"],
            "member_pubkey": contents["member_pubkey"], "created_at": contents["created_at"],
            "holds": sorted(k for k in ("keypair", "keypair_archive", "host_fingerprint",
                                        "mesh_config", "daemon_config", "hooks",
                                        "subscriptions")
                            if contents.get(k) not in (None, [])),
            "subscriptions": len(contents.get("subscriptions") or [])}


def encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")
