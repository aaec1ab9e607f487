// The pure parts of the views: colours, labels from the data, zoom arithmetic, the similarity's order.
import assert from "node:assert/strict";
import { test } from "node:test";

import { codeOf, colourOf, evidenceOf, flagNote, labelOf, markOf } from "../../src/multihead/render/js/labels.js";
import { groupSummary, similarityLayout } from "../../src/multihead/render/js/layout.js";
import { blue, COLORS, counted, fmt, grey, grouped, ticks } from "../../src/multihead/render/js/scales.js";
import { blockSpan, cellAt, labelledPositions, wholeRegion, ZOOM_FULL, zoomed } from "../../src/multihead/render/js/zoom.js";

test("weights run white to blue, distances black to white, clamped", () => {
  assert.equal(blue(0), "rgb(255,255,255)");
  assert.equal(blue(1), "rgb(0,0,255)");
  assert.equal(blue(2), blue(1));
  assert.equal(blue(0.5), "rgb(127,127,255)");
  assert.equal(grey(0), "rgb(0,0,0)");
  assert.equal(grey(-1), grey(0));
  assert.equal(COLORS.length, 16);
  assert.deepEqual(ticks(), [[0, "1.00"], [0.5, "0.50"], [1, "0.00"]]);
  assert.deepEqual(ticks(0.2).map(([, t]) => t), ["0.20", "0.10", "0.00"]);
  assert.equal(fmt(0.12345), "0.123");
  assert.equal(fmt(null), "–");
  assert.equal(counted(1, "sentence"), "1 sentence");  // a --document's page once said "1 sentences"
  assert.equal(counted(668, "token"), "668 tokens");
  assert.equal(counted(0, "text"), "0 texts");
  assert.equal(counted(1222, "token"), "1,222 tokens");  // grouped as the text report groups them
  assert.equal(counted(1234567, "token"), "1,234,567 tokens");
  assert.equal(grouped(999), "999");
  assert.equal(grouped(65536), "65,536");
  assert.equal(fmt(NaN), "–");
  assert.equal(fmt(2, 1), "2.0");
});

test("labels, codes, marks and colours come from the data", () => {
  const data = { num_heads: 2, labels: ["previous", "syntactic:nsubj", "mixed", "induction"],
    codes: { previous: "PREV", "syntactic:nsubj": "nsubj", mixed: "·" }, evidence: [null, "confirmed", null, "attention-only"],
    marks: { confirmed: "✓", "attention-only": "~" }, colours: { previous: "#92c5de", syntactic: "#a6dba0" } };
  assert.equal(labelOf(data, 0, 1), "syntactic:nsubj");
  assert.equal(labelOf({ num_heads: 2 }, 0, 1), "");
  assert.equal(codeOf(data, "previous"), "PREV");
  assert.equal(codeOf(data, "induction"), "induction");  // no code given: the label
  assert.equal(evidenceOf(data, 1, 1), "attention-only");
  assert.equal(markOf(data, 0, 1), " ✓");
  assert.equal(markOf(data, 0, 0), "");
  assert.equal(colourOf(data, "syntactic:nsubj"), "#a6dba0");
  assert.equal(colourOf(data, "broad"), "#ffffff");
  // a combined label takes its colour from the report's own (its first component's), not white as mixed
  const combined = { ...data, label_colours: { "previous+punctuation": "#92c5de" } };
  assert.equal(colourOf(combined, "previous+punctuation"), "#92c5de");
  assert.equal(colourOf(combined, "syntactic:nsubj"), "#a6dba0");
});

test("every flagged head's note says its flags and what removing it did", () => {
  assert.equal(flagNote({ flags: [], degenerate: null }), "");
  assert.equal(flagNote(undefined), "");
  // a flagged head whose removal was not measured was once drawn as plain as an unflagged one
  assert.equal(flagNote({ flags: ["uniform"], degenerate: null }), "flag: uniform (removal not measured)");
  assert.equal(flagNote({ flags: ["uniform", "vertical"], degenerate: true }), "flag: uniform, vertical (degenerate: removing it changes nothing)");
  assert.equal(flagNote({ flags: ["self-only"], degenerate: false }), "flag: self-only (removing it matters)");
});

test("zooming narrows around the point, never below full resolution nor outside the map", () => {
  const whole = wholeRegion(4096);
  assert.deepEqual(whole, { i0: 0, j0: 0, n: 4096, T: 4096 });
  const z = zoomed(whole, 100, 4000, 4);
  assert.equal(z.n, 1024);
  assert.equal(z.i0, 0);  // clamped at the top
  assert.equal(z.j0, 4096 - 1024);  // and at the right
  let deep = z;
  for (let k = 0; k < 5; k++) deep = zoomed(deep, 2000, 2000, 4);
  assert.equal(deep.n, ZOOM_FULL);
  assert.deepEqual(zoomed(deep, 2000, 2000, 0.25).n, 512);  // zoom out
  assert.equal(zoomed(wholeRegion(50), 10, 10, 4).n, 50);  // a text shorter than full resolution stays whole
});

test("the cell under the pointer, and a block's tokens", () => {
  const z = { i0: 100, j0: 200, n: 128, T: 1000 };
  assert.deepEqual(cellAt(z, 0, 0, 512), [100, 200]);
  assert.deepEqual(cellAt(z, 511, 4, 512), [101, 327]);
  assert.equal(cellAt(z, 512, 0, 512), null);
  assert.equal(cellAt(z, -1, 0, 512), null);
  assert.equal(cellAt({ i0: 0, j0: 0, n: 8, T: 5 }, 7.5 * 64, 0, 512), null);  // past the text's end
  assert.equal(blockSpan(3, 32, 100), "96–99");
  assert.equal(blockSpan(0, 32, 100), "0–31");
});

test("axis labels are spaced so they never overlap", () => {
  assert.deepEqual(labelledPositions(10, 200, 12), [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
  const many = labelledPositions(128, 512, 12);
  assert.ok(many.length <= 512 / 12 + 1 && many[0] === 0);
  assert.ok(many.every((x, k) => k === 0 || (x - many[k - 1]) * 512 / 128 >= 12));
});

test("the similarity's order: by layer, or the groups one after another", () => {
  const labels = { "0,0": "previous", "0,1": "previous", "1,0": "broad", "1,1": "previous" };
  const labelOfHead = (l, h) => labels[l + "," + h];
  const byLayer = similarityLayout(2, 2, null, true, labelOfHead);
  assert.deepEqual(byLayer.order, [0, 1, 2, 3]);
  assert.deepEqual(byLayer.spans.map((s) => [s.name, s.from, s.to]), [["L0", 0, 2], ["L1", 2, 4]]);
  const groups = { groups: [[[1, 1], [0, 1]], [[1, 0]]] };
  const grouped = similarityLayout(2, 2, groups, true, labelOfHead);
  assert.deepEqual(grouped.order, [1, 3, 2, 0]);  // group 1 (heads 1, 3), group 2 (head 2), the rest (head 0)
  assert.deepEqual(grouped.spans.map((s) => s.name), ["G1", "G2", "rest"]);
  assert.match(grouped.spans[0].text, /2 heads, 100% previous/);
  assert.deepEqual(groupSummary([[0, 0], [1, 0], [1, 1]], labelOfHead), ["previous", 67]);
});
