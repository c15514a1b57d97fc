/**
 * Where a daemon listens and how to authenticate to it, found as the CLI finds it
 * (core/paths.py): `TIDEMESH_HOME=DIR` puts mesh M's files under `DIR/daemon/M/`; without
 * it the XDG folders are used. The Unix socket needs no token (its mode is the gate);
 * loopback TCP needs `Authorization: Bearer <local_token>`, read at each request.
 */

import { readdirSync, readFileSync, statSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";

import { DaemonNotRunning, MeshNotChosen } from "./errors.js";

export const LOOPBACK = "127.0.0.1";
export const DEFAULT_MESH = "default";

export type Environment = Record<string, string | undefined>;

export interface DaemonPaths {
  dataDir: string;
  runtimeDir: string;
  socket: string;
  tokenFile: string;
  portFile: string;
}

export function daemonPaths(mesh: string, env: Environment = process.env): DaemonPaths {
  const home = env["TIDEMESH_HOME"];
  let dataDir: string;
  let runtimeDir: string;
  if (home) {
    dataDir = runtimeDir = join(expandUser(home), "daemon", mesh);
  } else {
    const userHome = env["HOME"] ? expandUser(env["HOME"]) : homedir();
    const uid = process.getuid?.() ?? 0;
    const data = env["XDG_DATA_HOME"] || join(userHome, ".local", "share");
    const runtime = env["XDG_RUNTIME_DIR"] || `/tmp/tidemesh-${uid}`;
    dataDir = join(data, "tidemesh", "daemon", mesh);
    runtimeDir = join(runtime, "tidemesh", "daemon", mesh);
  }
  return {
    dataDir,
    runtimeDir,
    socket: join(runtimeDir, "sock"),
    tokenFile: join(runtimeDir, "local_token"),
    portFile: join(runtimeDir, "http.port"),
  };
}

/** The meshes this user has joined on this host (each has a `mesh.json`), by name. */
export function joinedMeshes(env: Environment = process.env): string[] {
  const root = join(daemonPaths(DEFAULT_MESH, env).dataDir, "..");
  try {
    return readdirSync(root)
      .filter((name) => isFile(join(root, name, "mesh.json")))
      .sort();
  } catch {
    return [];
  }
}

/**
 * `TIDEMESH_DAEMON_MESH`, else the only joined mesh, else `default` (when it is joined or
 * nothing is); several joined and none named is `MeshNotChosen`, as in the CLI.
 */
export function defaultMesh(env: Environment = process.env): string {
  const asked = env["TIDEMESH_DAEMON_MESH"];
  if (asked) return asked;
  const joined = joinedMeshes(env);
  if (joined.length === 1) return joined[0] as string;
  if (joined.length === 0 || joined.includes(DEFAULT_MESH)) return DEFAULT_MESH;
  throw new MeshNotChosen(
    `several meshes are joined (${joined.join(", ")}); say which with --mesh or ` +
      "TIDEMESH_DAEMON_MESH",
    {},
  );
}

export function startHint(mesh?: string): string {
  return "tidemesh daemon up" + (mesh && mesh !== DEFAULT_MESH ? ` --mesh ${mesh}` : "");
}

/** Either a Unix socket, or loopback TCP with the token file. */
export interface EndpointOptions {
  socketPath?: string;
  /** A fixed TCP port. */
  port?: number;
  /** The daemon's `http.port` file, read at each connection (the port changes on restart). */
  portFile?: string;
  tokenFile?: string;
  mesh?: string;
}

export class Endpoint {
  readonly socketPath?: string;
  readonly port?: number;
  readonly portFile?: string;
  readonly tokenFile?: string;
  readonly mesh?: string;

  constructor(opts: EndpointOptions) {
    const tcp = opts.port !== undefined || opts.portFile !== undefined;
    if ((opts.socketPath === undefined) === !tcp) {
      throw new TypeError("give either socketPath or port (with tokenFile), not both");
    }
    if (tcp && opts.tokenFile === undefined) {
      throw new TypeError("a TCP endpoint needs tokenFile (the daemon's local_token)");
    }
    Object.assign(this, opts);
  }

  /** The daemon of `mesh` on this host, found as the CLI finds it. */
  static forMesh(mesh?: string, opts: { tcp?: boolean; env?: Environment } = {}): Endpoint {
    const env = opts.env ?? process.env;
    const name = mesh || defaultMesh(env);
    const paths = daemonPaths(name, env);
    if (!opts.tcp) return new Endpoint({ socketPath: paths.socket, mesh: name });
    return new Endpoint({ portFile: paths.portFile, tokenFile: paths.tokenFile, mesh: name });
  }

  get where(): string {
    if (this.socketPath !== undefined) return this.socketPath;
    return `${LOOPBACK}:${this.port ?? `(${this.portFile})`}`;
  }

  /** Where to connect now: the socket, or the loopback port. */
  target(): { socketPath: string } | { host: string; port: number } {
    if (this.socketPath !== undefined) return { socketPath: this.socketPath };
    if (this.port !== undefined) return { host: LOOPBACK, port: this.port };
    const file = this.portFile as string;
    let port: number;
    try {
      port = Number.parseInt(readFileSync(file, "ascii").trim(), 10);
    } catch (exc) {
      throw new DaemonNotRunning(`no daemon publishes a TCP port in ${file}`,
                                 startHint(this.mesh));
    }
    if (!Number.isInteger(port)) {
      throw new DaemonNotRunning(`no daemon publishes a TCP port in ${file}`,
                                 startHint(this.mesh));
    }
    return { host: LOOPBACK, port };
  }

  /** Authentication for this listener: none on the socket, the bearer token on TCP. */
  headers(): Record<string, string> {
    if (this.tokenFile === undefined) return {};
    let token: string;
    try {
      token = readFileSync(this.tokenFile, "ascii").trim();
    } catch (exc) {
      throw new DaemonNotRunning(
        `cannot read the daemon's token ${this.tokenFile}: ${(exc as Error).message}`,
        startHint(this.mesh));
    }
    return { Authorization: `Bearer ${token}` };
  }

  /** The one error for "nothing answers here", with how to start a daemon. */
  notRunning(exc: unknown): DaemonNotRunning {
    const code = (exc as NodeJS.ErrnoException | undefined)?.code;
    const what = code === "ENOENT" || code === "ECONNREFUSED"
      ? `no daemon answers on ${this.where}`
      : `the daemon on ${this.where} did not answer: ${(exc as Error)?.message || code}`;
    return new DaemonNotRunning(what, startHint(this.mesh));
  }
}

function expandUser(path: string): string {
  return path === "~" || path.startsWith("~/") ? join(homedir(), path.slice(1)) : path;
}

function isFile(path: string): boolean {
  try {
    return statSync(path).isFile();
  } catch {
    return false;
  }
}
