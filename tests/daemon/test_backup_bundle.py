"""The backup bundle's format without a daemon: it opens with its passphrase only, and a
wrong passphrase, a damaged or truncated file and a newer schema each raise their own
error. The KDF runs at libsodium's minimum here to keep the tests fast; the CLI's strength
is tested end to end in tests/e2e/test_backup.py."""

from __future__ import annotations

import json

import nacl.pwhash
import pytest

from tidemesh.daemon.offline import backup

FAST = {"ops": nacl.pwhash.argon2id.OPSLIMIT_MIN, "mem": nacl.pwhash.argon2id.MEMLIMIT_MIN}
CONTENTS = {"schema_version": backup.SCHEMA_VERSION, "mesh": "m", "member_pubkey": "ab"}


def _sealed() -> bytes:
    return backup.seal(dict(CONTENTS), b"passphrase", **FAST)


def test_a_bundle_opens_with_its_passphrase_and_holds_no_clear_text() -> None:
    data = _sealed()
    assert b'"mesh"' not in data
    assert backup.unseal(data, b"passphrase") == CONTENTS


def test_each_kind_of_bad_bundle_has_its_own_error() -> None:
    data = _sealed()
    with pytest.raises(backup.WrongPassphrase):
        backup.unseal(data, b"not the passphrase")
    for damaged in (data[:-1], data[:-20] + b"\0" * 20, data[:30], b"", b"junk\n" + data):
        with pytest.raises(backup.BackupDamaged):
            backup.unseal(damaged, b"passphrase")
    head, sealed = data[len(backup.MAGIC):].split(b"\n", 1)
    header = json.loads(head)
    header["schema_version"] = backup.SCHEMA_VERSION + 1
    newer = backup.MAGIC + json.dumps(header).encode() + b"\n" + sealed
    with pytest.raises(backup.BackupTooNew, match="newer tidemesh"):
        backup.unseal(newer, b"passphrase")
    header["schema_version"] = backup.SCHEMA_VERSION
    header["memlimit"] = 1 << 40              # would make restore allocate a terabyte
    costly = backup.MAGIC + json.dumps(header).encode() + b"\n" + sealed
    with pytest.raises(backup.BackupDamaged, match="out of range"):
        backup.unseal(costly, b"passphrase")


def test_a_short_passphrase_is_refused() -> None:
    with pytest.raises(backup.BackupError, match="at least 8"):
        backup.seal(dict(CONTENTS), b"short", **FAST)
