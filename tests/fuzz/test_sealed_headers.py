"""A hostile member seals whatever header it likes (hypothesis): the recipient's daemon opens
it, checks it as it checks a clear send, and stores it — marked when it could not be a clear
send's — and reads it back; no header makes opening, storing or paging fail.

The sealed part is the member's own, so the broker cannot check it: this is the one input a
member controls that reaches the inbox writer unchecked by anyone else. ``make fuzz`` runs it
with many more examples (TIDEMESH_FUZZ_EXAMPLES)."""

from __future__ import annotations

import asyncio
import base64
import os
import tempfile
from pathlib import Path
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nacl.public import Box
from nacl.signing import SigningKey

from tidemesh.daemon.link.receiver import delivery_of
from tidemesh.daemon.process.stores import open_inbox
from tidemesh.daemon.records import Page
from tidemesh.daemon.service.events import EventBus
from tidemesh.daemon.service.inbox import InboxService

EXAMPLES = int(os.environ.get("TIDEMESH_FUZZ_EXAMPLES", "150"))
SENDER, ME = SigningKey(b"s" * 32), SigningKey(b"r" * 32)

_scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2 ** 70), max_value=2 ** 70),
                     st.floats(allow_nan=False), st.text(max_size=20))
_json = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=30)


@st.composite
def _headers(draw: st.DrawFn) -> bytes:
    """A header as bytes: mostly JSON with hostile fields, sometimes deep, sometimes junk."""
    choice = draw(st.integers(0, 9))
    if choice == 0:
        return draw(st.binary(max_size=200))
    depth = draw(st.sampled_from([1, 33, 250, 600, 1100])) if choice == 1 else 0
    deep = b'{"a":' * depth + b"1" + b"}" * depth
    fields: dict[str, Any] = {
        "enc": draw(st.one_of(st.sampled_from(["utf8", "base64"]), _json)),
        "meta": draw(st.one_of(st.none(), st.dictionaries(st.text(max_size=8), _json), _json)),
        "priority": draw(st.one_of(st.just("next"), _json)),
        "reply_to": draw(st.one_of(st.none(), st.just("01ARZ3NDEKTSV4RRFFQ69G5FAV"), _json)),
    }
    try:
        raw = orjson.dumps(fields)
    except TypeError:   # an integer past 64 bits: write it as JSON text by hand
        raw = b'{"enc":"utf8","meta":{"n":%d},"priority":"next","reply_to":null}' % (2 ** 70)
    return raw.replace(b'"meta":null', b'"meta":' + deep) if depth else raw


def _frame(seq: int, header: bytes, body: bytes) -> dict[str, Any]:
    plain = bytes([3]) + len(header).to_bytes(4, "big") + header + body
    box = Box(SENDER.to_curve25519_private_key(), ME.verify_key.to_curve25519_public_key())
    return {"type": "deliver", "epoch": 1, "seq": seq, "broker_message_id": f"b{seq}",
            "client_message_id": f"c{seq}", "sender_pubkey": SENDER.verify_key.encode().hex(),
            "sender_name": "mallory", "to": {"kind": "dm", "ref": ME.verify_key.encode().hex()},
            "body": base64.b64encode(bytes(box.encrypt(plain))).decode(),
            "body_encoding": "base64", "priority": "next", "meta": None, "reply_to": None,
            "created_at": 1}


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(frames=st.lists(st.tuples(_headers(), st.binary(max_size=40)), min_size=1, max_size=4))
def test_no_sealed_header_stops_the_inbox(frames: list[tuple[bytes, bytes]]) -> None:
    asyncio.run(_store_and_read(frames))


async def _store_and_read(frames: list[tuple[bytes, bytes]]) -> None:
    with tempfile.TemporaryDirectory(prefix="tm-sh-") as tmp:
        db = await open_inbox(Path(tmp) / "inbox.db")
        svc = InboxService(db, EventBus())
        try:
            items = [delivery_of(_frame(n + 1, h, b), ME, "m", 1) for n, (h, b) in
                     enumerate(frames)]
            results = await svc.store_frame(items)
            assert all(r is not None and r.inbox_seq is not None for r in results)
            page = await svc.page(Page(after=0, limit=10))
            assert [i["client_message_id"] for i in page["items"]] == [
                f"c{n + 1}" for n in range(len(frames))]
            assert svc.write_health.healthy
        finally:
            await db.close()
