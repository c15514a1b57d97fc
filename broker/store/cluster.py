"""The ``Cluster`` port: what several brokers on one PostgreSQL database tell each other
(the service that uses it is ``broker/service/cluster.py``; the adapter is
``broker/store/postgres/cluster.py``). The embedded SQLite store serves one broker, whose
``SingleBroker`` carries nothing."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

Key = tuple[str, str]  # (mesh_id, member pubkey)
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class SessionRow:
    """A member's live session, held by one broker."""

    mesh_id: str
    pubkey: str
    broker_id: str
    session_id: str
    display_name: str | None
    profile: dict[str, Any]
    connected_at: int
    host: str | None = None      # the hello's host mark (service/clone.py)


class ClusterEvents(Protocol):
    """What the cluster adapter calls when another broker tells this one something."""

    def on_wake(self, keys: Iterable[Key]) -> None: ...

    def on_listening(self) -> None: ...

    async def on_taken_over(self, mesh_id: str, pubkey: str, session_id: str) -> None: ...

    async def on_presence(self, frame: dict[str, Any]) -> None: ...

    async def on_revoked(self, mesh_id: str, pubkey: str) -> None: ...

    async def on_clone(self, mesh_id: str, pubkey: str, host: str, new_host: str | None,
                       close: bool, policy: str) -> None: ...


class Cluster(Protocol):
    broker_id: str

    def publish_wake(self, keys: set[Key]) -> None:
        """Tell the other brokers that these recipients have new committed deliveries;
        returns at once (the adapter sends in the background, after the commit)."""
        ...

    async def publish_taken_over(self, broker_id: str, mesh_id: str, pubkey: str,
                                 session_id: str) -> None: ...

    presence_unsent: Callable[[int], None]

    def publish_presence(self, frame: dict[str, Any]) -> None:
        """Tell the other brokers, in the background (best effort: what cannot be sent is
        counted through ``presence_unsent``)."""
        ...

    async def publish_clone(self, broker_id: str, mesh_id: str, pubkey: str, host: str,
                            new_host: str, close: bool, policy: str) -> None:
        """Ask ``broker_id`` to close (else tell) its sessions of this member from ``host``;
        ``new_host`` is the mark of the hello judged a clone of them."""
        ...

    async def session_of(self, mesh_id: str, pubkey: str, alive_after: int) -> SessionRow | None:
        """The member's live session row, if a live broker holds one."""
        ...

    async def run(self, events: ClusterEvents) -> None:
        """Hear the other brokers until cancelled, reconnecting when the channel drops."""
        ...

    async def unacked(self, keys: Sequence[Key]) -> list[tuple[str, str, int, int]]:
        """(mesh_id, pubkey, epoch, last_seq) of these recipients with unacked deliveries."""
        ...

    async def heartbeat(self, now_ms: int, stale_before: int,
                        live: Callable[[], Sequence[SessionRow]]) -> Sequence[SessionRow]:
        """Say this broker is alive. When its previous heartbeat is older than
        ``stale_before`` (an expiry may have removed its sessions while it could not reach
        the database) hold the sessions of ``live()`` again, in one statement, and return
        them; else touch nothing more (idle costs one row, whatever the members)."""
        ...

    async def claim(self, row: SessionRow) -> SessionRow | None:
        """Make ``row`` the member's session; returns the one it replaced, if any."""
        ...

    async def release(self, mesh_id: str, pubkey: str, session_id: str,
                      successor: SessionRow | None) -> bool:
        """The session ``session_id`` ended: hand the member's row to ``successor`` (another
        connection here) or delete it. False when the row is no longer this session's."""
        ...

    async def expire(self, alive_after: int) -> list[SessionRow]:
        """Delete (and return) the sessions of brokers silent since ``alive_after``."""
        ...

    async def sessions(self, mesh_id: str, alive_after: int) -> list[SessionRow]:
        """The mesh's sessions held by the other live brokers (this one's registry knows its
        own: reading them too made each connecting member's snapshot read every session of
        the mesh, 60 % of a broker's CPU in a storm of 1,000)."""
        ...

    async def save_profile(self, mesh_id: str, pubkey: str, profile: str) -> None: ...

    async def exclusively(self, job: str, fn: Callable[[], Awaitable[T]]) -> T | None:
        """Run ``fn`` unless another broker is running ``job`` now (then None)."""
        ...


class SingleBroker:
    """The embedded store's broker is the only one: nothing to tell, nothing to hear."""

    broker_id = "single"

    def publish_wake(self, keys: set[Key]) -> None:
        return None

    async def run(self, events: ClusterEvents) -> None:
        return None

    async def exclusively(self, job: str, fn: Callable[[], Awaitable[T]]) -> T | None:
        return await fn()
