"""The one error tree. Every error has a stable snake_case ``code`` and an HTTP status.

    TidemeshError (500 internal)
    ├── InvalidRequest (400)            field named in details
    │   ├── IdempotencyKeyMismatch (400)
    │   ├── TokenInQuery (400)
    │   └── UsageError (400)            a command asked for what cannot be done as asked
    │       ├── MeshNameBound (400)     a local mesh name is bound to another mesh id
    │       └── InvalidName (400)       a mesh or session name outside core.paths' pattern
    ├── Unauthorized (401)
    ├── Forbidden (403)
    │   ├── SendVetoed (403)            the pre-send hook refused; its reason in details
    │   └── MemberRevoked (403)         an operator removed this member from the mesh
    ├── NotFound (404)
    │   └── UnknownDestination (404)    broker B2: no such topic, DM recipient or queue
    ├── MethodNotAllowed (405)
    ├── Conflict (409)                  generic state conflict (requeue of a done row, ...)
    │   ├── IdempotencyConflict (409)   the accept table's 409 rows; final for that id
    │   └── NotJoined (409)             the daemon has joined no mesh: no broker to ask
    ├── PayloadTooLarge (413)
    ├── Busy (429)
    ├── RateLimited (429)               broker: the member's send budget is spent; retryable
    ├── Unavailable (503)
    └── InsufficientStorage (507)

The wire shape is ``{"error": {"code": ..., "message": ..., **details}}``; ``to_body`` makes it.
Classes of other modules join the tree by subclassing (``settings.ConfigError``,
``paths.MeshNotChosen``, ``wire.InvalidFrame``, the SDK's ``DaemonNotRunning`` and
``DaemonNotAnswering``, the CLI's ``ServiceError``); ``from_body`` finds any of them by its
code, walking the classes themselves (tests/core/test_errors.py walks every one).
"""

from __future__ import annotations

from typing import Any, ClassVar


class TidemeshError(Exception):
    code: ClassVar[str] = "internal"
    http_status: ClassVar[int] = 500

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def to_body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, **self.details}}


class InvalidRequest(TidemeshError):
    code = "invalid_request"
    http_status = 400


class UnsafeTarget(InvalidRequest):
    """A path the daemon will not write to (``core.targets``): not a regular file of its
    own, or a name no file system here can hold."""

    code = "unsafe_target"


class IdempotencyKeyMismatch(InvalidRequest):
    code = "idempotency_key_mismatch"


class TokenInQuery(InvalidRequest):
    code = "token_in_query"


class UsageError(InvalidRequest):
    """What a command line asked for cannot be done as asked; nothing was sent or changed
    (the CLI exits 2, as for bad flags)."""

    code = "usage_error"


class MeshNameBound(UsageError):
    """``daemon join`` under a local mesh name already bound to another mesh id: re-binding
    it is an explicit act (DESIGN §11)."""

    code = "mesh_name_bound"


class InvalidName(UsageError):
    """A mesh (or session) name that does not fit the one pattern of ``core.paths``: such a
    name could climb out of the home once made a folder, so nothing is built from it."""

    code = "invalid_name"


class AmbiguousMember(InvalidRequest):
    """A DM's ``@name`` or key prefix fits several members (``core/names``)."""

    code = "ambiguous_member"


class Unauthorized(TidemeshError):
    code = "unauthorized"
    http_status = 401


class Forbidden(TidemeshError):
    code = "forbidden"
    http_status = 403


class SendVetoed(Forbidden):
    code = "send_vetoed"


class MemberRevoked(Forbidden):
    code = "member_revoked"


class NotFound(TidemeshError):
    code = "not_found"
    http_status = 404


class UnknownDestination(NotFound):
    code = "unknown_destination"


class UnknownMember(NotFound):
    """A DM's ``@name`` or key prefix fits no member the daemon knows (``core/names``)."""

    code = "unknown_member"


class MethodNotAllowed(TidemeshError):
    code = "method_not_allowed"
    http_status = 405


class Conflict(TidemeshError):
    code = "conflict"
    http_status = 409


class IdempotencyConflict(Conflict):
    code = "idempotency_key_reused"


class NotJoined(Conflict):
    """A route that asks the broker, on a daemon that has joined no mesh: unlike 503, no
    wait makes it true; a join (and a restart) does."""

    code = "not_joined"


class BackupError(InvalidRequest):
    """A backup bundle that cannot be used (docs/operations.md, backup and restore)."""

    code = "backup_unusable"


class WrongPassphrase(BackupError):
    code = "backup_wrong_passphrase"


class BackupDamaged(BackupError):
    code = "backup_damaged"


class BackupTooNew(BackupError):
    code = "backup_schema_too_new"


class RestoreRefused(BackupError):
    code = "restore_refused"


class PayloadTooLarge(TidemeshError):
    code = "payload_too_large"
    http_status = 413


class Busy(TidemeshError):
    code = "daemon_busy"
    http_status = 429


class RateLimited(TidemeshError):
    """Over the member's token bucket: retry the same send after ``retry_after_ms``."""

    code = "rate_limited"
    http_status = 429

    def __init__(self, message: str, retry_after_ms: int = 0, **details: Any) -> None:
        super().__init__(message, retry_after_ms=retry_after_ms, **details)
        self.retry_after_ms = retry_after_ms


class Unavailable(TidemeshError):
    code = "unavailable"
    http_status = 503


class InsufficientStorage(TidemeshError):
    code = "insufficient_storage"
    http_status = 507


def error_classes() -> list[type[TidemeshError]]:
    """Every class of the tree, walked from the classes themselves: one defined anywhere
    (``client``'s ``DaemonNotRunning``, ``settings``' ``ConfigError``, ...) is known once its
    module is imported, and no list can fall behind a new class."""
    found: list[type[TidemeshError]] = []
    todo: list[type[TidemeshError]] = [TidemeshError]
    while todo:
        cls = todo.pop()
        if cls not in found:
            found.append(cls)
            todo.extend(cls.__subclasses__())
    return found


def class_of(code: str) -> type[TidemeshError]:
    """The class whose wire ``code`` this is; ``TidemeshError`` for a code none has."""
    return next((c for c in error_classes() if c.code == code), TidemeshError)


def from_body(status: int, body: Any) -> TidemeshError:
    """Rebuild an error from a wire body (used by clients); unknown codes keep their text."""
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict):
        return TidemeshError(f"HTTP {status} with no error body", status=status)
    details = {k: v for k, v in err.items() if k not in ("code", "message")}
    cls = class_of(str(err.get("code")))
    exc = cls(str(err.get("message", "")), **details)
    if cls is TidemeshError and err.get("code") != TidemeshError.code:
        exc.details.setdefault("code", err.get("code"))
        exc.details.setdefault("status", status)
    return exc
