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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tidemesh.core.record import record

# Positions handed out per subscription at once: a member that was away long is given
# its backlog a page of the pump at a time, not a million positions in one transaction.
HAND_OUT_MAX = 1024


@record
class Lag:
    """A subscription whose topic logged past what its member was given."""

    topic: str
    log_pos: int      # the last position handed to the member
    last_pos: int     # the topic's last committed position

    @property
    def upto(self) -> int:
        return min(self.last_pos, self.log_pos + HAND_OUT_MAX)


@record
class Entry:
    pos: int
    sender_pubkey: str
    created_at: int


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


def hand_out(pubkey: str, last_seq: int, compacted_seq: int, lags: Sequence[Lag],
             entries: Mapping[str, Sequence[Entry]]) -> Handout:
    """The spans for ``lags`` (topics in name order, each in position order) after the
    member's ``last_seq``. ``entries[topic]`` holds the topic's entries in position order
    (at least those in ``(log_pos, upto]``; others are ignored)."""
    spans: list[Span] = []
    moved: list[tuple[str, int]] = []
    for lag in sorted(lags, key=lambda g: g.topic):
        prev = lag.log_pos
        run: Span | None = None
        for e in entries.get(lag.topic, ()):
            if e.pos <= lag.log_pos or e.pos > lag.upto:
                continue
            if e.pos > prev + 1:       # pruned before it was handed out
                last_seq += e.pos - prev - 1
                compacted_seq = last_seq
                run = None
            prev = e.pos
            if e.sender_pubkey == pubkey:
                run = None
                continue
            last_seq += 1
            if run is not None:
                run = spans[-1] = Span(run.topic, run.pos_first, run.seq_first, last_seq,
                                       run.created_at)
            else:
                run = Span(lag.topic, e.pos, last_seq, last_seq, e.created_at)
                spans.append(run)
        if lag.upto > prev:            # pruned at the end of what is handed out
            last_seq += lag.upto - prev
            compacted_seq = last_seq
        moved.append((lag.topic, lag.upto))
    return Handout(tuple(spans), last_seq, compacted_seq, tuple(moved),
                   any(g.upto < g.last_pos for g in lags))

