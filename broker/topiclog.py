"""A topic is a log, a subscriber a cursor (DESIGN §11), as pure functions (no I/O).

The accept of a topic message writes it once, at the next position of its topic's log
(dense per topic: the accept bumps ``topic.last_pos`` in its transaction, so a position
never commits before a lower one of its topic). Each subscription remembers the last
position handed to its member (``log_pos``). ``hand_out`` gives what the member's topics
logged since then the member's next seqs, so the member's stream stays what DESIGN §6
promises (one gapless ``(epoch, seq)`` across its DMs, queue and topic messages): each
run of consecutive positions of one topic becomes one ``Span`` (one ``topic_delivery``
row: seq_first..seq_last are pos_first..), whatever its length. The member's own messages
are not handed to it (a topic message goes to every subscriber but its sender), so they
end a run. A position that is gone (pruned: the stall window passed while the member was
away) still takes a seq, and the member's ``compacted_seq`` moves past it: its daemon
hears STALE_SEQUENCE on resume, as it did when rows were written per recipient.

A member's topics are handed out merged by ``log_order`` (drawn by the accept, in batch
order, after it holds its topics' locks: increasing with position in each topic, and with
a sender's order, since a sender's batches commit one after another), and a DM or queue
message the accept is giving the member takes its seq at its own order among them: each
sender's messages reach a member in the order they were sent, whatever their kinds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tidemesh.core.record import record

# Positions handed out per subscription at once: a member that was away long is given
# its backlog a page of the pump at a time, not a million positions in one transaction.
HAND_OUT_MAX = 1024
# The accept hands a DM's recipient all its topics logged, so that the DM takes its seq after
# every earlier message of its sender.
UNCAPPED = 1 << 62


@record
class Lag:
    """A subscription whose topic logged past what its member was given."""

    topic: str
    log_pos: int      # the last position handed to the member
    last_pos: int     # the topic's last committed position
    cap: int = HAND_OUT_MAX

    @property
    def upto(self) -> int:
        return min(self.last_pos, self.log_pos + self.cap)


@record
class Entry:
    pos: int
    sender_pubkey: str
    created_at: int
    order: int


@record
class Own:
    """A DM or queue delivery the accept gives the member, at its place in the batch."""

    order: int
    broker_message_id: str


@record
class Span:
    """Seqs ``seq_first..seq_last`` of a member are positions ``pos_first..`` of ``topic``."""

    topic: str
    pos_first: int
    seq_first: int
    seq_last: int
    created_at: int


@record
class Handout:
    spans: tuple[Span, ...]
    last_seq: int
    compacted_seq: int
    log_pos: tuple[tuple[str, int], ...]   # (topic, the last position now handed out)
    more: bool                             # some topic has logged past what was handed out
    own: tuple[tuple[str, int], ...] = ()  # (broker_message_id, its seq)


_END = float("inf")


@record
class _Event:
    order: float
    at: int                  # its place among events of one order (a gap before its entry)
    gap: int = 0             # positions pruned before they were handed out
    topic: str = ""
    entry: Entry | None = None
    own: Own | None = None


def hand_out(pubkey: str, last_seq: int, compacted_seq: int, lags: Sequence[Lag],
             entries: Mapping[str, Sequence[Entry]], own: Sequence[Own] = ()) -> Handout:
    """The spans for ``lags`` and the seqs of ``own`` after the member's ``last_seq``, in
    ``log_order``. ``entries[topic]`` holds the topic's entries in position order (at least
    those in ``(log_pos, upto]``; others are ignored). When a topic has more than its cap,
    the others are handed out only up to its last order, so none overtakes it."""
    if not own and len(lags) == 1:
        one = _one_topic(pubkey, last_seq, compacted_seq, lags[0],
                         entries.get(lags[0].topic, ()))
        if one is not None:
            return one
    return _merged(pubkey, last_seq, compacted_seq, lags, entries, own)


def _one_topic(pubkey: str, last_seq: int, compacted_seq: int, g: Lag,
               entries: Sequence[Entry]) -> Handout | None:
    """``hand_out`` of one topic whose window holds every position (nothing pruned) and no
    DM or queue delivery among them: the usual hand-out, a lone topic message to each of N
    members, without the merge's events and sort (9 µs a member there). None otherwise."""
    upto = g.upto
    window = [e for e in entries if g.log_pos < e.pos <= upto]
    if len(window) != upto - g.log_pos or (window and window[-1].pos != upto):
        return None   # a gap: positions pruned before they were handed out
    spans: list[Span] = []
    run = False
    for e in window:
        if e.sender_pubkey == pubkey:
            run = False
            continue
        last_seq += 1
        if run:
            s = spans[-1]
            spans[-1] = Span(g.topic, s.pos_first, s.seq_first, last_seq, s.created_at)
        else:
            spans.append(Span(g.topic, e.pos, last_seq, last_seq, e.created_at))
            run = True
    return Handout(tuple(spans), last_seq, compacted_seq, ((g.topic, upto),),
                   upto < g.last_pos)


def _merged(pubkey: str, last_seq: int, compacted_seq: int, lags: Sequence[Lag],
            entries: Mapping[str, Sequence[Entry]], own: Sequence[Own]) -> Handout:
    """``hand_out`` in general: every topic's window and the own deliveries as events in
    ``log_order``, gaps (pruned positions) among them."""
    window = {g.topic: [e for e in entries.get(g.topic, ()) if g.log_pos < e.pos <= g.upto]
              for g in lags}
    capped = [window[g.topic][-1].order for g in lags
              if g.upto < g.last_pos and window[g.topic]]
    bound = min(capped) if capped else _END
    events: list[_Event] = []
    moved: list[tuple[str, int]] = []
    for g in lags:
        prev = g.log_pos
        for e in window[g.topic]:
            if e.order > bound:
                break
            if e.pos > prev + 1:
                events.append(_Event(e.order, len(events), gap=e.pos - prev - 1))
            events.append(_Event(e.order, len(events), topic=g.topic, entry=e))
            prev = e.pos
        else:
            if g.upto > prev:
                events.append(_Event(_END, len(events), gap=g.upto - prev))
            prev = g.upto
        moved.append((g.topic, prev))
    events += [_Event(o.order, len(events) + i, own=o) for i, o in enumerate(own)]
    events.sort(key=lambda ev: (ev.order, ev.at))
    spans: list[Span] = []
    seqs: list[tuple[str, int]] = []
    run: Span | None = None
    for ev in events:
        if ev.gap:
            last_seq += ev.gap
            compacted_seq = last_seq
            run = None
        elif ev.own is not None:
            last_seq += 1
            seqs.append((ev.own.broker_message_id, last_seq))
            run = None
        elif ev.entry is not None and ev.entry.sender_pubkey == pubkey:
            run = None
        elif ev.entry is not None:
            last_seq += 1
            e = ev.entry
            if run is not None and run.topic == ev.topic and \
                    e.pos == run.pos_first + (run.seq_last - run.seq_first) + 1:
                run = spans[-1] = Span(ev.topic, run.pos_first, run.seq_first, last_seq,
                                       run.created_at)
            else:
                run = Span(ev.topic, e.pos, last_seq, last_seq, e.created_at)
                spans.append(run)
    return Handout(tuple(spans), last_seq, compacted_seq, tuple(moved),
                   any(g.upto < g.last_pos for g in lags), tuple(seqs))
