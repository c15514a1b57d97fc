"""The rotation's state machine (``daemon/membership/key_rotation.py``), without sockets:
every state a crash can leave, and what each kind of run does next."""

from __future__ import annotations

import pytest

from tidemesh.daemon.membership.key_rotation import Action, Knows, State, next_action

OLD, NEW = "a" * 64, "b" * 64


def state(**kw: object) -> State:
    base: dict[str, object] = {"pending_new": NEW, "current": OLD, "mesh_pubkey": OLD,
                               "archived_old": False}
    base.update(kw)
    return State(**base)  # type: ignore[arg-type]


def test_nothing_pending_is_done() -> None:
    assert next_action(state(pending_new=None)) is Action.DONE


@pytest.mark.parametrize("forward", [True, False])
def test_with_the_old_key_in_use_the_broker_is_asked_first(forward: bool) -> None:
    assert next_action(state(forward=forward)) is Action.PROBE


@pytest.mark.parametrize(("knows", "forward", "action"), [
    (Knows.OLD, True, Action.ROTATE),          # rotate-keypair carries it on
    (Knows.OLD, False, Action.ROLL_BACK),      # daemon up: the broker never saw it
    (Knows.NEW, True, Action.ARCHIVE),         # the broker made it: finish, either run
    (Knows.NEW, False, Action.ARCHIVE),
    (Knows.UNREACHABLE, True, Action.WAIT),
    (Knows.UNREACHABLE, False, Action.WAIT),
    (Knows.NEITHER, True, Action.LOST),
])
def test_what_the_broker_knows_decides(knows: Knows, forward: bool, action: Action) -> None:
    assert next_action(state(broker=knows, forward=forward)) is action


def test_after_the_archive_the_key_is_promoted_then_the_pending_file_cleared() -> None:
    assert next_action(state(broker=Knows.NEW, archived_old=True)) is Action.PROMOTE
    # Promoted (keypair.json names the new key) but mesh.json not yet: no broker needed.
    assert next_action(state(current=NEW, archived_old=True)) is Action.PROMOTE
    assert next_action(state(current=NEW, mesh_pubkey=NEW, archived_old=True)) is Action.CLEAR
