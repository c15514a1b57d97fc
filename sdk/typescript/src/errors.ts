/**
 * The one error tree of tidemesh (core/errors.py), rebuilt from the daemon's error body
 * `{"error": {"code", "message", ...details}}`. Each class has the same name and `code` as
 * its Python twin; `details` keeps every other field of the body (`field`, `conflict`, ...).
 */

export type Details = Record<string, unknown>;

export class TidemeshError extends Error {
  static readonly code: string = "internal";
  static readonly httpStatus: number = 500;
  /** The wire code; for a code this SDK does not know, the code the daemon sent. */
  readonly code: string;
  /** The HTTP status of the answer (the class's own when not from an answer). */
  readonly status: number;
  readonly details: Details;

  constructor(message: string, details: Details = {}, status?: number, code?: string) {
    super(message);
    const cls = new.target as unknown as typeof TidemeshError;
    this.name = new.target.name;
    this.code = code ?? cls.code;
    this.status = status ?? cls.httpStatus;
    this.details = details;
  }
}

export class InvalidRequest extends TidemeshError {
  static override readonly code: string = "invalid_request";
  static override readonly httpStatus: number = 400;
}
export class IdempotencyKeyMismatch extends InvalidRequest {
  static override readonly code: string = "idempotency_key_mismatch";
}
export class TokenInQuery extends InvalidRequest {
  static override readonly code: string = "token_in_query";
}
export class MeshNotChosen extends InvalidRequest {
  static override readonly code: string = "mesh_not_chosen";
}
/** A mesh or session name outside the one name pattern (it would become a path). */
export class InvalidName extends InvalidRequest {
  static override readonly code: string = "invalid_name";
}
export class Unauthorized extends TidemeshError {
  static override readonly code: string = "unauthorized";
  static override readonly httpStatus: number = 401;
}
export class Forbidden extends TidemeshError {
  static override readonly code: string = "forbidden";
  static override readonly httpStatus: number = 403;
}
export class SendVetoed extends Forbidden {
  static override readonly code: string = "send_vetoed";
}
export class MemberRevoked extends Forbidden {
  static override readonly code: string = "member_revoked";
}
export class NotFound extends TidemeshError {
  static override readonly code: string = "not_found";
  static override readonly httpStatus: number = 404;
}
export class UnknownDestination extends NotFound {
  static override readonly code: string = "unknown_destination";
}
export class UnknownMember extends NotFound {
  static override readonly code: string = "unknown_member";
}
export class AmbiguousMember extends InvalidRequest {
  static override readonly code: string = "ambiguous_member";
}
export class MethodNotAllowed extends TidemeshError {
  static override readonly code: string = "method_not_allowed";
  static override readonly httpStatus: number = 405;
}
export class Conflict extends TidemeshError {
  static override readonly code: string = "conflict";
  static override readonly httpStatus: number = 409;
}
/** The accept table's 409 rows: final for that id; `details.conflict` says which row. */
export class IdempotencyConflict extends Conflict {
  static override readonly code: string = "idempotency_key_reused";
}
export class PayloadTooLarge extends TidemeshError {
  static override readonly code: string = "payload_too_large";
  static override readonly httpStatus: number = 413;
}
export class Busy extends TidemeshError {
  static override readonly code: string = "daemon_busy";
  static override readonly httpStatus: number = 429;
}
export class RateLimited extends TidemeshError {
  static override readonly code: string = "rate_limited";
  static override readonly httpStatus: number = 429;
}
export class Unavailable extends TidemeshError {
  static override readonly code: string = "unavailable";
  static override readonly httpStatus: number = 503;
}
export class InsufficientStorage extends TidemeshError {
  static override readonly code: string = "insufficient_storage";
  static override readonly httpStatus: number = 507;
}

/**
 * Nothing answers where the daemon should be: no socket, refused, or no answer in time.
 * `hint` is the command that starts one, `reason` the message without it.
 */
export class DaemonNotRunning extends TidemeshError {
  static override readonly code: string = "daemon_not_running";
  static override readonly httpStatus: number = 503;
  readonly reason: string;
  readonly hint: string;

  constructor(reason: string, hint = "tidemesh daemon up", details: Details = {}) {
    super(`${reason}; start it with \`${hint}\``, details);
    this.reason = reason;
    this.hint = hint;
  }
}

/**
 * The daemon that answers does not work with this SDK (`GET /v1/compat`): another IPC API
 * major, or this SDK's version outside the daemon's range. `details.kind` is `ipc_api` or
 * `version`; the message names both versions. Raised by `checkCompatible()`, never sent.
 */
export class IncompatibleDaemon extends TidemeshError {
  static override readonly code: string = "incompatible_daemon";
  static override readonly httpStatus: number = 409;
}

const CLASSES: (typeof TidemeshError)[] = [
  TidemeshError, InvalidRequest, IdempotencyKeyMismatch, TokenInQuery, MeshNotChosen,
  InvalidName, Unauthorized, Forbidden, SendVetoed, MemberRevoked, NotFound, UnknownDestination, UnknownMember, AmbiguousMember,
  MethodNotAllowed, Conflict, IdempotencyConflict, PayloadTooLarge, Busy, RateLimited,
  Unavailable, InsufficientStorage,
];
const BY_CODE = new Map(CLASSES.map((cls) => [cls.code, cls]));

/** The error class of a wire body; an unknown code keeps its code and text. */
export function fromBody(status: number, body: unknown): TidemeshError {
  const err = isObject(body) ? body["error"] : undefined;
  if (!isObject(err)) {
    return new TidemeshError(`HTTP ${status} with no error body`, { status }, status);
  }
  const details: Details = {};
  for (const [k, v] of Object.entries(err)) {
    if (k !== "code" && k !== "message") details[k] = v;
  }
  const code = String(err["code"]);
  const cls = BY_CODE.get(code) ?? TidemeshError;
  return new cls(String(err["message"] ?? ""), details, status, code);
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}
