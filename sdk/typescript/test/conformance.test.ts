import assert from "node:assert/strict";
import { test } from "node:test";

import { Client } from "../src/index.js";
import { load, mismatch, Runner } from "./conformance.js";
import { World } from "./harness.js";

test("the TypeScript SDK passes the conformance scenario", { timeout: 300_000 }, async () => {
  const scenario = load();
  const world = new World(scenario.mesh);
  try {
    await world.start(Object.keys(scenario.daemons));
    const clients = new Map(Object.entries(scenario.daemons).map(([label, how]) => [
      label,
      Client.forMesh(scenario.mesh, { tcp: how.transport === "tcp", env: world.envOf(label) }),
    ]));
    const restart = async (label: string, kill: boolean, whileDown: () => Promise<void>) => {
      const d = world.daemon(label);
      const code = await d.stop(kill);
      if (!kill) assert.equal(code, 0, d.tail());
      await whileDown();
      await d.start();
    };
    await new Runner(clients, restart).run(scenario.steps);
  } finally {
    await world.stop();
  }
});

test("the matchers say what differs", () => {
  const saved = { row: "01J" };
  assert.equal(mismatch({ a: { $ref: "row" }, b: [1, { $in: [2, 3] }] },
                        { a: "01J", b: [1, 3], extra: true }, saved), undefined);
  assert.equal(mismatch({ a: { $ref: "row" } }, { a: "02K" }, saved),
               '$.a: expected "01J", got "02K"');
  assert.notEqual(mismatch({ items: { $len: 0 } }, { items: [1] }, saved), undefined);
  assert.equal(mismatch({ x: { $present: true } }, {}, saved), "$.x: presence is not true");
  assert.notEqual(mismatch(["a"], ["a", "b"], saved), undefined);
});
