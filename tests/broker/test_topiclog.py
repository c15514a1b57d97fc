"""The hand-out decision (``broker/topiclog.py``), without a database."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tidemesh.broker.topiclog import Entry, Lag, Own, Span, _merged, hand_out

ME, A, B = "me", "a", "b"


def _entries(*specs: tuple[int, str, int]) -> list[Entry]:
    return [Entry(pos, sender, 1000 + pos, order) for pos, sender, order in specs]


def test_a_run_of_positions_is_one_span_whatever_its_length() -> None:
    out = hand_out(ME, 7, 0, [Lag("ops", 0, 500)],
                   {"ops": _entries(*((p, A, p) for p in range(1, 501)))})
    assert out.spans == (Span("ops", 1, 8, 507, 1001),)
    assert (out.last_seq, out.compacted_seq, out.log_pos, out.more) == (
        507, 0, (("ops", 500),), False)


def test_the_members_own_messages_end_a_span_and_take_no_seq() -> None:
    out = hand_out(ME, 0, 0, [Lag("ops", 0, 4)],
                   {"ops": _entries((1, A, 1), (2, ME, 2), (3, B, 3), (4, A, 4))})
    assert out.spans == (Span("ops", 1, 1, 1, 1001), Span("ops", 3, 2, 3, 1003))
    assert out.last_seq == 3


def test_positions_pruned_before_they_were_handed_out_are_compacted_seqs() -> None:
    out = hand_out(ME, 2, 0, [Lag("ops", 0, 6)], {"ops": _entries((3, A, 3), (4, A, 4))})
    # 1-2 gone (seqs 3-4), 3-4 kept (5-6), 5-6 gone at the end (7-8)
    assert out.spans == (Span("ops", 3, 5, 6, 1003),)
    assert (out.last_seq, out.compacted_seq) == (8, 8)


def test_topics_merge_by_order_and_own_deliveries_take_their_place() -> None:
    out = hand_out(ME, 0, 0, [Lag("b", 0, 2), Lag("a", 0, 1)],
                   {"b": _entries((1, A, 10), (2, A, 30)), "a": _entries((1, A, 20))},
                   [Own(25, "dm1"), Own(5, "dm0")])
    assert out.own == (("dm0", 1), ("dm1", 4))
    assert out.spans == (Span("b", 1, 2, 2, 1001), Span("a", 1, 3, 3, 1001),
                         Span("b", 2, 5, 5, 1002))


def test_a_capped_topic_holds_back_the_others_past_its_last_order() -> None:
    big = _entries(*((p, A, 2 * p) for p in range(1, 3001)))
    out = hand_out(ME, 0, 0, [Lag("big", 0, 3000), Lag("small", 0, 2)],
                   {"big": big, "small": _entries((1, A, 1), (2, A, 99_999))})
    assert dict(out.log_pos) == {"big": 1024, "small": 1}
    assert out.more and out.last_seq == 1025


@given(log_pos=st.integers(0, 5), extra=st.integers(0, 12), cap=st.integers(1, 12),
       senders=st.lists(st.sampled_from([ME, A, B]), max_size=20),
       pruned=st.sets(st.integers(1, 20), max_size=4), last_seq=st.integers(0, 50))
def test_one_topics_hand_out_is_the_merged_one(log_pos: int, extra: int, cap: int,
                                                senders: list[str], pruned: set[int],
                                                last_seq: int) -> None:
    """The one-topic path (the usual hand-out) gives what the general merge gives, for any
    window, cap, senders and pruned positions (it steps aside when some are pruned)."""
    entries = _entries(*((p, s, 10 * p) for p, s in enumerate(senders, start=1)
                         if p not in pruned))
    lag = Lag("ops", log_pos, log_pos + extra, cap)
    assert hand_out(ME, last_seq, 0, [lag], {"ops": entries}) == _merged(
        ME, last_seq, 0, [lag], {"ops": entries}, ())
