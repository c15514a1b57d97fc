"""A broker on SQLite with one joined member home, shared by the fuzzers of this folder."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon.harness import run_cli
from tests.e2e.harness import Broker


@pytest.fixture(scope="module")
def joined() -> Iterator[tuple[Broker, Path]]:
    """(broker, member home): the member joined mesh ``t``; everything removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix="tm-fz-", dir="/tmp"))
    (root / "broker").mkdir()
    (root / "m").mkdir()
    broker = Broker(root / "broker", f"sqlite://{root}/broker/broker.db")
    broker.cli("mesh", "create", "team")
    broker.start()
    try:
        res = run_cli(root / "m", "daemon", "join", broker.invite("team"), "--mesh", "t")
        assert res.returncode == 0, res.stderr
        yield broker, root / "m"
        assert broker.proc is not None and broker.proc.poll() is None, (
            f"the broker died ({broker.proc and broker.proc.returncode}): "
            + (root / "broker" / "broker.out").read_text(errors="replace")[-4000:])
    finally:
        broker.stop()
        shutil.rmtree(root, ignore_errors=True)
