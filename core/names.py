"""Members named the way a person names them: ``@bob``, a key prefix, or the full key.

A DM's ``to.ref`` may be a display name (``@bob``) or a prefix of at least 16 hex digits of
a member's key; it is resolved to the full key at accept, before any outbox row is made (so
a refused name consumes no id and a retry by name and by key is the same send). The
directory it is resolved against is what the daemon knows (the adapter gathers it): the
members connected now and everyone whose messages are in the inbox. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from tidemesh.core.errors import AmbiguousMember, UnknownMember
from tidemesh.core.record import record

PREFIX_MIN = 16
_PREFIX = re.compile(r"[0-9a-f]{16,63}")   # PREFIX_MIN or more, short of a whole key
_KEY = re.compile(r"[0-9a-f]{64}")
# A display name after the @: any printable text (names are shown, not parsed).
_NAME = re.compile(r"@[^\x00-\x1f\x7f]{1,128}")
# How many candidates an error names: enough to choose from, not a member list dump.
SHOWN = 10


@record
class Known:
    """One member the daemon knows of: its key and the display name it goes by (if any)."""

    pubkey: str
    name: str | None


def is_key(ref: str) -> bool:
    return _KEY.fullmatch(ref) is not None


def is_name_ref(ref: str) -> bool:
    """A ref to resolve: ``@name`` or a key prefix (a full key needs no resolving)."""
    return _NAME.fullmatch(ref) is not None or _PREFIX.fullmatch(ref) is not None


def short(pubkey: str) -> str:
    """A key as people read it: its first 16 hex digits (enough to resolve it back)."""
    return pubkey[:PREFIX_MIN]


def label(known: Known) -> str:
    return f"@{known.name} ({short(known.pubkey)})" if known.name else short(known.pubkey)


def shown_names(members: Iterable[Known]) -> dict[str, str]:
    """How each key's display name is shown where several members appear: the name alone
    when no other key goes by it, else with the key prefix (``bob (0123…)``), so that two
    members that took one name can be told apart. A key without a name is not listed."""
    keys: dict[str, set[str]] = {}
    for k in members:
        if k.name:
            keys.setdefault(k.name, set()).add(k.pubkey)
    return {key: name if len(held) == 1 else f"{name} ({short(key)})"
            for name, held in keys.items() for key in held}


def resolve(ref: str, directory: Iterable[Known]) -> str:
    """The one member key ``ref`` names; 400 ``ambiguous_member`` or 404 ``unknown_member``
    naming the candidates otherwise."""
    members = _dedupe(directory)
    if ref.startswith("@"):
        wanted = ref[1:]
        hits = [k for k in members if k.name == wanted]
        if not hits:   # a name typed in another case is a near miss worth offering
            near = [k for k in members if k.name and k.name.casefold() == wanted.casefold()]
            raise _unknown(ref, near or members)
    else:
        hits = [k for k in members if k.pubkey.startswith(ref)]
        if not hits:
            raise _unknown(ref, members)
    if len(hits) > 1:
        raise AmbiguousMember(
            f"{ref} names {len(hits)} members; give a longer key prefix or the full key",
            field="to.ref", candidates=[_candidate(k) for k in hits[:SHOWN]])
    return hits[0].pubkey


def _dedupe(directory: Iterable[Known]) -> list[Known]:
    """One entry per key; a live name (listed first by the adapter) wins over an old one."""
    seen: dict[str, Known] = {}
    for k in directory:
        if k.pubkey not in seen or (seen[k.pubkey].name is None and k.name):
            seen[k.pubkey] = k
    return sorted(seen.values(), key=lambda k: (k.name or "", k.pubkey))


def _unknown(ref: str, candidates: list[Known]) -> UnknownMember:
    return UnknownMember(
        f"no member this daemon knows is {ref} (it knows the members connected now and "
        "those whose messages are in its inbox); give the full key to send to another",
        field="to.ref", candidates=[_candidate(k) for k in candidates[:SHOWN]])


def _candidate(k: Known) -> dict[str, str | None]:
    return {"pubkey": k.pubkey, "display_name": k.name, "label": label(k)}
