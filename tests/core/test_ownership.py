"""Which folders, tokens and sockets are private enough to use (pure, over stat results)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from tidemesh.core.ownership import (
    base_problem,
    chain,
    folder_problem,
    socket_problem,
    token_problem,
)

ME, OTHER = 1000, 1001


def st(kind: int, mode: int, uid: int = ME) -> os.stat_result:
    return os.stat_result((kind | mode, 0, 0, 1, uid, uid, 0, 0, 0, 0))


def test_a_folder_must_be_ours_and_closed_to_writes_by_others() -> None:
    p = Path("/tmp/tidemesh-1000")
    assert folder_problem(p, st(stat.S_IFDIR, 0o700), ME) is None
    assert folder_problem(p, st(stat.S_IFDIR, 0o755), ME) is None
    assert "uid 1001" in (folder_problem(p, st(stat.S_IFDIR, 0o700, OTHER), ME) or "")
    assert "writable by group or others (mode 0775)" in (
        folder_problem(p, st(stat.S_IFDIR, 0o775), ME) or "")
    assert "mode 1777" in (folder_problem(p, st(stat.S_IFDIR, 0o1777), ME) or "")
    assert "not a folder" in (folder_problem(p, st(stat.S_IFLNK, 0o777), ME) or "")


def test_a_token_must_be_our_regular_file_with_mode_0600() -> None:
    p = Path("/run/t/local_token")
    assert token_problem(p, st(stat.S_IFREG, 0o600), ME) is None
    assert "mode 0644" in (token_problem(p, st(stat.S_IFREG, 0o644), ME) or "")
    assert "uid 1001" in (token_problem(p, st(stat.S_IFREG, 0o600, OTHER), ME) or "")
    assert "not a regular file" in (token_problem(p, st(stat.S_IFIFO, 0o600), ME) or "")


def test_a_socket_must_be_ours() -> None:
    p = Path("/run/t/sock")
    assert socket_problem(p, st(stat.S_IFSOCK, 0o600), ME) is None
    assert "uid 1001" in (socket_problem(p, st(stat.S_IFSOCK, 0o600, OTHER), ME) or "")
    assert socket_problem(p, st(stat.S_IFREG, 0o600), ME) is None   # connecting just fails


def test_the_first_folder_may_be_sticky_like_tmp_if_roots_or_ours() -> None:
    p = Path("/tmp/tm-fs")
    assert base_problem(p, st(stat.S_IFDIR, 0o1777, 0), ME) is None
    assert base_problem(p, st(stat.S_IFDIR, 0o1777), ME) is None
    assert "uid 1001" in (base_problem(p, st(stat.S_IFDIR, 0o1777, OTHER), ME) or "")
    assert "mode 0777" in (base_problem(p, st(stat.S_IFDIR, 0o777), ME) or "")
    assert base_problem(p, st(stat.S_IFDIR, 0o700), ME) is None


def test_the_chain_runs_from_the_base_down_to_the_folder() -> None:
    base = Path("/tmp/tidemesh-0")
    assert chain(base, base / "tidemesh" / "daemon" / "m") == [
        base, base / "tidemesh", base / "tidemesh" / "daemon", base / "tidemesh" / "daemon" / "m"]
    assert chain(base, Path("/elsewhere/m")) == [Path("/elsewhere/m")]
