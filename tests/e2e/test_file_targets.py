"""A download into a folder another local user controls (issue #47 items 2 and 3): the
daemon (root here, as the probe found it) follows no link planted at ``OUT.part`` or
``OUT.part.json``, resumes from no partial file of theirs, replaces no target that is not a
regular file of its own, and answers a device, a folder or an over-long name with a 400
``unsafe_target`` naming it, nothing left beside it. The attacker is a real second Unix user
(``tests.security.test_local_user``'s probe). No test here lets root write to a real device:
the device is a node made in the test's folder."""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

import pytest

from tests.daemon.harness import RunningDaemon
from tests.e2e.harness import Mesh, connected, wait_for
from tests.e2e.test_files import SMALL, _announced, _blob
from tests.security.test_local_user import as_user, probe  # noqa: F401 (a fixture)
from tidemesh.core.targets import UnsafeTarget
from tidemesh.daemon.process.private import write_atomically

pytestmark = pytest.mark.timeout(120)
SECRET = b"root's own secret\n"


async def _shared(mesh: Mesh, root: Path) -> tuple[RunningDaemon, str, bytes]:
    a, b = mesh.add("a", root, SMALL), mesh.add("b", root, SMALL)
    await wait_for(lambda: connected(a))
    await wait_for(lambda: connected(b))
    b.client.membership("topic", "subscribe", "ops", create=True)
    data = _blob(root / "src.bin", 3 * 16384 + 5)
    fid = a.client.file_share(root / "src.bin", "topic:ops")["file"]["id"]
    await _announced(b, fid)
    return b, fid, data


def _their_folder(root: Path, user: pwd.struct_passwd) -> Path:
    """A folder the probe owns and writes (not sticky: the kernel's protected_symlinks does
    not apply), and a root-owned 0600 file the probe would like overwritten."""
    root.chmod(0o755)
    drop = root / "drop"
    drop.mkdir()
    os.chown(drop, user.pw_uid, user.pw_gid)
    return drop


def _victim(root: Path) -> Path:
    victim = root / "victim"
    victim.write_bytes(SECRET)
    victim.chmod(0o600)
    return victim


async def test_links_planted_at_the_part_files_are_not_followed(
        mesh: Mesh, short_tmp: Path, probe: pwd.struct_passwd) -> None:  # noqa: F811
    b, fid, data = await _shared(mesh, short_tmp)
    drop, victim = _their_folder(short_tmp, probe), _victim(short_tmp)
    out = drop / "OUT"
    as_user(probe, f"ln -s {victim} {out}.part && ln -s {victim} {out}.part.json")
    b.client.file_get(fid, out)
    assert victim.read_bytes() == SECRET
    assert out.read_bytes() == data
    st = out.lstat()
    assert stat.S_ISREG(st.st_mode) and st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o600
    assert not os.path.lexists(f"{out}.part") and not os.path.lexists(f"{out}.part.json")


async def test_a_part_file_they_made_is_not_resumed_into(
        mesh: Mesh, short_tmp: Path, probe: pwd.struct_passwd) -> None:  # noqa: F811
    b, fid, data = await _shared(mesh, short_tmp)
    out = _their_folder(short_tmp, probe) / "OUT"
    # What the probe did: an OUT.part of theirs, open to all, for the daemon to write into.
    as_user(probe, f"umask 0; head -c 16384 /dev/zero > {out}.part")
    b.client.file_get(fid, out)
    assert out.read_bytes() == data
    st = out.lstat()
    assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o600 and st.st_nlink == 1
    # The probe holds no handle on the plaintext: its file was removed, never written.
    assert not os.path.lexists(f"{out}.part")


async def test_a_target_that_is_not_our_regular_file_is_refused(
        mesh: Mesh, short_tmp: Path, probe: pwd.struct_passwd) -> None:  # noqa: F811
    b, fid, _ = await _shared(mesh, short_tmp)
    drop, victim = _their_folder(short_tmp, probe), _victim(short_tmp)
    as_user(probe, f"ln -s {victim} {drop}/link && echo theirs > {drop}/theirs")
    for name in ("link", "theirs"):
        with pytest.raises(UnsafeTarget) as err:
            b.client.file_get(fid, drop / name)
        assert str(drop / name) in err.value.message and err.value.details["field"] == "out"
    assert (drop / "link").is_symlink() and victim.read_bytes() == SECRET
    assert (drop / "theirs").read_text() == "theirs\n"
    assert sorted(p.name for p in drop.iterdir()) == ["link", "theirs"]


async def test_a_device_a_folder_a_pipe_or_a_long_name_is_a_400(
        mesh: Mesh, short_tmp: Path) -> None:
    b, fid, _ = await _shared(mesh, short_tmp)
    here = short_tmp / "targets"
    here.mkdir()
    # A node of /dev/null's own numbers, in the test's folder: never the real one.
    os.mknod(here / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    os.mkfifo(here / "pipe")
    (here / "folder").mkdir()
    for out in (here / "null", here / "pipe", here / "folder", Path("/"),
                here / ("x" * 300)):
        with pytest.raises(UnsafeTarget) as err:
            b.client.file_get(fid, out)
        assert str(out) in err.value.message, err.value.message
        assert UnsafeTarget.http_status == 400
    assert stat.S_ISCHR((here / "null").lstat().st_mode)
    assert stat.S_ISFIFO((here / "pipe").lstat().st_mode)
    assert sorted(p.name for p in here.iterdir()) == ["folder", "null", "pipe"]
    assert list((here / "folder").iterdir()) == []


def test_an_atomic_write_follows_no_planted_temporary_file(
        short_tmp: Path, probe: pwd.struct_passwd) -> None:  # noqa: F811
    """``daemon backup --out`` and every file written whole: the old temporary name was
    ``FILE.tmp-<pid>``, guessable, opened O_TRUNC through any link."""
    drop, victim = _their_folder(short_tmp, probe), _victim(short_tmp)
    target = drop / "backup.tmb"
    as_user(probe, f"ln -s {victim} {target}.tmp-{os.getpid()}")
    write_atomically(target, b"the bundle")
    assert victim.read_bytes() == SECRET
    assert target.read_bytes() == b"the bundle"
    assert stat.S_IMODE(target.lstat().st_mode) == 0o600
    as_user(probe, f"rm {target} && ln -s {victim} {target}")
    with pytest.raises(UnsafeTarget):
        write_atomically(target, b"again")
    assert victim.read_bytes() == SECRET
