"""Where a delivery stands against the receive cursor (DESIGN §6), decided without any I/O."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemesh.daemon.receive_order import Placement, Position, ReceiveOrder

NEXT, STORED, STALE, GAP = Placement.NEXT, Placement.STORED, Placement.STALE, Placement.GAP


def placed(order: ReceiveOrder, *positions: Position) -> list[Placement]:
    return [order.place(*p) for p in positions]


def test_place_in_order_advances_the_cursor_one_by_one() -> None:
    order = ReceiveOrder((1, 0))
    assert placed(order, (1, 1), (1, 2), (1, 3)) == [NEXT, NEXT, NEXT]
    assert order.cursor == (1, 3)


@pytest.mark.parametrize("pos", [(1, 5), (1, 1), (1, 0), (0, 99)])
def test_place_at_or_before_the_cursor_is_already_stored(pos: Position) -> None:
    order = ReceiveOrder((1, 5))
    assert order.place(*pos) is STORED
    assert order.cursor == (1, 5)


@pytest.mark.parametrize("pos", [(1, 7), (1, 100), (2, 1), (2, 6)])
def test_place_past_the_next_seq_is_a_gap_and_keeps_the_cursor(pos: Position) -> None:
    order = ReceiveOrder((1, 5))
    assert order.place(*pos) is GAP
    assert order.cursor == (1, 5)


def test_a_new_epoch_is_a_gap_until_a_resume_moves_the_cursor_into_it() -> None:
    order = ReceiveOrder((1, 5))
    assert order.place(2, 1) is GAP
    order.resumed((2, 0))
    assert placed(order, (2, 1), (2, 2)) == [NEXT, NEXT]
    assert placed(order, (1, 9)) == [STORED]  # the old epoch is behind the cursor now


def test_after_a_resume_out_of_order_frames_are_stale_not_gaps() -> None:
    order = ReceiveOrder((1, 5))
    assert order.place(1, 9) is GAP
    order.resumed((1, 5))
    # Frames the broker sent before the resume, still queued ahead of the re-sent ones.
    assert placed(order, (1, 9), (1, 10), (1, 4)) == [STALE, STALE, STORED]
    assert placed(order, (1, 6), (1, 8)) == [NEXT, GAP]  # in order again: gaps count again


def test_the_resume_that_starts_the_receiver_also_makes_early_frames_stale() -> None:
    order = ReceiveOrder((0, 0))
    order.resumed((3, 10))
    assert placed(order, (3, 12), (3, 11), (3, 12)) == [STALE, NEXT, NEXT]


def test_ack_position_is_the_cursor_once_anything_was_received() -> None:
    order = ReceiveOrder((0, 0))
    assert order.ack_position() is None
    order.resumed((4, 0))
    assert order.ack_position() is None
    order.place(4, 1)
    assert order.ack_position() == (4, 1)


@given(st.lists(st.tuples(st.integers(1, 3), st.integers(0, 12)), max_size=40),
       st.booleans())
def test_the_cursor_only_moves_one_seq_forward_per_next(frames: list[Position],
                                                        resynced: bool) -> None:
    order = ReceiveOrder((1, 0), resynced)
    for pos in frames:
        before = order.cursor
        placement = order.place(*pos)
        if placement is NEXT:
            assert order.cursor == pos == (before[0], before[1] + 1)
        else:
            assert order.cursor == before
            assert (placement is STORED) == (pos <= before)


def test_plan_stores_the_next_ones_in_order_and_drops_the_rest() -> None:
    order = ReceiveOrder((1, 5))
    plan = order.plan([(1, 4), (1, 6), (1, 5), (1, 7)])
    assert (plan.store, plan.gap) == ([1, 3], None)
    assert order.cursor == (1, 7)


def test_plan_stops_at_a_gap_and_keeps_what_came_before_it() -> None:
    order = ReceiveOrder((1, 5))
    plan = order.plan([(1, 6), (1, 9), (1, 7)])
    assert (plan.store, plan.gap) == ([0], (1, 9))
    assert order.cursor == (1, 6), "the resume starts after the last delivery stored"


def test_plan_after_a_resume_drops_stale_frames_without_a_gap() -> None:
    order = ReceiveOrder((1, 5))
    order.resumed((1, 5))
    plan = order.plan([(1, 9), (1, 6)])
    assert (plan.store, plan.gap) == ([1], None)
