"""The broker link as services see it, between sessions: absent, and a 503 when asked."""

from __future__ import annotations

import pytest

from tidemesh.core.errors import Unavailable
from tidemesh.daemon.link.live_link import LiveLink


def test_if_open_is_none_while_no_link_is_open() -> None:
    assert LiveLink().if_open() is None


async def test_requests_without_a_link_are_503_broker_disconnected() -> None:
    live = LiveLink()
    for call in (live.peers(), live.set_profile({}), live.request("topic_create", "ops")):
        with pytest.raises(Unavailable) as info:
            await call
        assert info.value.details == {"reason": "broker_disconnected"}
