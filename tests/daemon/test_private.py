"""The daemon's folders and token (daemon/process/private.py) on a real file system."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tidemesh.core.ownership import NotPrivate
from tidemesh.core.paths import daemon_paths
from tidemesh.daemon.process.private import ensure_dirs, ensure_token


def _mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


def test_every_runtime_folder_it_makes_is_0700_whatever_the_umask(short_tmp: Path) -> None:
    paths = daemon_paths("m", {"HOME": str(short_tmp / "h"),
                               "XDG_RUNTIME_DIR": str(short_tmp / "rt")})
    old = os.umask(0o002)
    try:
        ensure_dirs(paths)
    finally:
        os.umask(old)
    rt = short_tmp / "rt"
    assert [_mode(d) for d in (rt, rt / "tidemesh", rt / "tidemesh" / "daemon",
                               paths.runtime_dir)] == [0o700] * 4
    ensure_dirs(paths)  # a second start finds them as it left them


def test_a_runtime_folder_open_to_writes_is_refused_with_its_name(short_tmp: Path) -> None:
    paths = daemon_paths("m", {"TIDEMESH_HOME": str(short_tmp)})
    (short_tmp / "daemon").mkdir(mode=0o700)
    (short_tmp / "daemon").chmod(0o777)
    with pytest.raises(NotPrivate, match=f"{short_tmp / 'daemon'} is writable by group"):
        ensure_dirs(paths)
    assert not paths.runtime_dir.exists()


def test_a_token_of_ours_with_mode_0600_is_kept(short_tmp: Path) -> None:
    token = short_tmp / "local_token"
    first = ensure_token(token)
    assert _mode(token) == 0o600 and ensure_token(token) == first


@pytest.mark.parametrize("mode", [0o644, 0o660, 0o606])
def test_a_token_others_could_read_or_write_is_replaced(short_tmp: Path, mode: int) -> None:
    token = short_tmp / "local_token"
    token.write_text("known-to-others\n")
    token.chmod(mode)
    fresh = ensure_token(token)
    assert fresh != "known-to-others" and token.read_text() == fresh + "\n"
    assert _mode(token) == 0o600


def test_a_token_that_is_a_link_is_replaced_and_its_target_left_alone(short_tmp: Path) -> None:
    target = short_tmp / "elsewhere"
    target.write_text("known-to-others\n")
    target.chmod(0o600)
    token = short_tmp / "local_token"
    token.symlink_to(target)
    fresh = ensure_token(token)
    assert fresh != "known-to-others" and not token.is_symlink()
    assert target.read_text() == "known-to-others\n"
