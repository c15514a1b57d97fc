import pytest

from tidemesh.core.failover import BrokerRotation


def test_one_address_is_dialled_again_and_again() -> None:
    r = BrokerRotation.of(["ws://a:1"])
    assert [r.current, r.failed(), r.failed()] == ["ws://a:1"] * 3


def test_a_failure_moves_to_the_next_and_wraps_around() -> None:
    r = BrokerRotation.of(["ws://a:1", "ws://b:1", "ws://c:1"])
    assert r.current == "ws://a:1"
    assert [r.failed(), r.failed(), r.failed()] == ["ws://b:1", "ws://c:1", "ws://a:1"]


def test_in_order_starts_at_the_current_one() -> None:
    r = BrokerRotation.of(["ws://a:1", "ws://b:1", "ws://c:1"])
    r.failed()
    assert r.in_order() == ("ws://b:1", "ws://c:1", "ws://a:1")


def test_repeats_are_dropped_and_none_is_refused() -> None:
    assert BrokerRotation.of(["ws://a:1", "ws://b:1", "ws://a:1"]).urls == ("ws://a:1", "ws://b:1")
    with pytest.raises(ValueError, match="at least one broker"):
        BrokerRotation.of([])


def test_new_addresses_keep_the_broker_in_use_when_it_is_among_them() -> None:
    from tidemesh.core.failover import BrokerRotation

    on_b = BrokerRotation.of(["ws://a", "ws://b"])
    on_b.failed()
    assert on_b.readdressed(["ws://c", "ws://b"]).current == "ws://b"
    assert on_b.readdressed(["ws://c", "ws://d"]).current == "ws://c"
