/**
 * Which versions work together: the check `Client.checkCompatible()` makes against a daemon's
 * `GET /v1/compat` (docs/ipc.md, "Compatibility"). Pure; the cases of
 * `sdk/conformance/compat.json` keep it answering as the Python and Go SDKs do.
 *
 * A range is comma-separated clauses that must all hold: `>=0.1.0`, `<0.2.0`, `==0.1.3`, or a
 * pattern such as `0.1.x` (`*` is any version). A client refuses a daemon of another IPC API
 * major, and a daemon whose range for this client leaves this client's version out.
 */

/** This SDK's version, as the daemon's `compatible_sdks.typescript` range judges it. */
export const SDK_VERSION = "0.1.0";
/** The IPC API this SDK speaks. */
export const IPC_API = "v1";

type Version = [number, number, number];

const CLAUSE = /^(>=|<=|==|>|<)?\s*([0-9x*][0-9a-zA-Z.*+-]*)$/;

/** `1.2.3` (a pre-release or build suffix ignored) as numbers; undefined when not one. */
export function parseVersion(text: string): Version | undefined {
  const m = /^v?(\d+)(?:\.(\d+))?(?:\.(\d+))?/.exec(text.trim());
  if (m === null) return undefined;
  return [Number(m[1]), Number(m[2] ?? 0), Number(m[3] ?? 0)];
}

/** Whether `version` is in `range`; false for a version or range not understood. */
export function fits(range: string, version: string): boolean {
  const parsed = parseVersion(version);
  const clauses = range.split(",").map((c) => c.trim()).filter((c) => c !== "");
  if (parsed === undefined || clauses.length === 0) return false;
  return clauses.every((clause) => holds(clause, parsed));
}

function holds(clause: string, version: Version): boolean {
  const m = CLAUSE.exec(clause);
  if (m === null) return false;
  const op = m[1];
  const text = m[2]!;
  if (op === undefined && (text.includes("x") || text.includes("*"))) {
    const parts = text.split(".").slice(0, version.length);
    return parts.every((p, i) => p === "x" || p === "*" || (/^\d+$/.test(p) && Number(p) === version[i]));
  }
  const bound = parseVersion(text);
  if (bound === undefined) return false;
  const c = compare(version, bound);
  switch (op) {
    case ">=": return c >= 0;
    case ">": return c > 0;
    case "<=": return c <= 0;
    case "<": return c < 0;
    default: return c === 0;
  }
}

function compare(a: Version, b: Version): number {
  for (let i = 0; i < a.length; i++) {
    if (a[i] !== b[i]) return a[i]! < b[i]! ? -1 : 1;
  }
  return 0;
}

/** `"v1"` (or `"v1.2"`) -> 1; undefined when not of that form. */
export function apiMajor(ipcApi: unknown): number | undefined {
  const m = typeof ipcApi === "string" ? /^v(\d+)(?:\.\d+)?$/.exec(ipcApi) : null;
  return m ? Number(m[1]) : undefined;
}

export type MisfitKind = "ipc_api" | "version";

/**
 * Why `client` ("typescript", or another SDK's language, or "cli") at `version` cannot use
 * the daemon that answered `doc`; undefined when it fits. A range the daemon does not
 * publish is no objection.
 */
export function misfit(doc: Record<string, unknown>, client: string, version: string,
                       ipcApi: string = IPC_API): { kind: MisfitKind; message: string } | undefined {
  const daemon = String(doc["daemon"] ?? "?");
  const theirs = doc["ipc_api"];
  if (apiMajor(theirs) !== apiMajor(ipcApi)) {
    return { kind: "ipc_api", message: `the daemon (${daemon}) speaks IPC API ${String(theirs)}, `
      + `this ${client} (${version}) speaks ${ipcApi}` };
  }
  const sdks = doc["compatible_sdks"];
  const range = client === "cli" ? doc["compatible_clis"]
    : (typeof sdks === "object" && sdks !== null
      ? (sdks as Record<string, unknown>)[client] : undefined);
  if (typeof range === "string" && !fits(range, version)) {
    return { kind: "version", message: `the daemon (${daemon}) works with ${client} versions `
      + `${range}, and this ${client} is ${version}` };
  }
  return undefined;
}
