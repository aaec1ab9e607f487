// Colours and numbers as every view draws them. Pure functions (no DOM).

// the heads' colours in the head view and the groups' in the similarity view
export const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
  "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd"];

// A weight in [0, 1] (clamped) as white (0) to blue (1)
export function blue(w) {
  const v = 255 - Math.round(255 * Math.min(1, Math.max(0, w)));
  return "rgb(" + v + "," + v + ",255)";
}

// A distance in [0, 1] as black (0) to white (1)
export function grey(v) {
  const c = Math.round(255 * Math.min(1, Math.max(0, v)));
  return "rgb(" + c + "," + c + "," + c + ")";
}

// A colour bar's tick labels: [position 0 (top) .. 1 (bottom), text] from max down to 0
export function ticks(max) {
  const top = max === undefined ? 1 : max;
  return [[0, top.toFixed(2)], [0.5, (top / 2).toFixed(2)], [1, (0).toFixed(2)]];
}

// A number with d decimals (3 by default); a dash for what was not measured
export function fmt(v, d) {
  return v === null || v === undefined || Number.isNaN(v) ? "–" : Number(v).toFixed(d === undefined ? 3 : d);
}

// a count and its noun in its number: counted(1, "sentence") is "1 sentence", counted(3, "text") "3 texts",
// counted(5170, "token") "5,170 tokens" (thousands grouped, as the text report's counts are)
export function counted(n, noun) {
  return grouped(n) + " " + (n === 1 ? noun : noun + "s");
}

// a whole number with its thousands grouped by commas (not the reader's locale: the page reads the same
// everywhere, as the text report does): grouped(1222) is "1,222"
export function grouped(n) {
  return String(n).replace(/\B(?=(\d{3})+(?!\d))/g, ",");
}
