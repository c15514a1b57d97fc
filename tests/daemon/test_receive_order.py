"""Where a delivery stands against the receive cursor (DESIGN §6), decided without any I/O."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemesh.daemon.link.receive_order import Placement, Position, ReceiveOrder

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
    plan = order.plan([[(1, 4)], [(1, 6)], [(1, 5)], [(1, 7)]])
    assert (plan.store, plan.gap) == ([[], [0], [], [0]], None)
    assert order.cursor == (1, 7)


def test_plan_stops_at_a_gap_and_keeps_what_came_before_it() -> None:
    order = ReceiveOrder((1, 5))
    plan = order.plan([[(1, 6)], [(1, 9)], [(1, 7)]])
    assert (plan.store, plan.gap) == ([[0], [], []], (1, 9))
    assert order.cursor == (1, 6), "the resume starts after the last delivery stored"


def test_plan_after_a_resume_drops_stale_frames_without_a_gap() -> None:
    order = ReceiveOrder((1, 5))
    order.resumed((1, 5))
    plan = order.plan([[(1, 9)], [(1, 6)]])
    assert (plan.store, plan.gap) == ([[], [0]], None)


# -- deliver_batch frames: several deliveries per frame -----------------------------------

def test_plan_stores_a_whole_batch_in_order() -> None:
    order = ReceiveOrder((1, 5))
    plan = order.plan([[(1, 6), (1, 7), (1, 8)], [(1, 9), (1, 10)]])
    assert (plan.store, plan.gap) == ([[0, 1, 2], [0, 1]], None)
    assert order.ack_position() == (1, 10), "one cumulative ack covers both frames"


def test_plan_gap_inside_a_batch_keeps_the_part_before_it_and_nothing_after() -> None:
    order = ReceiveOrder((1, 5))
    plan = order.plan([[(1, 6), (1, 7), (1, 9), (1, 10)], [(1, 11)]])
    assert (plan.store, plan.gap) == ([[0, 1], []], (1, 9))
    assert order.cursor == order.ack_position() == (1, 7)


def test_plan_gap_before_a_batch_stores_none_of_it() -> None:
    order = ReceiveOrder((1, 5))
    plan = order.plan([[(1, 8), (1, 9), (1, 10)]])
    assert (plan.store, plan.gap) == ([[]], (1, 8))
    assert order.cursor == (1, 5)


def test_plan_batch_after_a_gap_and_resume_is_stale_until_the_resent_one_arrives() -> None:
    order = ReceiveOrder((1, 5))
    assert order.plan([[(1, 6)], [(1, 8), (1, 9)]]).gap == (1, 8)
    order.resumed(order.cursor)
    # A batch the broker sent before the resume, then the re-sent stream from 7.
    plan = order.plan([[(1, 10), (1, 11)], [(1, 7), (1, 8), (1, 9), (1, 10), (1, 11)]])
    assert (plan.store, plan.gap) == ([[], [0, 1, 2, 3, 4]], None)
    assert order.cursor == (1, 11)


def test_plan_duplicates_inside_a_batch_are_stored_once() -> None:
    order = ReceiveOrder((1, 5))
    plan = order.plan([[(1, 6), (1, 6), (1, 7), (1, 6), (1, 7), (1, 8)]])
    assert (plan.store, plan.gap) == ([[0, 2, 5]], None)


def test_plan_redelivered_batch_overlapping_the_cursor_stores_only_the_new_part() -> None:
    # After a reconnect the broker resends from what it last saw acked: the cursor is ahead
    # of the start of the batch.
    order = ReceiveOrder((1, 7))
    plan = order.plan([[(1, 5), (1, 6), (1, 7), (1, 8), (1, 9)]])
    assert (plan.store, plan.gap) == ([[3, 4]], None)
    assert order.cursor == (1, 9)


def test_plan_batch_wholly_behind_the_cursor_stores_nothing_and_acks_the_cursor() -> None:
    order = ReceiveOrder((1, 20))
    plan = order.plan([[(1, 5), (1, 6), (1, 7)], [(1, 8)]])
    assert (plan.store, plan.gap) == ([[], []], None)
    assert order.ack_position() == (1, 20)


frames_strategy = st.lists(st.lists(st.tuples(st.integers(1, 2), st.integers(0, 10)),
                                    min_size=1, max_size=6), max_size=8)


@given(frames_strategy, st.booleans())
def test_plan_of_batches_places_like_one_delivery_per_frame(frames: list[list[Position]],
                                                          resynced: bool) -> None:
    """Frame boundaries never change what is stored, the gap, or the cursor."""
    batched, single = ReceiveOrder((1, 3), resynced), ReceiveOrder((1, 3), resynced)
    plan = batched.plan(frames)
    flat = [p for f in frames for p in f]
    one_by_one = single.plan([[p] for p in flat])
    stored = [f[i] for f, idx in zip(frames, plan.store, strict=True) for i in idx]
    assert stored == [flat[k] for k, idx in enumerate(one_by_one.store) if idx]
    assert (plan.gap, batched.cursor) == (one_by_one.gap, single.cursor)
    assert len(plan.store) == len(frames)
