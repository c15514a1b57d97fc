"""``tidemesh send --wait``: the broker's outcome, not just the daemon's 202."""

from __future__ import annotations

from pathlib import Path

import pytest
from nacl.signing import SigningKey

from tests.daemon.harness import run_cli
from tests.e2e.harness import Mesh, connected, pubkey, wait_for
from tidemesh.core.exitcodes import Exit

pytestmark = pytest.mark.slow


async def test_wait_reports_delivered_dead_and_still_queued(mesh: Mesh, short_tmp: Path) -> None:
    a, b = mesh.add("a", short_tmp), mesh.add("b", short_tmp)
    await wait_for(lambda: connected(a))
    await wait_for(lambda: connected(b))
    assert run_cli(a.home, "topic", "create", "--mesh", "m", "news").returncode == 0

    def send(to: str, *extra: str) -> tuple[int, str]:
        res = run_cli(a.home, "send", "--mesh", "m", "--to", to, "hi", "--wait", *extra)
        return res.returncode, res.stdout + res.stderr

    rc, out = send("topic:news")
    assert rc == Exit.OK and out.startswith("done:"), out
    rc, out = send(f"dm:{pubkey(b)}")
    assert rc == Exit.OK and out.startswith("done:"), out
    stranger = SigningKey.generate().verify_key.encode().hex()
    assert run_cli(mesh.broker.home, "broker", "member", "revoke", "--mesh", "team",
                   "--store", mesh.broker.store, pubkey(b)).returncode == 0
    for never in ("topic:nosuch", "queue:nobody-consumes", f"dm:{stranger}", f"dm:{pubkey(b)}"):
        rc, out = send(never)
        assert rc == Exit.UNDELIVERED and "will not be delivered" in out, (never, out)
    assert mesh.broker.stop() == 0
    rc, out = send("topic:news", "--timeout", "1")
    assert rc == Exit.STILL_QUEUED and "still queued" in out, out
