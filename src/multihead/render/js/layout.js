// The similarity view's order of heads: by layer, or grouped (the Ward groups one after another, so a
// group is a block on the diagonal), with the spans its axes name. Pure (no DOM).

import { COLORS } from "./scales.js";

// the group's most common label and its share (%): [label, share]
export function groupSummary(g, labelOf) {
  const counts = {};
  g.forEach((x) => { const lab = labelOf(x[0], x[1]) || "?"; counts[lab] = (counts[lab] || 0) + 1; });
  const [top, n] = Object.entries(counts).sort((p, q) => q[1] - p[1])[0];
  return [top, Math.round(100 * n / g.length)];
}

// {grouped, order: display position -> head index, spans: [{name, from, to[, colour, text]}]}
export function similarityLayout(L, H, groups, grouped, labelOf) {
  const N = L * H;
  if (!grouped || !groups) {
    return { grouped: false, order: [...Array(N).keys()],
      spans: [...Array(L).keys()].map((l) => ({ name: "L" + l, from: l * H, to: (l + 1) * H })) };
  }
  const order = [], spans = [], seen = new Set();
  groups.groups.forEach((g, k) => {
    const from = order.length;
    g.map((x) => x[0] * H + x[1]).sort((a, b) => a - b).forEach((n) => { order.push(n); seen.add(n); });
    const [top, share] = groupSummary(g, labelOf);
    spans.push({ name: "G" + (k + 1), from: from, to: order.length, colour: COLORS[k % COLORS.length],
      text: "G" + (k + 1) + ": " + g.length + " heads, " + share + "% " + top });
  });
  const rest = [...Array(N).keys()].filter((n) => !seen.has(n));
  if (rest.length) spans.push({ name: "rest", from: order.length, to: N, colour: "#bbb", text: "rest: " + rest.length + " heads in no group" });
  order.push(...rest);
  return { grouped: true, order: order, spans: spans };
}
