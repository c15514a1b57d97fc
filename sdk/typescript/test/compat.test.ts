/**
 * The compatibility check, pure: the cases of sdk/conformance/compat.json, which the Python
 * and Go SDKs' checks answer too.
 */

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import { apiMajor, fits, misfit } from "../src/index.js";

interface Vectors {
  fits: { range: string; version: string; fits: boolean }[];
  misfit: { doc: Record<string, unknown>;
            cases: { client: string; version: string; misfit: string | null }[] }[];
}

const VECTORS = JSON.parse(readFileSync(join(
  resolve(dirname(fileURLToPath(import.meta.url)), "..", "..", ".."), "conformance",
  "compat.json"), "utf8")) as Vectors;

test("a version fits a range as every SDK says", () => {
  for (const c of VECTORS.fits) {
    assert.equal(fits(c.range, c.version), c.fits, `${c.range} ~ ${c.version}`);
  }
});

test("a client misfits a daemon's document as every SDK says", () => {
  for (const group of VECTORS.misfit) {
    for (const c of group.cases) {
      const why = misfit(group.doc, c.client, c.version);
      assert.equal(why?.kind ?? null, c.misfit, `${JSON.stringify(group.doc)} ${c.client}@${c.version}`);
    }
  }
  assert.equal(apiMajor("v12.3"), 12);
  assert.equal(apiMajor(1), undefined);
});
