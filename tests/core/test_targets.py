"""Which paths the daemon may write a file to, and which partial files it resumes from
(pure, over stat results)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from tidemesh.core.targets import name_problem, partial_problem, target_problem

ME, OTHER = 1000, 1001


def st(kind: int, mode: int, uid: int = ME, nlink: int = 1) -> os.stat_result:
    return os.stat_result((kind | mode, 0, 0, nlink, uid, uid, 0, 0, 0, 0))


def test_only_an_absent_target_or_our_regular_file_is_replaced() -> None:
    p = Path("/shared/OUT")
    assert target_problem(p, None, ME) is None
    assert target_problem(p, st(stat.S_IFREG, 0o644), ME) is None
    for kind, word in ((stat.S_IFCHR, "character device"), (stat.S_IFDIR, "folder"),
                       (stat.S_IFLNK, "symbolic link"), (stat.S_IFIFO, "named pipe"),
                       (stat.S_IFBLK, "block device"), (stat.S_IFSOCK, "socket")):
        assert word in (target_problem(p, st(kind, 0o666), ME) or "")
    assert "uid 1001" in (target_problem(p, st(stat.S_IFREG, 0o600, OTHER), ME) or "")


def test_a_partial_file_is_resumed_only_when_ours_0600_and_single() -> None:
    p = Path("/shared/OUT.part")
    assert partial_problem(p, st(stat.S_IFREG, 0o600), ME) is None
    assert "mode 0666" in (partial_problem(p, st(stat.S_IFREG, 0o666), ME) or "")
    assert "uid 1001" in (partial_problem(p, st(stat.S_IFREG, 0o600, OTHER), ME) or "")
    assert "2 links" in (partial_problem(p, st(stat.S_IFREG, 0o600, nlink=2), ME) or "")
    assert "symbolic link" in (partial_problem(p, st(stat.S_IFLNK, 0o777), ME) or "")


def test_a_name_must_name_a_file_with_room_for_its_state_beside_it() -> None:
    assert name_problem(Path("/shared/OUT")) is None
    assert name_problem(Path("/shared/" + "x" * 245)) is None
    assert "246 bytes" in (name_problem(Path("/shared/" + "x" * 246)) or "")
    assert "names a folder" in (name_problem(Path("/")) or "")
    assert "longer than" in (name_problem(Path("/" + "d/" * 2100 + "x")) or "")
