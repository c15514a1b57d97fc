/**
 * The JSON bodies of the IPC surface (docs/ipc.md), typed; each mirrors its schema in
 * `schemas/`. They stay plain objects, so a newer daemon's extra fields pass through.
 */

export type Priority = "now" | "next" | "low";
export type Kind = "topic" | "queue";

export interface Destination {
  kind: "topic" | "dm" | "queue";
  ref: string;
}

/** `to` is `{kind, ref}` or the short form `"topic:ops"`, `"dm:<hex>"`, `"queue:jobs"`. */
export interface SendRequest {
  to: Destination | string;
  body: string;
  body_encoding?: "utf8" | "base64";
  priority?: Priority;
  meta?: Record<string, unknown> | null;
  reply_to?: string | null;
  client_message_id?: string;
  /** W3C trace context (docs/ipc.md); the daemon makes one when absent. */
  traceparent?: string;
}

/**
 * 202 `queued`/`inflight`: on disk, will be sent. 200 `done` with `duplicate`: this id was
 * already delivered, as `broker_message_id`.
 */
export interface SendResult {
  client_message_id: string;
  outbox_id: string;
  status: "queued" | "inflight" | "done";
  duplicate?: boolean;
  broker_message_id?: string | null;
  history_id?: string | null;
}

/**
 * One send of `sendMany`: the `status` and `body` `send` would have got. For a refused
 * message (400, 403, 409) `error` is the error `send` would have thrown.
 */
export interface BatchResult {
  status: number;
  body: SendResult | { error: Record<string, unknown> };
  error?: import("./errors.js").TidemeshError;
}

export interface RequeueResult {
  aborted_row_id: string;
  new_row_id: string;
  new_client_message_id: string;
}

export interface PruneResult {
  dry_run: boolean;
  deleted: number;
  events_deleted?: number;
  skipped?: string;
}

export interface OutboxRow {
  id: string;
  client_message_id: string;
  status: "pending" | "inflight" | "done" | "dead" | "aborted";
  [field: string]: unknown;
}

export interface OutboxPage {
  items: OutboxRow[];
  counts: Record<string, number>;
}

export interface InboxEntry {
  seq: number;
  id: string;
  mesh: string;
  from: string;
  sender_name?: string | null;
  client_message_id: string;
  broker_message_id: string;
  to: Destination;
  body: string;
  body_encoding: "utf8" | "base64";
  priority: Priority;
  meta: Record<string, unknown> | null;
  reply_to: string | null;
  sent_at: number;
  received_at: number;
  delivery: { epoch: number; seq: number };
  traceparent?: string | null;
}

/**
 * A page (`next_after` to read on), or a named consumer's entries (`consumer`, `cursor`,
 * and `lost` when retention removed entries it had not acked).
 */
export interface InboxPage {
  items: InboxEntry[];
  next_after?: number;
  /** The byte budget (10 MiB) ended the page before `limit`: read on after `next_after`. */
  more?: boolean;
  consumer?: string;
  cursor?: number;
  lost?: { count: number; through_seq: number };
}

export interface AckResult {
  consumer: string;
  cursor: number;
}

export interface Memberships {
  kind: Kind;
  items: { name: string; since: number }[];
}

export type Json = Record<string, unknown>;

/** A shared file as the daemon describes it (docs/ipc.md, "Files"). */
export interface SharedFile {
  id: string;
  name: string;
  size: number;
  sha256: string;
  chunk_size: number;
  chunks: number;
  persistent: boolean;
  sealed: boolean;
}

export interface FileShareResult {
  file: SharedFile;
  announcement: SendResult;
  resumed_from: number;
  sent_chunks: number;
}

export interface FileGetResult {
  file: SharedFile;
  path: string;
  resumed_from: number;
}

export interface FileEntry extends SharedFile {
  direction: "shared" | "received";
  from: string;
  to: { kind: string; ref: string };
  message: string | null;
  created_at: number;
}
