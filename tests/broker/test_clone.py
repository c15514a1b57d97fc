"""Clone detection's decision (pure) and the registry's hand-over of deliveries."""

from __future__ import annotations

from typing import Any

from tidemesh.broker.service.clone import (
    NOT_SUSPECTED,
    ClonePolicy,
    CloneVerdict,
    Sightings,
    judge,
)
from tidemesh.broker.service.connections import Connections
from tidemesh.core import handshake


def test_one_host_or_an_old_daemon_is_never_suspected() -> None:
    for policy in ClonePolicy:
        assert judge(policy, "h1", ["h1", "h1"]) == NOT_SUSPECTED     # reconnects of one host
        assert judge(policy, None, ["h1"]) == NOT_SUSPECTED           # a daemon without a mark
        assert judge(policy, "h1", [None]) == NOT_SUSPECTED           # beside one without
        assert judge(policy, "h1", []) == NOT_SUSPECTED               # the first session


def test_another_host_is_judged_by_the_policy() -> None:
    assert judge(ClonePolicy.WARN, "h2", ["h1"]) == CloneVerdict(True, mute_live=True)
    assert judge(ClonePolicy.REFUSE_NEW, "h2", [None, "h1"]) == CloneVerdict(True,
                                                                              refuse_new=True)
    assert judge(ClonePolicy.REFUSE_BOTH, "h2", ["h2", "h1"]) == CloneVerdict(
        True, refuse_new=True, close_live=True)


def test_only_refuse_both_counts_the_quarantines_hosts_as_live() -> None:
    both = CloneVerdict(True, refuse_new=True, close_live=True)
    # Neither twin is connected now: each is refused while the other was seen lately.
    assert judge(ClonePolicy.REFUSE_BOTH, "h1", [], ["h1", "h2"]) == both
    assert judge(ClonePolicy.REFUSE_BOTH, "h2", [None], ["h1", "h2"]) == both
    assert judge(ClonePolicy.REFUSE_BOTH, "h1", [], ["h1"]) == NOT_SUSPECTED
    for policy in (ClonePolicy.WARN, ClonePolicy.REFUSE_NEW):
        assert judge(policy, "h1", [], ["h1", "h2"]) == NOT_SUSPECTED


def test_a_quarantine_holds_while_two_hosts_keep_coming_and_ends_when_one_stops() -> None:
    key = ("m", "k")
    seen = Sightings(window_ms=1000)
    assert seen.recent(key, 0) == []
    seen.saw(key, ["h2", "h1", None], 0)
    # Both retry within the window: both stay in, each refreshing only itself.
    for t, host in ((400, "h2"), (800, "h1"), (1200, "h2"), (1600, "h1")):
        assert sorted(seen.recent(key, t)) == ["h1", "h2"]
        seen.saw(key, [host], t)
    # h2 stops (say it was re-minted): once its last sighting is a window old, h1 is let in
    # and the member is forgotten.
    assert sorted(seen.recent(key, 2200)) == ["h1", "h2"]
    assert seen.recent(key, 2201) == []
    assert len(seen) == 0


def test_the_host_mark_depends_on_key_and_host_only() -> None:
    a, b = "a" * 64, "b" * 64
    assert handshake.host_mark(a, "f1") == handshake.host_mark(a, "f1")
    assert handshake.host_mark(a, "f1") != handshake.host_mark(a, "f2")
    assert handshake.host_mark(a, "f1") != handshake.host_mark(b, "f1")


class _Peer:
    async def send_frame(self, frame: dict[str, Any]) -> None:
        return None

    def tell(self, frame: dict[str, Any]) -> None:
        return None

    async def close(self, code: int, reason: str) -> None:
        return None


async def test_when_the_session_with_the_deliveries_ends_the_newest_muted_one_takes_them(
) -> None:
    # In a loop, as in the server: a member's second connection is a presence update.
    reg = Connections()
    old, _ = reg.register(_Peer(), "m", "k", host="h1")
    new, _ = reg.register(_Peer(), "m", "k", host="h2")
    new.connected_at = old.connected_at + 1
    old.muted = True
    reg.unregister(new)
    assert old.muted is False and old.wake.is_set()
