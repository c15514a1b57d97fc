"""The broker link as the services see it: whichever link the relay has open now, with its
failures turned into the ``core.errors`` tree (503 while there is none, 409 ``not_joined``
on a daemon that joined no mesh, a broker refusal as the caller's 4xx). Membership and
presence ask the broker through this.

Imports the link and ``core``; no SQL and no HTTP here.
"""

from __future__ import annotations

import asyncio
from typing import Any

from tidemesh.core.errors import InvalidRequest, NotJoined, TidemeshError, Unavailable, from_body
from tidemesh.daemon.link.websocket import BrokerLink, LinkError


def _disconnected() -> Unavailable:
    return Unavailable("the daemon is not connected to the broker", reason="broker_disconnected")


def _failed(exc: LinkError) -> Unavailable:
    return Unavailable(f"the broker link failed: {exc}", reason="broker_disconnected")


def not_joined() -> LiveLink | None:
    """What the services ask in place of ``LiveLink.if_open`` while no mesh is joined: a
    link that will not come by waiting, so its own error instead of 503."""
    raise NotJoined("this daemon has joined no mesh, so there is no broker to ask; run "
                    "`tidemesh daemon join INVITE`, then restart the daemon",
                    reason="not_joined")


class LiveLink:
    def __init__(self) -> None:
        # Set by the relay for the length of each session, None between them.
        self.current: BrokerLink | None = None

    def if_open(self) -> LiveLink | None:
        """This, while a link is open; None between sessions (what the services ask)."""
        return self if self.current is not None else None

    def _live(self) -> BrokerLink:
        if self.current is None:
            raise _disconnected()
        return self.current

    async def peers(self) -> list[dict[str, Any]]:
        link = self._live()
        try:
            return await link.peers()
        except LinkError as exc:
            raise _failed(exc) from exc

    async def set_profile(self, profile: dict[str, Any]) -> None:
        link = self._live()
        try:
            await link.set_profile(profile)
        except LinkError as exc:
            raise _failed(exc) from exc

    async def request(self, op: str, name: str) -> None:
        """A membership operation over the live link; broker refusals raise the error tree."""
        link = self._live()
        try:
            answer = await link.request(op, name)
        except LinkError as exc:
            raise _failed(exc) from exc
        _refused(answer)

    async def file_submit(self, frame: dict[str, Any]) -> asyncio.Future[dict[str, Any]]:
        """A shared file's frame sent; its answer to be read with ``file_answer``."""
        link = self._live()
        try:
            return await link.file_submit(frame)
        except LinkError as exc:
            raise _failed(exc) from exc


async def file_answer(fut: asyncio.Future[dict[str, Any]]) -> dict[str, Any]:
    """The broker's answer to a file frame; its refusal or a lost link as the error tree."""
    try:
        answer = await fut
    except LinkError as exc:
        raise _failed(exc) from exc
    _refused(answer)
    return answer


def _refused(answer: dict[str, Any]) -> None:
    if answer.get("type") == "error":
        err = from_body(400, {"error": answer["error"]})
        # A broker code this daemon does not know is still the caller's 4xx, not a 500.
        raise (InvalidRequest(err.message, broker_code=answer["error"].get("code"))
               if type(err) is TidemeshError else err)
