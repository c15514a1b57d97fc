/**
 * `Client`: a daemon's IPC surface (docs/ipc.md) as typed calls over `node:http`, on the
 * daemon's Unix socket or loopback TCP. One connection per call (no pooling, so a daemon
 * restart never leaves a stale one behind); `events()` and `consume()` are async iterators
 * that hold theirs while they run. Failures are the error classes of `./errors.js`.
 */

import { request as httpRequest, type ClientRequest, type IncomingMessage } from "node:http";
import { resolve as resolvePath } from "node:path";

import { misfit, SDK_VERSION } from "./compat.js";
import { Endpoint, type EndpointOptions, type Environment } from "./endpoint.js";
import { DaemonNotRunning, fromBody, IncompatibleDaemon, NotFound } from "./errors.js";
import { Cursor, Parser, Quiet, Reconnect, type StreamItem } from "./stream.js";
import type {
  AckResult, BatchResult, FileEntry, FileGetResult, FileShareResult, InboxEntry, InboxPage,
  Json, Kind, Memberships, OutboxPage, PruneResult, RequeueResult, SendRequest, SendResult,
} from "./wire.js";

/** A share or get answers once the whole file has moved. */
const FILE_TIMEOUT_MS = 3_600_000;

export interface ClientOptions extends EndpointOptions {
  /** Bounds each call (not `events()` or `consume()`, which wait as long as told). */
  timeoutMs?: number;
}

export interface Response {
  status: number;
  body: unknown;
}

interface Exchange {
  req: ClientRequest;
  res: IncomingMessage;
}

export class Client {
  readonly endpoint: Endpoint;
  readonly timeoutMs: number;

  constructor(opts: ClientOptions) {
    const { timeoutMs, ...where } = opts;
    this.endpoint = new Endpoint(where);
    this.timeoutMs = timeoutMs ?? 10_000;
  }

  /**
   * The daemon of `mesh` on this host, found as the CLI finds it (`TIDEMESH_HOME`, else the
   * XDG folders); without a name, the mesh the CLI would choose. With `tcp`, loopback TCP
   * with the port from `http.port` and the token from `local_token`, both read per request.
   */
  static forMesh(mesh?: string,
                 opts: { tcp?: boolean; timeoutMs?: number; env?: Environment } = {}): Client {
    const e = Endpoint.forMesh(mesh, { tcp: opts.tcp, env: opts.env });
    return new Client({
      socketPath: e.socketPath, portFile: e.portFile, tokenFile: e.tokenFile, mesh: e.mesh,
      timeoutMs: opts.timeoutMs,
    });
  }

  // -- transport ----------------------------------------------------------------------------

  /** Send a request; resolve once the answer's headers are in (within `limitMs`). */
  private open(method: string, path: string, body: unknown, headers: Record<string, string>,
               limitMs: number): Promise<Exchange> {
    const payload = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
    let target: ReturnType<Endpoint["target"]>;
    let auth: Record<string, string>;
    try {
      target = this.endpoint.target();
      auth = this.endpoint.headers();
    } catch (exc) {
      return Promise.reject(exc);
    }
    return new Promise((resolve, reject) => {
      const req = httpRequest({
        ...target, method, path, agent: false,
        headers: {
          "Content-Type": "application/json",
          ...(payload ? { "Content-Length": String(payload.length) } : {}),
          ...auth, ...headers,
        },
      });
      const timer = setTimeout(() => req.destroy(timedOut(limitMs)), limitMs);
      req.once("response", (res) => {
        clearTimeout(timer);
        resolve({ req, res });
      });
      req.once("error", (exc) => {
        clearTimeout(timer);
        reject(this.endpoint.notRunning(exc));
      });
      req.end(payload);
    });
  }

  private async call<T>(method: string, path: string, body?: unknown,
                        headers: Record<string, string> = {},
                        timeoutMs: number = this.timeoutMs): Promise<T> {
    const started = performance.now();
    const { req, res } = await this.open(method, path, body, headers, timeoutMs);
    const left = Math.max(1, timeoutMs - (performance.now() - started));
    const timer = setTimeout(() => req.destroy(timedOut(timeoutMs)), left);
    let raw: Buffer;
    try {
      raw = await readAll(res);
    } catch (exc) {
      throw this.endpoint.notRunning(exc);
    } finally {
      clearTimeout(timer);
    }
    return answer(res, raw) as T;
  }

  /** Any route, for what has no method here; returns a 2xx, throws the error tree. */
  async request(method: string, path: string, body?: unknown,
                headers: Record<string, string> = {}): Promise<Response> {
    const { res } = await this.open(method, path, body, headers, this.timeoutMs);
    const raw = await readAll(res).catch((exc) => { throw this.endpoint.notRunning(exc); });
    return { status: res.statusCode ?? 0, body: answer(res, raw) };
  }

  // -- the daemon ---------------------------------------------------------------------------

  version(): Promise<Json> {
    return this.call("GET", "/v1/version");
  }

  /** The versions the daemon works with (`GET /v1/compat`; docs/ipc.md, "Compatibility"). */
  compat(): Promise<Json> {
    return this.call("GET", "/v1/compat");
  }

  /**
   * `compat()`, or `IncompatibleDaemon` when this SDK (at `version`, by default its own) does
   * not fit the daemon; a daemon older than the route is judged by `/v1/version`'s
   * `ipc_api`. Call it once when a program starts.
   */
  async checkCompatible(opts: { client?: string; version?: string } = {}): Promise<Json> {
    const client = opts.client ?? "typescript";
    const version = opts.version ?? SDK_VERSION;
    let doc: Json;
    try {
      doc = await this.compat();
    } catch (exc) {
      if (!(exc instanceof NotFound)) throw exc;
      const v = await this.version();
      doc = { daemon: v["daemon_version"] ?? "?", ipc_api: v["ipc_api"] };
    }
    const why = misfit(doc, client, version);
    if (why === undefined) return doc;
    const advice = why.kind === "ipc_api" ? "use a tidemesh SDK of the daemon's IPC API"
      : "upgrade (or downgrade) the SDK so that the daemon and its clients match";
    throw new IncompatibleDaemon(`${why.message}: ${advice}`, {
      kind: why.kind, daemon: doc["daemon"], client, client_version: version,
    });
  }

  health(): Promise<Json> {
    return this.call("GET", "/v1/health");
  }

  /** Prometheus text. */
  metrics(): Promise<string> {
    return this.call("GET", "/v1/metrics");
  }

  /**
   * A sealed backup of this member's identity and configuration (never the outbox or
   * inbox): the bytes of the file `tidemesh daemon restore` reads. `passphrase`: 8+ chars.
   */
  async backup(passphrase: string): Promise<Buffer> {
    const answer = await this.call<{ bundle: string }>("POST", "/v1/backup", { passphrase });
    return Buffer.from(answer.bundle, "base64");
  }

  /**
   * A new local bearer token in the token file; the old one works for `ipc.token_grace_s`
   * more (60 s by default). A TCP client reads the token file at each call, so it follows.
   */
  rotateToken(): Promise<Json> {
    return this.call("POST", "/v1/token/rotate", {});
  }

  // -- send side ----------------------------------------------------------------------------

  /**
   * Hand one message to the daemon; it is on disk when this resolves. A retry with the same
   * `idempotencyKey` (or `client_message_id`) and body is sent once.
   */
  send(message: SendRequest, idempotencyKey?: string): Promise<SendResult> {
    const headers: Record<string, string> = idempotencyKey
      ? { "Idempotency-Key": idempotencyKey } : {};
    return this.call("POST", "/v1/send", message, headers);
  }

  /**
   * Hand 1-1000 messages over in one request and one outbox transaction. One result per
   * message, in order, each what `send` would have got: a refused one fails no other.
   */
  async sendMany(messages: Iterable<SendRequest>): Promise<BatchResult[]> {
    const answer = await this.call<{ results: BatchResult[] }>(
      "POST", "/v1/send_batch", { sends: [...messages] });
    return answer.results.map((r) => r.status >= 400
      ? { ...r, error: fromBody(r.status, r.body) } : r);
  }

  outboxList(opts: { status?: string; limit?: number; before?: string } = {}
  ): Promise<OutboxPage> {
    return this.call("GET", "/v1/outbox" + query({ limit: opts.limit ?? 50, status: opts.status,
                                                   before: opts.before }));
  }

  /** One row and its requeue `chain`. */
  outboxInspect(rowId: string): Promise<Json> {
    return this.call("GET", `/v1/outbox/${encodeURIComponent(rowId)}`);
  }

  outboxRequeue(rowId: string, opts: { newClientMessageId?: string; patchPayload?: Json } = {}
  ): Promise<RequeueResult> {
    const body: Json = { id: rowId };
    if (opts.newClientMessageId) body["new_client_message_id"] = opts.newClientMessageId;
    if (opts.patchPayload !== undefined) body["patch_payload"] = opts.patchPayload;
    return this.call("POST", "/v1/outbox/requeue", body);
  }

  /** Run retention now on the `outbox`, or the `inbox` and its events. */
  prune(which: "outbox" | "inbox", opts: { dryRun?: boolean } = {}): Promise<PruneResult> {
    return this.call("POST", `/v1/${which}/prune`, { dry_run: opts.dryRun ?? false });
  }

  // -- receive side -------------------------------------------------------------------------

  /**
   * A page of the inbox; `q` keeps the entries whose text body matches that search (words,
   * "a phrase", pre*, AND/OR/NOT; docs/ipc.md, "Searching the inbox"), in seq order.
   */
  inbox(opts: { after?: number; limit?: number; topic?: string; sender?: string;
                consumer?: string; q?: string } = {}): Promise<InboxPage> {
    return this.call("GET", "/v1/inbox" + query({
      after: opts.after, limit: opts.limit ?? 100, topic: opts.topic, from: opts.sender,
      consumer: opts.consumer, q: opts.q,
    }));
  }

  ack(consumer: string, upTo: number): Promise<AckResult> {
    return this.call("POST", "/v1/inbox/ack", { consumer, up_to: upTo });
  }

  /**
   * The named consumer's entries, in order. An entry is acked when the loop asks for the
   * next one, so one the program was holding when it stopped (a throw, a `break`, a crash)
   * comes again next time. Ends after `idleTimeoutMs` with nothing new (default: never).
   */
  async *consume(name: string, opts: { limit?: number; idleTimeoutMs?: number;
                                       pollMs?: number; signal?: AbortSignal } = {}
  ): AsyncGenerator<InboxEntry, void, undefined> {
    const quiet = new Quiet(opts.idleTimeoutMs);
    while (!opts.signal?.aborted) {
      const { items } = await this.inbox({ limit: opts.limit ?? 100, consumer: name });
      if (items.length === 0) {
        if (quiet.over()) return;
        await sleep(quiet.waitMs(opts.pollMs ?? 500), opts.signal);
        continue;
      }
      for (const entry of items) {
        yield entry;
        await this.ack(name, entry.seq);
      }
      quiet.touch();
    }
  }

  /**
   * Follow `/v1/events` from after `since` (default: only new events), reconnecting on its
   * own (across daemon restarts) and resuming by `Last-Event-ID`: no event is missed or
   * given twice. Notices (no id) say something about the stream itself. Ends after
   * `idleTimeoutMs` quiet (default: never) or on `signal`; throws `DaemonNotRunning` only
   * if the first connection fails.
   */
  async *events(opts: { since?: number; idleTimeoutMs?: number; signal?: AbortSignal } = {}
  ): AsyncGenerator<StreamItem, void, undefined> {
    const cursor = new Cursor(opts.since);
    const quiet = new Quiet(opts.idleTimeoutMs);
    const again = new Reconnect();
    while (!quiet.over() && !opts.signal?.aborted) {
      let exchange: Exchange;
      try {
        exchange = await this.open("GET", "/v1/events", undefined, cursor.headers(),
                                   this.timeoutMs);
      } catch (exc) {
        const delay = exc instanceof DaemonNotRunning ? again.delayMs() : undefined;
        if (delay === undefined) throw exc;
        await sleep(quiet.waitMs(delay), opts.signal);
        continue;
      }
      again.succeeded();
      const { req, res } = exchange;
      try {
        if (res.statusCode !== 200) answer(res, await readAll(res));
        for await (const item of streamItems(req, res, quiet, opts.signal)) {
          if (cursor.admit(item)) {
            quiet.touch();
            yield item;
          }
        }
      } finally {
        req.destroy();
      }
    }
  }

  // -- files --------------------------------------------------------------------------------

  /**
   * Upload the file at `path` (made absolute) and announce it to `to` ("topic:NAME",
   * "dm:PUBKEYHEX", "queue:NAME"); resolves once uploaded and announced. A retry of the same
   * file to the same `to` resumes a cut-off upload and is announced once (docs/ipc.md, "Files").
   */
  fileShare(path: string, to: string | { kind: string; ref: string },
            opts: { message?: string; persistent?: boolean } = {}): Promise<FileShareResult> {
    const body: Json = { path: resolvePath(path), to };
    if (opts.message !== undefined) body["message"] = opts.message;
    if (opts.persistent) body["persistent"] = true;
    return this.call("POST", "/v1/file/share", body, {},
                     Math.max(this.timeoutMs, FILE_TIMEOUT_MS));
  }

  /** Fetch file `id` to `out` (made absolute), verified by its SHA-256 before `out` exists. */
  fileGet(id: string, out: string): Promise<FileGetResult> {
    return this.call("GET", "/v1/file/get" + query({ id, out: resolvePath(out) }), undefined, {},
                     Math.max(this.timeoutMs, FILE_TIMEOUT_MS));
  }

  /** File `id`'s bytes, verified by the daemon before the first one comes. */
  async *fileStream(id: string): AsyncGenerator<Buffer> {
    const { req, res } = await this.open("GET", "/v1/file/get" + query({ id }), undefined, {},
                                         Math.max(this.timeoutMs, FILE_TIMEOUT_MS));
    try {
      if ((res.statusCode ?? 0) >= 400) answer(res, await readAll(res));   // throws
      for await (const block of res) yield block as Buffer;
    } finally {
      req.destroy();
    }
  }

  /** Files this member shared or was announced, newest first. */
  fileList(opts: { limit?: number } = {}): Promise<{ files: FileEntry[] }> {
    return this.call("GET", "/v1/file/list" + query({ limit: opts.limit ?? 100 }));
  }

  // -- membership and presence --------------------------------------------------------------

  /** `topic`: subscribe, unsubscribe, create; `queue`: consume, leave. */
  membership(kind: Kind, action: string, name: string, opts: { create?: boolean } = {}
  ): Promise<Json> {
    const body: Json = { name, ...(opts.create ? { create: true } : {}) };
    return this.call("POST", `/v1/${kind}s/${action}`, body);
  }

  memberships(kind: Kind): Promise<Memberships> {
    return this.call("GET", `/v1/${kind}s`);
  }

  peers(): Promise<Json> {
    return this.call("GET", "/v1/peers");
  }

  /** This member's profile; with `patch`, change those fields first. */
  profile(patch?: Json): Promise<Json> {
    if (patch && Object.keys(patch).length > 0) return this.call("POST", "/v1/profile", patch);
    return this.call("GET", "/v1/profile");
  }
}

/** Parsed items until the stream ends, breaks, stays quiet too long, or is aborted. */
async function* streamItems(req: ClientRequest, res: IncomingMessage, quiet: Quiet,
                            signal?: AbortSignal): AsyncGenerator<StreamItem> {
  const parser = new Parser();
  let timer: NodeJS.Timeout | undefined;
  const arm = (): void => {
    const left = quiet.remainingMs();
    if (left === undefined) return;
    timer = setTimeout(() => (quiet.over() ? req.destroy() : arm()), left + 1);
  };
  const onAbort = (): void => void req.destroy();
  signal?.addEventListener("abort", onAbort);
  arm();
  res.setEncoding("utf8");
  let buffer = "";
  try {
    for await (const chunk of res as AsyncIterable<string>) {
      buffer += chunk;
      for (let nl = buffer.indexOf("\n"); nl >= 0; nl = buffer.indexOf("\n")) {
        const item = parser.feed(buffer.slice(0, nl + 1));
        buffer = buffer.slice(nl + 1);
        if (item !== undefined) yield item;
      }
    }
  } catch {
    // A timeout (quiet too long), an abort, or a dropped daemon: the caller decides.
  } finally {
    clearTimeout(timer);
    signal?.removeEventListener("abort", onAbort);
  }
}

/** The body of a 2xx; the error class of any other answer. */
function answer(res: IncomingMessage, raw: Buffer): unknown {
  const status = res.statusCode ?? 0;
  const type = String(res.headers["content-type"] ?? "");
  const text = raw.toString("utf8");
  let body: unknown = text;
  if (type.includes("json") && raw.length > 0) {
    try {
      body = JSON.parse(text);
    } catch {
      body = text;
    }
  }
  if (status >= 400) throw fromBody(status, body);
  return body;
}

function readAll(res: IncomingMessage): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    res.on("data", (c: Buffer) => chunks.push(c));
    res.once("end", () => resolve(Buffer.concat(chunks)));
    res.once("error", reject);
    res.once("aborted", () => reject(new Error("the answer was cut off")));
  });
}

function query(params: Record<string, string | number | undefined>): string {
  const kept = Object.entries(params).filter(([, v]) => v !== undefined);
  if (kept.length === 0) return "";
  return "?" + kept.map(([k, v]) => `${k}=${encodeURIComponent(String(v))}`).join("&");
}

function timedOut(ms: number): Error {
  return Object.assign(new Error(`no answer in ${ms} ms`), { code: "ETIMEDOUT" });
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const done = (): void => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal?.addEventListener("abort", done);
  });
}

