// The page's data decoders, on data written the way render/page.py writes it.
import assert from "node:assert/strict";
import { gzipSync } from "node:zlib";
import { test } from "node:test";

import { b64, dataProblem, DATA_VERSION, eachEntry, inflatedEntry, keptShare, pooledBlock, rolloutLayer, sparseEntry,
  storedHead, weightAt } from "../../src/multihead/render/js/decode.js";

const base64 = (bytes) => Buffer.from(bytes).toString("base64");

// 1 layer, 2 heads, 3 tokens, k = 2: row i of head h keeps keys [i, 0] with weights [(h + 1) * 60, 30] / 255
function sentence() {
  const idx = new Uint16Array(2 * 3 * 2), val = new Uint8Array(2 * 3 * 2);
  for (let h = 0; h < 2; h++) for (let i = 0; i < 3; i++) {
    const at = (h * 3 + i) * 2;
    idx[at] = i; val[at] = (h + 1) * 60;
    idx[at + 1] = 0; val[at + 1] = i === 0 ? 0 : 30;  // row 0's second slot is empty
  }
  return { tokens: ["a", "b", "c"], k: 2, index: base64(new Uint8Array(idx.buffer)), values: base64(val) };
}

test("base64 decodes to the bytes that were encoded", () => {
  assert.deepEqual([...b64(base64(new Uint8Array([0, 1, 254, 255])))], [0, 1, 254, 255]);
});

test("a row's stored entries, one weight, the share kept", () => {
  const entry = sparseEntry(sentence());
  const seen = [];
  eachEntry(entry, 2, 0, 1, 2, (j, w) => seen.push([j, w]));
  assert.deepEqual(seen, [[2, 120 / 255], [0, 30 / 255]]);
  const row0 = [];
  eachEntry(entry, 2, 0, 0, 0, (j, w) => row0.push([j, w]));
  assert.deepEqual(row0, [[0, 60 / 255]]);  // an empty slot is no entry
  assert.equal(weightAt(entry, 2, 0, 1, 2, 0), 30 / 255);
  assert.equal(weightAt(entry, 2, 0, 1, 2, 1), null);  // not stored, never 0
  assert.ok(Math.abs(keptShare(entry, 2, 0, 0, 1) - 90 / 255) < 1e-12);
});

test("a long text's gzip'd arrays inflate to the same entries, with its pooled blocks", async () => {
  const plain = sentence();
  const gz = (text) => gzipSync(Buffer.from(text, "base64")).toString("base64");
  const mass = new Uint8Array([255, 0, 128, 64, 0, 0, 0, 255]);  // 2 heads, 2 x 2 cells
  const long = { ...plain, gzip: true, index: gz(plain.index), values: gz(plain.values),
    pooled: { block: 2, cells: 2, mass: gzipSync(mass).toString("base64"), max: gzipSync(mass).toString("base64"),
      mass_scale: [0.5, 0.25] } };
  const entry = await inflatedEntry(long);
  assert.deepEqual([...entry.idx], [...sparseEntry(plain).idx]);
  assert.deepEqual([...entry.val], [...sparseEntry(plain).val]);
  const block = pooledBlock(entry.pooled, 2, 0, 0, 1, 0);  // head 0, row block 1, key block 0: byte 128
  assert.ok(Math.abs(block.mass - (128 / 255) ** 2 * 0.5) < 1e-12);
  assert.ok(Math.abs(block.max - (128 / 255) ** 2) < 1e-12);
  assert.equal(pooledBlock(entry.pooled, 2, 0, 1, 1, 1).mass, 0.25);  // head 1's last block: the scale itself
});

test("a text of more than 65,536 tokens reads its keys as uint32", () => {
  const T = 70000, idx = new Uint32Array(T), val = new Uint8Array(T).fill(9);  // 1 head, k = 1
  idx[T - 1] = 69999; idx[3] = 65536;
  const entry = sparseEntry({ tokens: new Array(T).fill("t"), k: 1, key_bytes: 4, index: base64(new Uint8Array(idx.buffer)),
    values: base64(val) });
  const seen = [];
  eachEntry(entry, 1, 0, 0, T - 1, (j) => seen.push(j));
  eachEntry(entry, 1, 0, 0, 3, (j) => seen.push(j));
  assert.deepEqual(seen, [69999, 65536]);
  assert.equal(weightAt(entry, 1, 0, 0, 3, 65536), 9 / 255);
});

test("a page that stored some heads' rows reads those and no other", async () => {
  // 2 layers x 2 heads; the rows of heads 1 (l0 h1) and 2 (l1 h0) stored, in that order: sentence()'s two heads' rows
  const plain = sentence(), gz = (text) => gzipSync(Buffer.from(text, "base64")).toString("base64");
  const long = { ...plain, gzip: true, heads: [1, 2], index: gz(plain.index), values: gz(plain.values) };
  const entry = await inflatedEntry(long);
  assert.ok(storedHead(entry, 2, 0, 1) && storedHead(entry, 2, 1, 0));
  assert.ok(!storedHead(entry, 2, 0, 0) && !storedHead(entry, 2, 1, 1));
  const rows = (l, h, i) => { const out = []; eachEntry(entry, 2, l, h, i, (j, w) => out.push([j, w])); return out; };
  assert.deepEqual(rows(0, 1, 2), [[2, 60 / 255], [0, 30 / 255]]);  // the first stored head: sentence()'s head 0
  assert.deepEqual(rows(1, 0, 2), [[2, 120 / 255], [0, 30 / 255]]);  // the second: its head 1
  assert.deepEqual(rows(0, 0, 2), []);  // not stored: no entries, never another head's
  assert.equal(weightAt(entry, 2, 1, 1, 2, 2), null);
  assert.equal(keptShare(entry, 2, 1, 1, 2), 0);
  assert.ok(storedHead(sparseEntry(plain), 2, 1, 1));  // a page without the list: every head
});

test("rollout reads one layer of (L, T, T); flow is one (T, T)", () => {
  const bytes = Uint8Array.from({ length: 2 * 4 }, (_, i) => i);
  assert.deepEqual([...rolloutLayer(bytes, 2, 1, "rollout")], [4, 5, 6, 7]);
  assert.equal(rolloutLayer(bytes, 2, 1, "flow"), bytes);
});

test("data of another version, or without texts, is named, not read", () => {
  const good = { version: DATA_VERSION, num_layers: 1, num_heads: 2, sentences: [sentence()] };
  assert.equal(dataProblem(good), null);
  assert.match(dataProblem({ ...good, version: 1 }), /version 1; this page reads version 2/);
  assert.match(dataProblem({ ...good, sentences: [] }), /no layers, heads or texts/);
  assert.match(dataProblem(null), /no data/);
});
