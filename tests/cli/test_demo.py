"""The README's main command runs the whole job and shows each message exactly once."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from tests.daemon.harness import run_cli


def test_demo_runs_the_whole_job(short_tmp: Path) -> None:
    res = run_cli(short_tmp, "demo", "--home", str(short_tmp / "d"), timeout=120)
    assert res.returncode == 0, res.stderr + res.stdout
    out = res.stdout
    inbox = out.split("bob's inbox")[1].split("==>")[0]
    assert len(re.findall(r"^\s+#\d+ ", inbox, re.M)) == 2
    assert "'hello, mesh'" in inbox and "sealed for you" in inbox
    events = out.split("event stream")[1].split("==>")[0]
    assert events.count(" message ") == 2
    assert "done=2" in out and "dead=0" in out
    assert not list((short_tmp / "d").rglob("sock")), "sockets are removed on stop"


def test_demo_runs_again_in_the_same_home(short_tmp: Path) -> None:
    home = short_tmp / "d"
    for _ in range(2):
        res = run_cli(short_tmp, "demo", "--home", str(home), timeout=120)
        assert res.returncode == 0, res.stderr + res.stdout
        assert "done=2" in res.stdout
    assert "cleared the previous demo" in res.stdout


def test_demo_will_not_clear_a_folder_it_did_not_make(short_tmp: Path) -> None:
    mine = short_tmp / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    res = run_cli(short_tmp, "demo", "--home", str(mine), timeout=60)
    assert res.returncode == 2 and "--home" in res.stderr
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


def test_demo_without_home_says_where_its_folder_stays(short_tmp: Path) -> None:
    res = run_cli(short_tmp, "demo", timeout=120)
    assert res.returncode == 0, res.stderr + res.stdout
    word = res.stdout.rsplit("==>", 1)[1]
    folder = Path(re.search(r"remove it with `rm -r (\S+)`", word).group(1))  # type: ignore[union-attr]
    try:
        assert folder.is_dir() and (folder / ".tidemesh-demo").exists()
        assert "--home" in word
    finally:
        shutil.rmtree(folder, ignore_errors=True)
