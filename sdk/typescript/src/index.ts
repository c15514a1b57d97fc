/**
 * The TypeScript SDK of a tidemesh daemon: its IPC surface (docs/ipc.md) as typed calls.
 *
 *     import { Client } from "@tidemesh/client";
 *     const client = Client.forMesh("team");
 *     await client.send({ to: "topic:ops", body: "deployed" }, "deploy-42");
 *     for await (const entry of client.consume("billing", { idleTimeoutMs: 5000 })) { ... }
 *     for await (const item of client.events({ since: 0 })) { ... }
 *
 * docs/sdk.md has the three SDKs side by side.
 */

export { Client, type ClientOptions, type Response } from "./client.js";
export { apiMajor, fits, IPC_API, misfit, parseVersion, SDK_VERSION, type MisfitKind } from "./compat.js";
export {
  daemonPaths, defaultMesh, Endpoint, joinedMeshes, startHint, type DaemonPaths,
  type EndpointOptions, type Environment,
} from "./endpoint.js";
export * from "./errors.js";
export { Cursor, Parser, Quiet, Reconnect, type Event, type Notice, type StreamItem } from "./stream.js";
export type {
  AckResult, BatchResult, Destination, FileEntry, FileGetResult, FileShareResult, InboxEntry,
  InboxPage, Json, Kind, Memberships, OutboxPage, OutboxRow, Priority, PruneResult,
  RequeueResult, SendRequest, SendResult, SharedFile,
} from "./wire.js";
