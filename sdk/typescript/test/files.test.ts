/** A file shared by one daemon and fetched by another through a real broker, with this SDK. */

import assert from "node:assert/strict";
import { readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, test } from "node:test";

import { Client, NotFound } from "../src/index.js";
import { World } from "./harness.js";

const world = new World("team");
before(async () => { await world.start(["alice", "bob"]); });
after(async () => {
  await world.stop();
  rmSync(world.root, { recursive: true, force: true });
});

async function until<T>(fn: () => Promise<T | undefined>): Promise<T> {
  const deadline = Date.now() + 30_000;
  for (;;) {
    const got = await fn();
    if (got !== undefined) return got;
    if (Date.now() > deadline) throw new Error("condition not met in 30 s");
    await new Promise((ok) => setTimeout(ok, 100));
  }
}

test("fileShare, fileList and fileGet move a file between members", async () => {
  const alice = Client.forMesh("team", { env: world.envOf("alice") });
  const bob = Client.forMesh("team", { env: world.envOf("bob") });
  await until(async () => ((await alice.health())["connected"] && (await bob.health())["connected"])
    ? true : undefined);
  await bob.membership("topic", "subscribe", "ops", { create: true });
  const src = join(world.root, "notes.txt");
  const data = "minutes ".repeat(10_000);
  writeFileSync(src, data);
  const shared = await alice.fileShare(src, "topic:ops", { message: "notes" });
  assert.equal(shared.file.size, data.length);
  assert.equal(shared.sent_chunks, shared.file.chunks);
  const entry = await until(async () => (await bob.fileList()).files.find(
    (f) => f.id === shared.file.id && f.direction === "received"));
  assert.equal(entry.message, "notes");
  const got = await bob.fileGet(shared.file.id, join(world.root, "copy.txt"));
  assert.equal(readFileSync(got.path, "utf8"), data);
  const blocks: Buffer[] = [];
  for await (const block of bob.fileStream(shared.file.id)) blocks.push(block);
  assert.equal(Buffer.concat(blocks).toString("utf8"), data);
  await assert.rejects(bob.fileGet("f".repeat(32), join(world.root, "none.txt")), NotFound);
  await assert.rejects((async () => {
    for await (const _ of bob.fileStream("f".repeat(32))) { /* nothing */ }
  })(), NotFound);
});
