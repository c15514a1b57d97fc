"""``keypair-archive.json``: the bound of 8 keys, expiry, opening DMs with archived keys
and the quarantine of a malformed file (real files, real crypto)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from nacl.signing import SigningKey

from tidemesh.core.sealing import UnsealError, seal
from tidemesh.daemon.membership import keyarchive
from tidemesh.daemon.membership.keyarchive import DAY_MS, MAX_KEYS, Archive, ArchivedKey, StaleKey

NOW = 1_800_000_000_000


def _pub(key: SigningKey) -> str:
    return bytes(key.verify_key).hex()


def test_a_ninth_key_force_expires_the_oldest_and_a_key_is_archived_once() -> None:
    archive, keys = Archive(), [SigningKey.generate() for _ in range(MAX_KEYS + 1)]
    for i, k in enumerate(keys[:MAX_KEYS]):
        archive, forced = keyarchive.add(archive, ArchivedKey.of(k, NOW + i, 7))
        assert forced == []
    again, forced = keyarchive.add(archive, ArchivedKey.of(keys[0], NOW + 99, 7))
    assert (again, forced) == (archive, [])
    archive, forced = keyarchive.add(archive, ArchivedKey.of(keys[-1], NOW + 50, 7))
    assert [k.ed25519_pubkey for k in forced] == [_pub(keys[0])]
    assert len(archive.keys) == MAX_KEYS and archive.holds(_pub(keys[-1]))


def test_expire_drops_keys_past_their_grace() -> None:
    a = ArchivedKey.of(SigningKey.generate(), NOW, 1)
    b = ArchivedKey.of(SigningKey.generate(), NOW, 7)
    kept, gone = keyarchive.expire(Archive((a, b)), NOW + 2 * DAY_MS)
    assert (kept.keys, gone) == ((b,), [a])


def test_a_dm_to_the_old_key_opens_in_the_grace_and_is_stale_after() -> None:
    sender, old, new = SigningKey.generate(), SigningKey.generate(), SigningKey.generate()
    sealed = seal(sender, _pub(old), "c1", b"secret", "utf8")
    archive = Archive((ArchivedKey.of(old, NOW, 7),))
    opened, from_archive = keyarchive.open_dm(new, archive, NOW + DAY_MS, _pub(sender),
                                              _pub(old), sealed)
    assert (opened.body, from_archive) == (b"secret", True)
    with pytest.raises(StaleKey, match="grace period"):
        keyarchive.open_dm(new, archive, NOW + 8 * DAY_MS, _pub(sender), _pub(old), sealed)
    # Sealed to the current key: opened with it, the archive untouched.
    mine = seal(sender, _pub(new), "c2", b"now", "utf8")
    assert keyarchive.open_dm(new, archive, NOW, _pub(sender), _pub(new), mine)[1] is False
    # Garbage to the current key is undecryptable, not stale.
    with pytest.raises(UnsealError) as info:
        keyarchive.open_dm(new, archive, NOW, _pub(sender), _pub(new), b"x" * 64)
    assert not isinstance(info.value, StaleKey)


def test_the_file_is_private_round_trips_and_a_malformed_one_is_moved_aside(
        tmp_path: Path) -> None:
    path = tmp_path / "keypair-archive.json"
    assert keyarchive.load(path) == Archive()
    archive = Archive((ArchivedKey.of(SigningKey.generate(), NOW, 7),))
    keyarchive.save(path, archive)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    data = json.loads(path.read_text())
    assert (data["schema_version"], data["max_archived_keys"]) == (1, MAX_KEYS)
    assert keyarchive.load(path) == archive
    data["keys"].append(dict(data["keys"][0]))          # one key_id twice
    path.write_text(json.dumps(data))
    assert keyarchive.load(path) == Archive()
    assert not path.exists()
    [aside] = tmp_path.glob("keypair-archive.json.malformed-*")
    assert json.loads(aside.read_text())["keys"][0]["key_id"] == archive.keys[0].key_id


def test_cleanup_deletes_expired_keys_from_the_file(tmp_path: Path) -> None:
    path = tmp_path / "keypair-archive.json"
    short = ArchivedKey.of(SigningKey.generate(), NOW, 1)
    long = ArchivedKey.of(SigningKey.generate(), NOW, 7)
    keyarchive.save(path, Archive((short, long)))
    assert keyarchive.cleanup(path, NOW + 2 * DAY_MS) == [short]
    assert keyarchive.load(path).keys == (long,)
    assert keyarchive.cleanup(path, NOW + 2 * DAY_MS) == []


def test_a_daemon_with_a_malformed_archive_moves_it_aside_and_starts(short_tmp: Path) -> None:
    from tests.daemon.harness import start_daemon
    from tidemesh.core.paths import daemon_paths

    paths = daemon_paths("t", {"TIDEMESH_HOME": str(short_tmp)})
    paths.data_dir.mkdir(parents=True, mode=0o700)
    paths.keypair_archive.write_text('{"schema_version": 1, "keys": [{"key_id": 1}]}')
    d = start_daemon(short_tmp)
    try:
        assert d.client.request("GET", "/v1/health").status == 200
        assert not paths.keypair_archive.exists()
        [aside] = paths.data_dir.glob("keypair-archive.json.malformed-*")
        assert "key_id" in aside.read_text()
        assert "key_archive_quarantined" in d.log.read_text()
    finally:
        assert d.stop() == 0
