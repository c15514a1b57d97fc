/** `tidemesh mcp` driven by the TypeScript MCP SDK's stdio client against a real daemon. */

import assert from "node:assert/strict";
import { rmSync } from "node:fs";
import { after, before, test } from "node:test";

import { Client as McpClient } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

import { tidemesh, World } from "./harness.js";

const world = new World("team");
before(async () => { await world.start(["alice"]); });
after(async () => {
  await world.stop();
  rmSync(world.root, { recursive: true, force: true });
});

test("the TypeScript MCP client lists the mesh_ tools and calls one", async () => {
  const env: Record<string, string> = {};
  for (const [k, v] of Object.entries(process.env)) {
    if (v !== undefined && !k.startsWith("TIDEMESH_")) env[k] = v;
  }
  const transport = new StdioClientTransport({
    command: tidemesh(), args: ["mcp", "--mesh", "team", "--session", "ts"],
    env: { ...env, ...world.envOf("alice"), TIDEMESH_ENVIRONMENT_KIND: "host" },
    stderr: "ignore",
  });
  const client = new McpClient({ name: "ts-test", version: "0.0.0" });
  await client.connect(transport);
  try {
    const caps = client.getServerCapabilities();
    assert.ok(caps?.experimental?.["claude/channel"] !== undefined);
    const names = (await client.listTools()).tools.map((t) => t.name);
    assert.ok(names.includes("mesh_send") && names.every((n) => n.startsWith("mesh_")));
    const res = await client.callTool({ name: "mesh_inbox", arguments: { peek: true } });
    assert.notEqual(res.isError, true);
    assert.deepEqual((res.structuredContent as { messages: unknown[] }).messages, []);
    const bad = await client.callTool({ name: "mesh_send", arguments: { to: 5 } });
    assert.equal(bad.isError, true);
  } finally {
    await client.close();
  }
});
