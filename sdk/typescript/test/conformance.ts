/**
 * The conformance scenario (sdk/conformance/scenario.json) run through this SDK. The Python
 * and Go SDKs run the same file; sdk/conformance/README.md defines steps, matchers and how a
 * result is observed. A runner only carries steps to its SDK and reports what came back.
 */

import { readFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import { Client, TidemeshError, type StreamItem } from "../src/index.js";

export const SCENARIO = join(resolve(dirname(fileURLToPath(import.meta.url)), "..", "..", ".."),
                             "conformance", "scenario.json");
const WAIT_MS = 30_000;

type Json = any; // eslint-disable-line @typescript-eslint/no-explicit-any
export type Step = Record<string, Json>;

export function load(): { mesh: string; daemons: Record<string, { transport: string }>;
                          steps: Step[] } {
  return JSON.parse(readFileSync(SCENARIO, "utf8"));
}

export function observedError(exc: TidemeshError): Json {
  return { kind: exc.name, code: exc.code, status: exc.status, details: exc.details };
}

/** Why `got` does not match `expect` (undefined: it does). */
export function mismatch(expect: Json, got: Json, saved: Record<string, Json>,
                         at = "$"): string | undefined {
  const isObj = (v: Json) => typeof v === "object" && v !== null && !Array.isArray(v);
  if (isObj(expect)) {
    const keys = Object.keys(expect);
    if (keys.length === 1 && keys[0]!.startsWith("$")) {
      const op = keys[0]!;
      const arg = expect[op];
      switch (op) {
        case "$ref": return mismatch(saved[arg], got, saved, at);
        case "$in":
          return (arg as Json[]).some((v) => mismatch(v, got, saved) === undefined)
            ? undefined : `${at}: ${JSON.stringify(got)} is not one of ${JSON.stringify(arg)}`;
        case "$present":
          return ((got !== undefined && got !== null) === Boolean(arg))
            ? undefined : `${at}: presence is not ${arg}`;
        case "$len":
          return Array.isArray(got) && got.length === arg
            ? undefined : `${at}: ${JSON.stringify(got)} has not ${arg} items`;
        default: throw new Error(`unknown matcher ${op}`);
      }
    }
    if (!isObj(got)) return `${at}: expected an object, got ${JSON.stringify(got)}`;
    for (const key of keys) {
      const why = mismatch(expect[key], got[key], saved, `${at}.${key}`);
      if (why) return why;
    }
    return undefined;
  }
  if (Array.isArray(expect)) {
    if (!Array.isArray(got) || got.length !== expect.length) {
      return `${at}: expected ${expect.length} items, got ${JSON.stringify(got)}`;
    }
    for (let i = 0; i < expect.length; i++) {
      const why = mismatch(expect[i], got[i], saved, `${at}[${i}]`);
      if (why) return why;
    }
    return undefined;
  }
  return expect === got ? undefined
    : `${at}: expected ${JSON.stringify(expect)}, got ${JSON.stringify(got)}`;
}

function pick(result: Json, path: string): Json {
  // A path that is not there saves nothing; the step's expect then says what came back.
  return path.split(".").reduce((v, part) => (Array.isArray(v) ? v[Number(part)] : v?.[part]),
                                result);
}

interface Stream {
  items: AsyncGenerator<StreamItem, void, undefined>;
  lastId: number;
}

export class Runner {
  readonly saved: Record<string, Json> = {};
  private streams = new Map<string, Stream>();

  constructor(private clients: Map<string, Client>,
              private restart: (label: string, kill: boolean,
                                whileDown: () => Promise<void>) => Promise<void>) {}

  async run(steps: Step[]): Promise<void> {
    for (const step of steps) {
      let got: Json;
      try {
        got = await this.observe(step);
      } catch (exc) {
        if (!(exc instanceof TidemeshError)) throw exc;
        got = { error: observedError(exc) };
      }
      for (const [name, path] of Object.entries((step["save"] ?? {}) as Record<string, string>)) {
        this.saved[name] = pick(got, path);
      }
      if ("expect" in step) {
        const why = mismatch(step["expect"], got, this.saved);
        if (why) {
          throw new Error(`step ${JSON.stringify(step["name"])}: ${why}\n got: ${JSON.stringify(got)}`);
        }
      }
    }
  }

  private arg(step: Step, key: string): Json {
    const v = step[key];
    if (typeof v === "object" && v !== null && Object.keys(v).length === 1 && "$ref" in v) {
      return this.saved[v["$ref"]];
    }
    return v;
  }

  private async observe(step: Step): Promise<Json> {
    const c = this.clients.get(step["on"])!;
    const arg = (key: string) => this.arg(step, key);
    switch (step["do"]) {
      case "wait_connected":
        return await waitFor(async () => ((await c.health())["connected"] ? true : undefined));
      case "version":
        return await c.version();
      case "subscribe":
        return await c.membership("topic", "subscribe", arg("topic"), { create: !!arg("create") });
      case "send":
        return await c.send(arg("message"), arg("idempotency_key"));
      case "send_many":
        return (await c.sendMany(arg("messages"))).map((r) => r.error
          ? { status: r.status, error: observedError(r.error) } : { status: r.status, body: r.body });
      case "outbox_inspect":
        return await c.outboxInspect(arg("id"));
      case "outbox_wait": {
        const cid = arg("client_message_id");
        return await waitFor(async () => (await c.outboxList({ status: arg("status") })).items
          .find((r) => r.client_message_id === cid));
      }
      case "outbox_requeue":
        return await c.outboxRequeue(arg("id"), { newClientMessageId: arg("new_client_message_id"),
                                                 patchPayload: arg("patch_payload") });
      case "check_compatible":
        return await c.checkCompatible({ version: arg("version") });
      case "backup": {
        const bytes = await c.backup(arg("passphrase"));
        return { magic: bytes.subarray(0, bytes.indexOf("\n")).toString("utf8") };
      }
      case "rotate_token":
        return await c.rotateToken();
      case "inbox":
        return await c.inbox({ consumer: arg("consumer"), q: arg("q") });
      case "inbox_wait": {
        const items = await waitFor(async () => {
          const page = await c.inbox({ limit: 1000 });
          return page.items.length >= arg("count") ? page.items : undefined;
        });
        return { bodies: items.map((e) => e.body) };
      }
      case "consume": {
        const bodies: string[] = [];
        const seqs: number[] = [];
        const idle = arg("idle_timeout_ms") ?? WAIT_MS;
        for await (const entry of c.consume(arg("consumer"), { idleTimeoutMs: idle })) {
          bodies.push(entry.body);
          seqs.push(entry.seq);
          if (bodies.length === arg("hold_at")) break; // stop holding it: never moved past
        }
        return { bodies, seqs };
      }
      case "events_open":
        this.streams.set(arg("stream"), {
          items: c.events({ since: arg("since"), idleTimeoutMs: WAIT_MS }), lastId: arg("since"),
        });
        return null;
      case "events_take":
        return await take(this.streams.get(arg("stream"))!, arg("messages"));
      case "events_close":
        await this.streams.get(arg("stream"))!.items.return();
        this.streams.delete(arg("stream"));
        return null;
      case "restart":
        await this.restart(step["on"], !!arg("kill"), () => this.run(arg("while_down") ?? []));
        return null;
    }
    throw new Error(`unknown step ${step["do"]}`);
  }
}

async function take(stream: Stream, messages: number): Promise<Json> {
  const got: string[] = [];
  const notices: string[] = [];
  let gapless = true;
  while (got.length < messages) {
    const next = await stream.items.next();
    if (next.done) throw new Error("the event stream ended");
    const item = next.value;
    if (item.kind === "notice") {
      notices.push(item.type);
      // Where the replay starts (docs/ipc.md, "Events").
      const key = item.type === "cursor_ahead" ? "replay_from" : "oldest_available";
      stream.lastId = Number(item.data[key]) - 1;
      continue;
    }
    gapless = gapless && item.id === stream.lastId + 1;
    stream.lastId = item.id;
    if (item.type === "message") got.push(String(item.data["body"]));
  }
  return { messages: got, gapless, notices };
}

async function waitFor<T>(probe: () => Promise<T | undefined>): Promise<T> {
  const deadline = Date.now() + WAIT_MS;
  for (;;) {
    const got = await probe();
    if (got !== undefined) return got;
    if (Date.now() > deadline) throw new Error(`not seen within ${WAIT_MS} ms`);
    await new Promise((r) => setTimeout(r, 50));
  }
}
