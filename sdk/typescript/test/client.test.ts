/**
 * `Client` against a real lone daemon (no broker needed): typed results, the error classes,
 * TCP with the token, discovery, and the event stream's ends; and the stream's pure parts.
 */

import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";

import {
  Client, Cursor, DaemonNotRunning, defaultMesh, IdempotencyConflict, IncompatibleDaemon,
  InvalidRequest, MeshNotChosen, NotFound, Parser, Reconnect, SDK_VERSION, Unauthorized,
  type StreamItem,
} from "../src/index.js";
import { Daemon } from "./harness.js";

describe("a lone daemon", () => {
  const home = mkdtempSync("/tmp/tm-ts-");
  const daemon = new Daemon(home, "t");
  let c: Client;
  before(async () => {
    await daemon.start();
    c = Client.forMesh("t", { env: { TIDEMESH_HOME: home } });
  });
  after(async () => {
    const code = await daemon.stop();
    rmSync(home, { recursive: true, force: true });
    assert.equal(code, 0, daemon.tail());
  });

  test("a send answers a typed result and a retry binds the same row", async () => {
    const first = await c.send({ to: "topic:ops", body: "x" }, "job-1");
    const again = await c.send({ to: "topic:ops", body: "x" }, "job-1");
    assert.equal(first.status, "queued");
    assert.equal(first.client_message_id, "job-1");
    assert.equal(again.outbox_id, first.outbox_id);
    assert.deepEqual((await c.outboxList()).items.map((r) => r.id), [first.outbox_id]);
    assert.equal((await c.outboxInspect(first.outbox_id))["client_message_id"], "job-1");
    assert.equal((await c.version())["ipc_api"], "v1");
    assert.match(await c.metrics(), /cm_daemon/);
  });

  test("the daemon's error bodies arrive as their error class", async () => {
    const bad = await c.send({ to: "nowhere:x", body: "x" }).catch((e: unknown) => e);
    assert.ok(bad instanceof InvalidRequest, String(bad));
    assert.equal(bad.details["field"], "to");
    assert.equal(bad.status, 400);
    await assert.rejects(c.outboxInspect("no-such-row"), NotFound);
    await c.send({ to: "topic:ops", body: "one" }, "job-2");
    const conflict = await c.send({ to: "topic:ops", body: "other" }, "job-2")
      .catch((e: unknown) => e);
    assert.ok(conflict instanceof IdempotencyConflict);
    assert.equal(conflict.name, "IdempotencyConflict");
    assert.equal(conflict.details["conflict"], "outbox_pending_fingerprint_mismatch");
    await assert.rejects(c.sendMany([]), InvalidRequest);
  });

  test("loopback TCP needs the token, and finds the port by mesh", async () => {
    const tcp = Client.forMesh("t", { tcp: true, env: { TIDEMESH_HOME: home } });
    assert.equal((await tcp.version())["mesh"], "t");
    const wrong = join(home, "wrong-token");
    writeFileSync(wrong, "not-the-token\n");
    const where = tcp.endpoint.target();
    assert.ok("port" in where);
    await assert.rejects(new Client({ port: where.port, tokenFile: wrong }).outboxList(),
                         Unauthorized);
  });

  test("the SDK fits the daemon's compat document, and says why when it does not", async () => {
    const doc = await c.checkCompatible();
    assert.equal(doc["ipc_api"], "v1");
    assert.deepEqual(doc, await c.compat());
    const err = await c.checkCompatible({ version: "9.0.0" }).catch((e: unknown) => e);
    assert.ok(err instanceof IncompatibleDaemon, String(err));
    assert.equal(err.details["kind"], "version");
    assert.match(err.message, /typescript versions >=0\.1\.0,<0\.2\.0, and this typescript is 9\.0\.0/);
    assert.equal(SDK_VERSION, "0.1.0");
  });

  test("a rotated token: the TCP client reads the new one at its next call", async () => {
    const tcp = Client.forMesh("t", { tcp: true, env: { TIDEMESH_HOME: home } });
    const kept = join(home, "kept-token");
    writeFileSync(kept, readFileSync(tcp.endpoint.tokenFile!));
    const where = tcp.endpoint.target();
    assert.ok("port" in where);
    const holder = new Client({ port: where.port, tokenFile: kept });
    const rotated = await tcp.rotateToken();
    assert.equal(rotated["rotated"], true);
    assert.ok(Number(rotated["previous_valid_s"]) > 0);
    assert.equal(rotated["token_file"], tcp.endpoint.tokenFile);
    assert.equal((await holder.version())["mesh"], "t", "the old token is good for its grace");
    await tcp.rotateToken();   // a second rotation retires the first token at once
    await assert.rejects(holder.version(), Unauthorized);
    assert.equal((await tcp.version())["mesh"], "t");
  });

  test("an inbox search answers a page, and a query FTS5 cannot read is a 400 on q", async () => {
    assert.deepEqual((await c.inbox({ q: "deploy*" })).items, []);
    const bad = await c.inbox({ q: "disk AND" }).catch((e: unknown) => e);
    assert.ok(bad instanceof InvalidRequest, String(bad));
    assert.equal(bad.details["field"], "q");
    await assert.rejects(c.backup("short"), InvalidRequest);
  });

  test("a client found by mesh over TCP follows the daemon to its new port", async () => {
    const tcp = Client.forMesh("t", { tcp: true, env: { TIDEMESH_HOME: home } });
    const before = tcp.endpoint.target();
    assert.equal((await tcp.version())["mesh"], "t");
    assert.equal(await daemon.stop(), 0, daemon.tail());
    await assert.rejects(tcp.version(), DaemonNotRunning);
    await daemon.start();
    assert.equal((await tcp.version())["mesh"], "t");
    assert.ok("port" in before, "the port is read from http.port at each connection");
  });

  test("events end after the idle timeout, or when aborted", async () => {
    const items: StreamItem[] = [];
    for await (const item of c.events({ since: 0, idleTimeoutMs: 300 })) items.push(item);
    assert.ok(items.every((i) => i.kind === "event"));
    const stop = new AbortController();
    setTimeout(() => stop.abort(), 200);
    for await (const _ of c.events({ signal: stop.signal })) assert.fail("no new events");
  });
});

test("no daemon is DaemonNotRunning with how to start one", async () => {
  const home = mkdtempSync("/tmp/tm-ts-");
  try {
    const c = Client.forMesh("team", { env: { TIDEMESH_HOME: home } });
    const err = await c.health().catch((e: unknown) => e);
    assert.ok(err instanceof DaemonNotRunning);
    assert.equal(err.hint, "tidemesh daemon up --mesh team");
    await assert.rejects(c.events({ since: 0 }).next(), DaemonNotRunning);
    await assert.rejects(c.consume("w").next(), DaemonNotRunning);
    const tcp = Client.forMesh("team", { tcp: true, env: { TIDEMESH_HOME: home } });
    await assert.rejects(tcp.version(), DaemonNotRunning);
  } finally {
    rmSync(home, { recursive: true, force: true });
  }
});

test("the mesh is chosen as the CLI chooses it", () => {
  const home = mkdtempSync("/tmp/tm-ts-");
  const env = { TIDEMESH_HOME: home };
  const join_ = (name: string) => {
    mkdirSync(join(home, "daemon", name), { recursive: true });
    writeFileSync(join(home, "daemon", name, "mesh.json"), "{}");
  };
  try {
    assert.equal(defaultMesh(env), "default");
    join_("team");
    assert.equal(defaultMesh(env), "team");
    join_("ops");
    assert.throws(() => defaultMesh(env), MeshNotChosen);
    assert.equal(defaultMesh({ ...env, TIDEMESH_DAEMON_MESH: "ops" }), "ops");
  } finally {
    rmSync(home, { recursive: true, force: true });
  }
});

test("the stream parser and cursor: notices have no id and move the resume point", () => {
  const p = new Parser();
  const feed = (text: string) => text.split("\n").map((l) => p.feed(l + "\n"))
    .filter((x) => x !== undefined);
  const items = feed(": keepalive\n\nid: 7\nevent: message\ndata: {\"body\":\"x\"}\n\n" +
                     "event: cursor_ahead\ndata: {\"replay_from\": 1}\n");
  assert.deepEqual(items, [
    { kind: "event", id: 7, type: "message", data: { body: "x" } },
    { kind: "notice", type: "cursor_ahead", data: { replay_from: 1 } },
  ]);
  const cursor = new Cursor(7);
  assert.equal(cursor.admit(items[0]!), false, "an id already given is not given again");
  assert.equal(cursor.admit(items[1]!), true);
  assert.equal(cursor.lastId, 0);
  assert.equal(cursor.headers()["Last-Event-ID"], "0");
  const again = new Reconnect(50, 1000, () => 0.5);
  assert.equal(again.delayMs(), undefined, "a stream that never connected fails at once");
  again.succeeded();
  assert.deepEqual([1, 2, 3, 4, 5, 6].map(() => again.delayMs()), [50, 100, 200, 400, 800, 1000]);
});
