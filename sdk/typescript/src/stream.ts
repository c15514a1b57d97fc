/**
 * The event stream without I/O: Server-Sent Events parsing and the resume cursor, as
 * client/stream.py. `GET /v1/events` gives every event the gapless id of the daemon's
 * event log; notices (`history_truncated`, `cursor_ahead`) have no id.
 */

/** One event of the daemon's log: `message` (an inbox entry), `peer_join`, `peer_leave`,
 * `peer_key_rotated` (a peer moved to a new key: `pubkey`, `old_pubkey`), `broker_status`,
 * `outbox_dead`, `hook_failed`, `clone_suspected`. */
export interface Event {
  kind: "event";
  id: number;
  type: string;
  data: Record<string, unknown>;
}

/** A remark about the stream itself, with no id: `history_truncated` or `cursor_ahead`. */
export interface Notice {
  kind: "notice";
  type: string;
  data: Record<string, unknown>;
}

export type StreamItem = Event | Notice;

/** Feed it the stream's lines; it returns each complete event or notice. */
export class Parser {
  private fields = new Map<string, string>();

  feed(line: string): StreamItem | undefined {
    line = line.replace(/\r?\n$/, "").replace(/\r$/, "");
    if (line !== "") {
      if (!line.startsWith(":")) { // ":" starts a comment (keepalive)
        const at = line.indexOf(":");
        const key = at < 0 ? line : line.slice(0, at);
        let value = at < 0 ? "" : line.slice(at + 1);
        if (value.startsWith(" ")) value = value.slice(1);
        this.fields.set(key, value);
      }
      return undefined;
    }
    const fields = this.fields;
    this.fields = new Map();
    const raw = fields.get("data");
    if (raw === undefined) return undefined;
    const type = fields.get("event") ?? "message";
    const data = JSON.parse(raw) as Record<string, unknown>;
    const id = fields.get("id");
    if (id !== undefined) return { kind: "event", id: Number.parseInt(id, 10), type, data };
    return { kind: "notice", type, data };
  }
}

/** The last event id passed on: what to ask for on (re)connect, and what to pass on. */
export class Cursor {
  constructor(public lastId?: number) {}

  headers(): Record<string, string> {
    const headers: Record<string, string> = { Accept: "text/event-stream" };
    if (this.lastId !== undefined) headers["Last-Event-ID"] = String(this.lastId);
    return headers;
  }

  /** Whether to pass `item` on, moving the cursor past it. */
  admit(item: StreamItem): boolean {
    if (item.kind === "notice") {
      if (item.type === "cursor_ahead") {
        // The log restarted below our id: its replay is new to us, ids and all.
        this.lastId = Number(item.data["replay_from"]) - 1;
      } else if (item.type === "history_truncated") {
        // What is gone stays gone; asking from here again would repeat the notice.
        this.lastId = Number(item.data["oldest_available"]) - 1;
      }
      return true;
    }
    if (this.lastId !== undefined && item.id <= this.lastId) return false;
    this.lastId = item.id;
    return true;
  }
}

/**
 * Whether to try again after a failed connection, and after how long: a stream that never
 * connected fails at once; one that did keeps trying, from 50 ms doubling to at most 1 s
 * apart (±25 %), as a restarting daemon needs.
 */
export class Reconnect {
  connected = false;
  failures = 0;

  constructor(private initialMs = 50, private maximumMs = 1000,
              private random: () => number = Math.random) {}

  succeeded(): void {
    this.connected = true;
    this.failures = 0;
  }

  /** Milliseconds to wait before the next attempt; `undefined`: give up. */
  delayMs(): number | undefined {
    if (!this.connected) return undefined;
    this.failures += 1;
    let base = this.initialMs;
    for (let i = 1; i < this.failures && base < this.maximumMs; i++) base *= 2;
    base = Math.min(this.maximumMs, base);
    return base * (1 + (this.random() * 2 - 1) * 0.25);
  }
}

/** How long a stream may stay quiet before it ends (`undefined`: follow forever). */
export class Quiet {
  private since: number;

  constructor(readonly limitMs?: number, private clock: () => number = () => performance.now()) {
    this.since = clock();
  }

  touch(): void {
    this.since = this.clock();
  }

  remainingMs(): number | undefined {
    if (this.limitMs === undefined) return undefined;
    return Math.max(0, this.since + this.limitMs - this.clock());
  }

  over(): boolean {
    return this.remainingMs() === 0;
  }

  /** `wantMs`, shortened so a wait never outlasts the quiet limit. */
  waitMs(wantMs: number): number {
    const left = this.remainingMs();
    return left === undefined ? wantMs : Math.min(wantMs, left);
  }
}
