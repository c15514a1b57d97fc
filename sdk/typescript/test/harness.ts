/**
 * Real processes for the SDK's tests: a broker on an SQLite store and joined daemons, run by
 * the repository's `tidemesh` command (TIDEMESH_BIN, else the repository's .venv, else PATH),
 * as tests/e2e/harness.py does it. Sockets live under a short folder in /tmp.
 */

import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, openSync, readFileSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { dirname, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

import { Client, DaemonNotRunning } from "../src/index.js";

const REPO = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..", "..", "..");

export function tidemesh(): string {
  const venv = join(REPO, ".venv", "bin", "tidemesh");
  return process.env["TIDEMESH_BIN"] || (existsSync(venv) ? venv : "tidemesh");
}

function env(home: string): NodeJS.ProcessEnv {
  const kept = Object.fromEntries(
    Object.entries(process.env).filter(([k]) => !k.startsWith("TIDEMESH_") || k === "TIDEMESH_BIN"));
  // The suite runs in CI and in containers, whose defaults (no loopback TCP, no hooks, an
  // ephemeral key) are not what it tests: the daemons are pinned to a plain host.
  return { ...kept, TIDEMESH_HOME: home, TIDEMESH_LOG_FORMAT: "json",
           TIDEMESH_ENVIRONMENT_KIND: "host" };
}

function cli(home: string, ...args: string[]): string {
  const res = spawnSync(tidemesh(), args, { env: env(home), encoding: "utf8", timeout: 60_000 });
  if (res.status !== 0) {
    throw new Error(`tidemesh ${args.join(" ")} failed: ${res.error ?? ""}${res.stderr}${res.stdout}`);
  }
  return res.stdout.trim();
}

function freePort(): Promise<number> {
  return new Promise((ok, fail) => {
    const srv = createServer();
    srv.once("error", fail);
    srv.listen(0, "127.0.0.1", () => {
      const { port } = srv.address() as { port: number };
      srv.close(() => ok(port));
    });
  });
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function exited(proc: ChildProcess, ms: number): Promise<number | null> {
  if (proc.exitCode !== null || proc.signalCode !== null) return proc.exitCode;
  return await new Promise<number | null>((ok, fail) => {
    const timer = setTimeout(() => fail(new Error(`process ${proc.pid} did not exit in ${ms} ms`)),
                             ms);
    proc.once("exit", (code) => {
      clearTimeout(timer);
      ok(code);
    });
  });
}

export class Daemon {
  proc!: ChildProcess;

  constructor(readonly home: string, readonly mesh: string) {}

  get log(): string {
    return join(this.home, `${this.mesh}.out`);
  }

  get socket(): string {
    return join(this.home, "daemon", this.mesh, "sock");
  }

  /** Start `daemon up --foreground` and wait until it answers on its socket. */
  async start(timeoutMs = 30_000): Promise<void> {
    const out = openSync(this.log, "a");
    this.proc = spawn(tidemesh(), ["daemon", "up", "--foreground", "--mesh", this.mesh],
                      { env: env(this.home), stdio: ["ignore", out, out] });
    const probe = new Client({ socketPath: this.socket, timeoutMs: 1000 });
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      if (this.proc.exitCode !== null) {
        throw new Error(`daemon exited ${this.proc.exitCode}: ${this.tail()}`);
      }
      try {
        await probe.version();
        return;
      } catch (exc) {
        if (!(exc instanceof DaemonNotRunning)) throw exc;
        await sleep(30);
      }
    }
    this.proc.kill("SIGKILL");
    throw new Error(`daemon did not answer in ${timeoutMs} ms: ${this.tail()}`);
  }

  async stop(kill = false): Promise<number | null> {
    if (this.proc.exitCode !== null || this.proc.signalCode !== null) return this.proc.exitCode;
    this.proc.kill(kill ? "SIGKILL" : "SIGTERM");
    return await exited(this.proc, 20_000);
  }

  tail(): string {
    try {
      return readFileSync(this.log, "utf8").slice(-2000);
    } catch {
      return "";
    }
  }
}

/** A broker with mesh `mesh` on a fresh SQLite store, and daemons joined to it. */
export class World {
  readonly root = mkdtempSync("/tmp/tm-ts-");
  readonly daemons = new Map<string, Daemon>();
  private broker?: ChildProcess;
  private brokerHome = join(this.root, "broker");
  private store = `sqlite://${join(this.root, "broker", "broker.db")}`;
  private url = "";

  constructor(readonly mesh: string) {}

  async start(labels: string[]): Promise<void> {
    mkdirSync(this.brokerHome);
    cli(this.brokerHome, "broker", "mesh", "create", this.mesh, "--store", this.store);
    const port = await freePort();
    this.url = `ws://127.0.0.1:${port}`;
    const err = openSync(join(this.brokerHome, "broker.out"), "a");
    this.broker = spawn(tidemesh(), ["broker", "up", "--store", this.store, "--listen",
                                     `127.0.0.1:${port}`],
                        { env: env(this.brokerHome), stdio: ["ignore", "pipe", err] });
    await this.brokerReady(this.broker);
    for (const label of labels) {
      const home = join(this.root, label);
      mkdirSync(home);
      const invite = cli(this.brokerHome, "broker", "invite", "create", "--mesh", this.mesh,
                         "--uses", "1", "--url", this.url, "--store", this.store);
      cli(home, "daemon", "join", invite, "--mesh", this.mesh, "--name", label);
      const d = new Daemon(home, this.mesh);
      await d.start();
      this.daemons.set(label, d);
    }
  }

  private brokerReady(proc: ChildProcess): Promise<void> {
    return new Promise((ok, fail) => {
      const timer = setTimeout(() => fail(new Error("broker did not become ready")), 30_000);
      const lines = createInterface({ input: proc.stdout! });
      lines.on("line", (line) => {
        if (line.includes("broker_ready")) {
          clearTimeout(timer);
          ok();
        }
      });
      proc.once("exit", (code) => {
        clearTimeout(timer);
        fail(new Error(`broker exited ${code}`));
      });
    });
  }

  daemon(label: string): Daemon {
    const d = this.daemons.get(label);
    if (!d) throw new Error(`no daemon ${label}`);
    return d;
  }

  /** TIDEMESH_HOME of a daemon: what `Client.forMesh` is given to find it. */
  envOf(label: string): Record<string, string> {
    return { TIDEMESH_HOME: this.daemon(label).home };
  }

  async stop(): Promise<void> {
    for (const d of this.daemons.values()) await d.stop().catch(() => d.stop(true));
    if (this.broker && this.broker.exitCode === null) {
      this.broker.kill("SIGTERM");
      await exited(this.broker, 20_000).catch(() => this.broker?.kill("SIGKILL"));
    }
    rmSync(this.root, { recursive: true, force: true });
  }
}
