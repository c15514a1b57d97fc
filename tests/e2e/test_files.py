"""Shared files between two daemons through a real broker, on each store: share, list and get;
a DM's file sealed (the store holds no plaintext); a changed chunk refused on get; kill -9 of
either daemon mid-transfer, each resumed, the file arriving once and byte-identical; the size
limit as a 413 naming its setting."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import sqlite3
import stat
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from tests.daemon.harness import RunningDaemon, daemon_env, run_cli
from tests.e2e.harness import Mesh, connected, inbox, pubkey, wait_for
from tests.e2e.test_hooks import add_with_hooks
from tidemesh.core.errors import Conflict, InsufficientStorage, TidemeshError
from tidemesh.core.files import FileIntegrityError, FileTooLarge

pytestmark = pytest.mark.timeout(180)
CHUNK = 16384
SMALL = {"TIDEMESH_FILES_CHUNK_BYTES": str(CHUNK), "TIDEMESH_FILES_WINDOW": "4"}
# One chunk in flight: a transfer slow enough to be cut in its middle on a fast machine too.
ONE_BY_ONE = {**SMALL, "TIDEMESH_FILES_WINDOW": "1"}


def _blob(path: Path, size: int, seed: int = 1) -> bytes:
    data = hashlib.shake_256(seed.to_bytes(4, "big")).digest(size)
    path.write_bytes(data)
    return data


async def _pair(mesh: Mesh, root: Path, env: dict[str, str] = SMALL
                ) -> tuple[RunningDaemon, RunningDaemon]:
    a, b = mesh.add("a", root, env), mesh.add("b", root, env)
    await wait_for(lambda: connected(a))
    await wait_for(lambda: connected(b))
    b.client.membership("topic", "subscribe", "ops", create=True)
    return a, b


async def _announced(d: RunningDaemon, file_id: str) -> dict[str, Any]:
    def seen() -> dict[str, Any] | None:
        return next((f for f in d.client.file_list()["files"]
                     if f["id"] == file_id and f["direction"] == "received"), None)

    await wait_for(seen)
    found = seen()
    assert found is not None
    return found


async def _store(mesh: Mesh, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    """Rows of the broker's store, read (or written) beside the running broker."""
    store = mesh.broker.store
    if store.startswith("sqlite://"):
        conn = sqlite3.connect(store.removeprefix("sqlite://"), timeout=10)
        try:
            rows = conn.execute(sql.replace("mesh.", ""), args).fetchall()
            conn.commit()
            return rows
        finally:
            conn.close()
    pg = await asyncpg.connect(store)
    try:
        return [tuple(r) for r in await pg.fetch(re.sub(r"\?(\d)", r"$\1", sql), *args)]
    finally:
        await pg.close()


async def test_share_list_get_and_a_retried_share_is_one(any_mesh: Mesh, short_tmp: Path
                                                         ) -> None:
    a, b = await _pair(any_mesh, short_tmp)
    assert "files" in a.client.version()["ipc_features"]
    src = short_tmp / "report.bin"
    data = _blob(src, 5 * CHUNK + 123)
    shared = a.client.file_share(src, "topic:ops", message="the report")
    fid = shared["file"]["id"]
    assert shared["file"]["chunks"] == 6 and shared["sent_chunks"] == 6
    assert shared["file"]["sealed"] is False
    got = await _announced(b, fid)
    assert got["message"] == "the report" and got["from"] == pubkey(a)
    assert got["sha256"] == hashlib.sha256(data).hexdigest()

    out = short_tmp / "got.bin"
    answer = b.client.file_get(fid, out)
    assert out.read_bytes() == data and answer["resumed_from"] == 0
    assert b"".join(b.client.file_stream(fid)) == data   # no out: the bytes themselves
    assert f'cm_daemon_file_bytes_total{{direction="sent"}} {float(len(data))}' in \
        a.client.metrics()
    assert f'cm_daemon_file_bytes_total{{direction="received"}} {float(2 * len(data))}' in \
        b.client.metrics()

    again = a.client.file_share(src, "topic:ops", message="the report")
    assert again["file"]["id"] == fid
    assert again["resumed_from"] == 6 and again["sent_chunks"] == 0
    await asyncio.sleep(0.5)
    entries = [e for e in await inbox(b) if (e["meta"] or {}).get("tidemesh_file")]
    assert len(entries) == 1
    assert [f["direction"] for f in a.client.file_list()["files"]] == ["shared"]


async def test_a_dm_file_is_sealed_in_the_store(any_mesh: Mesh, short_tmp: Path) -> None:
    a, b = await _pair(any_mesh, short_tmp)
    src = short_tmp / "secret.bin"
    data = _blob(src, 3 * CHUNK + 7, seed=2)
    shared = a.client.file_share(src, f"dm:{pubkey(b)}")
    fid = shared["file"]["id"]
    assert shared["file"]["sealed"] is True
    rows = await _store(any_mesh, "SELECT seq, data FROM mesh.file_chunk WHERE file_id = ?1"
                        " ORDER BY seq", fid)
    assert len(rows) == 4
    for seq, sealed in rows:
        plain = data[seq * CHUNK:(seq + 1) * CHUNK]
        assert bytes(sealed) != plain and plain[:64] not in bytes(sealed)
        assert len(sealed) == len(plain) + 16
    await _announced(b, fid)
    out = short_tmp / "opened.bin"
    b.client.file_get(fid, out)
    assert out.read_bytes() == data


async def test_a_changed_chunk_fails_the_get_and_writes_nothing(any_mesh: Mesh,
                                                                short_tmp: Path) -> None:
    a, b = await _pair(any_mesh, short_tmp)
    src = short_tmp / "data.bin"
    _blob(src, 4 * CHUNK, seed=3)
    fid = a.client.file_share(src, "topic:ops")["file"]["id"]
    await _announced(b, fid)
    rows = await _store(any_mesh, "SELECT data FROM mesh.file_chunk WHERE file_id = ?1"
                        " AND seq = 2", fid)
    changed = bytearray(rows[0][0])
    changed[100] ^= 0xFF
    await _store(any_mesh, "UPDATE mesh.file_chunk SET data = ?1 WHERE file_id = ?2"
                 " AND seq = 2", bytes(changed), fid)
    out = short_tmp / "bad.bin"
    with pytest.raises(FileIntegrityError) as err:
        b.client.file_get(fid, out)
    assert "SHA-256" in err.value.message
    assert not out.exists() and not list(short_tmp.glob("bad.bin.part*"))


async def test_a_file_over_the_limit_is_refused_naming_it(any_mesh: Mesh,
                                                          short_tmp: Path) -> None:
    any_mesh.broker.stop()
    any_mesh.broker.env["TIDEMESH_FILES_MAX_BYTES"] = "50000"
    any_mesh.broker.start()
    a, _ = await _pair(any_mesh, short_tmp)
    src = short_tmp / "big.bin"
    _blob(src, 50001)
    with pytest.raises(FileTooLarge) as err:
        a.client.file_share(src, "topic:ops")
    assert "files.max_bytes" in err.value.message and err.value.details["limit"] == 50000
    assert FileTooLarge.http_status == 413


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """``fn`` running on a thread; what it returned or raised lands in the list."""
    result: list[Any] = []

    def run() -> None:
        try:
            result.append(fn())
        except (TidemeshError, OSError) as exc:
            result.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, result


BIG = 6 << 20   # 384 chunks of 16 KiB: long enough to be cut in the middle


async def test_kill_9_of_the_sender_mid_upload_resumes(any_mesh: Mesh, short_tmp: Path
                                                       ) -> None:
    a, b = await _pair(any_mesh, short_tmp, ONE_BY_ONE)
    src = short_tmp / "large.bin"
    data = _blob(src, BIG, seed=4)
    chunks = BIG // CHUNK
    t, _ = _in_thread(lambda: a.client.file_share(src, "topic:ops"))

    async def partly_stored() -> bool:
        rows = await _store(any_mesh, "SELECT stored_chunks FROM mesh.file_object")
        return bool(rows) and 0 < rows[0][0] < chunks // 2

    await wait_for(partly_stored, interval=0.01)
    a.kill()
    t.join(10)
    held = (await _store(any_mesh, "SELECT stored_chunks FROM mesh.file_object"))[0][0]
    assert 0 < held < chunks

    a = any_mesh.restart("a")
    await wait_for(lambda: connected(a))
    shared = a.client.file_share(src, "topic:ops")
    assert shared["resumed_from"] >= held and shared["sent_chunks"] == chunks - shared[
        "resumed_from"]
    fid = shared["file"]["id"]
    await _announced(b, fid)
    out = short_tmp / "large.out"
    b.client.file_get(fid, out)
    assert out.read_bytes() == data
    await asyncio.sleep(0.5)
    assert len([e for e in await inbox(b) if (e["meta"] or {}).get("tidemesh_file")]) == 1


async def test_a_cli_share_cut_by_a_daemon_kill_says_running_it_again_resumes(
        mesh: Mesh, short_tmp: Path) -> None:
    a, _ = await _pair(mesh, short_tmp, ONE_BY_ONE)
    src = short_tmp / "large.bin"
    _blob(src, BIG, seed=6)
    share = subprocess.Popen(
        [sys.executable, "-m", "tidemesh", "file", "share", str(src), "--to", "topic:ops",
         "--mesh", "m"], env=daemon_env(a.home), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)

    async def partly_stored() -> bool:
        rows = await _store(mesh, "SELECT stored_chunks FROM mesh.file_object")
        return bool(rows) and 0 < rows[0][0] < BIG // CHUNK // 2

    await wait_for(partly_stored, interval=0.01)
    a.kill()
    _, err = share.communicate(timeout=30)
    assert share.returncode == 3, err
    assert "daemon up" in err and "run the same `tidemesh file share` again" in err, err


async def test_kill_9_of_the_receiver_mid_download_resumes(any_mesh: Mesh, short_tmp: Path
                                                           ) -> None:
    a, b = await _pair(any_mesh, short_tmp, ONE_BY_ONE)
    src = short_tmp / "large.bin"
    data = _blob(src, BIG, seed=5)
    fid = a.client.file_share(src, "topic:ops")["file"]["id"]
    await _announced(b, fid)
    out = short_tmp / "large.out"
    part = short_tmp / "large.out.part"
    t, _ = _in_thread(lambda: b.client.file_get(fid, out))
    await wait_for(lambda: part.exists() and CHUNK * 4 < part.stat().st_size < BIG // 2,
                   interval=0.01)
    with pytest.raises(Conflict):   # a second get to the same path would spoil the first's
        b.client.file_get(fid, out)
    b.kill()
    t.join(10)
    assert not out.exists()
    written = part.stat().st_size
    # Both files left behind are private: the state names the plaintext's SHA-256 (#48 item 7).
    for left in (part, Path(f"{out}.part.json")):
        assert stat.S_IMODE(left.stat().st_mode) == 0o600, left

    b = any_mesh.restart("b")
    await wait_for(lambda: connected(b))
    answer = b.client.file_get(fid, out)
    assert answer["resumed_from"] >= written // CHUNK > 0
    assert out.read_bytes() == data
    assert not part.exists() and not os.path.exists(f"{out}.part.json")


async def test_the_cli_shares_lists_and_gets(mesh: Mesh, short_tmp: Path) -> None:
    a, b = await _pair(mesh, short_tmp)
    src = short_tmp / "notes.txt"
    src.write_text("minutes\n")
    res = run_cli(a.home, "file", "share", str(src), "--to", "topic:ops", "--mesh", "m",
                  "--message", "today", "--json")
    assert res.returncode == 0, res.stderr + res.stdout
    fid = json.loads(res.stdout)["file"]["id"]
    await _announced(b, fid)
    listed = run_cli(b.home, "file", "list", "--mesh", "m", "--json")
    assert [f["name"] for f in json.loads(listed.stdout)["files"]] == ["notes.txt"]
    out = short_tmp / "copy.txt"
    got = run_cli(b.home, "file", "get", fid, "--out", str(out), "--mesh", "m")
    assert got.returncode == 0, got.stderr + got.stdout
    assert out.read_text() == "minutes\n"
    # Without --out: the announced name, in the working folder.
    here = short_tmp / "downloads"
    here.mkdir()
    named = subprocess.run([sys.executable, "-m", "tidemesh", "file", "get", fid, "--mesh", "m"],
                           cwd=here, env=daemon_env(b.home), capture_output=True, text=True,
                           timeout=60, check=False)
    assert named.returncode == 0, named.stderr + named.stdout
    assert (here / "notes.txt").read_text() == "minutes\n"
    missing = run_cli(b.home, "file", "get", "f" * 32, "--out", str(out), "--mesh", "m")
    assert missing.returncode == 8 and "no file" in missing.stderr + missing.stdout


async def test_a_received_file_fires_on_file_share_with_the_file(mesh: Mesh, short_tmp: Path
                                                                 ) -> None:
    seen = short_tmp / "hook.json"
    a = mesh.add("a", short_tmp, SMALL)
    b = add_with_hooks(mesh, "b", short_tmp,
                       {"on-file-share": f"#!/bin/sh\ncat > {seen}\n"}, "[on-file-share]\n")
    await wait_for(lambda: connected(a))
    await wait_for(lambda: connected(b))
    src = short_tmp / "plan.txt"
    src.write_text("the plan\n")
    fid = a.client.file_share(src, f"dm:{pubkey(b)}", message="read me")["file"]["id"]
    await wait_for(lambda: seen.exists() and seen.stat().st_size > 0)
    event = json.loads(seen.read_text())
    assert (event["type"], event["hook"], event["id"]) == ("file_shared", "on-file-share", fid)
    assert event["name"] == "plan.txt" and event["message"] == "read me" and "key" not in event
    kinds = [e.type for e in b.client.events(0, idle_timeout=1.0)]
    assert kinds.index("file_shared") > kinds.index("message")


async def test_a_broker_restart_mid_upload_is_ridden_out_by_the_share(mesh: Mesh,
                                                                     short_tmp: Path) -> None:
    a, b = await _pair(mesh, short_tmp, ONE_BY_ONE)
    src = short_tmp / "large.bin"
    data = _blob(src, BIG, seed=6)
    t, result = _in_thread(lambda: a.client.file_share(src, "topic:ops"))

    async def partly_stored() -> bool:
        rows = await _store(mesh, "SELECT stored_chunks FROM mesh.file_object")
        return bool(rows) and 0 < rows[0][0] < BIG // CHUNK // 2

    await wait_for(partly_stored, interval=0.01)
    mesh.broker.kill()
    mesh.broker.start()
    t.join(60)
    shared = result[0]
    assert isinstance(shared, dict), shared
    assert shared["sent_chunks"] < BIG // CHUNK   # the part stored before the cut stayed
    await _announced(b, shared["file"]["id"])
    out = short_tmp / "large.out"
    b.client.file_get(shared["file"]["id"], out)
    assert out.read_bytes() == data


async def test_a_get_that_would_cross_the_disk_floor_is_507_and_fetches_nothing(
        mesh: Mesh, short_tmp: Path, small_fs: Path) -> None:
    a = mesh.add("a", short_tmp)
    b = mesh.add("b", small_fs, {"TIDEMESH_DISK_RESERVED_BYTES": str(30 << 20)})
    await wait_for(lambda: connected(a))
    await wait_for(lambda: connected(b))
    b.client.membership("topic", "subscribe", "ops", create=True)
    src = short_tmp / "big.bin"
    _blob(src, 20 << 20, seed=7)
    fid = a.client.file_share(src, "topic:ops")["file"]["id"]
    await _announced(b, fid)
    out = small_fs / "big.out"
    with pytest.raises(InsufficientStorage) as err:
        b.client.file_get(fid, out)
    assert "disk.reserved_bytes" in err.value.message
    assert not list(small_fs.glob("big.out*"))
