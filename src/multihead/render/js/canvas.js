// Canvas helpers every view shares: the page's fonts, margins, the colour bar, token labels, and the
// geometry a canvas records of its cells (the hover and the browser tests read it).

import { blue, ticks } from "./scales.js";

// the page's own glyphs (a subset of Noto Sans CJK, a data: font) after the system's: no tofu offline
export const FONTS = "sans-serif, 'mh-glyphs'";
export const MARGIN = 96, BAR = 64;
export function setGeometry(canvas, x0, y0, size) {  // where the cells are: the hover and the tests read it
  canvas.setAttribute("data-x0", x0); canvas.setAttribute("data-y0", y0); canvas.setAttribute("data-size", size);
}
// the stride of the token labels: every one where a cell is tall enough for text, else every k-th
// (a label per 10 px at least), so they never overlap
export function labelStride(cell) { return cell >= 7 ? 1 : Math.ceil(10 / cell); }
export function tokenLabels(ctx, toks, i0, j0, G, cell, M) {
  const stride = labelStride(cell);
  ctx.fillStyle = "#222"; ctx.font = Math.min(12, Math.max(7, cell * stride - 2)) + "px " + FONTS; ctx.textBaseline = "middle";
  for (let a = 0; a < G; a += stride) {
    ctx.textAlign = "right"; ctx.fillText(toks[i0 + a].slice(0, 14), M - 4, M + a * cell + cell / 2);
    ctx.save(); ctx.translate(M + a * cell + cell / 2, M - 4); ctx.rotate(-Math.PI / 2);
    ctx.textAlign = "left"; ctx.fillText(toks[j0 + a].slice(0, 14), 0, 0); ctx.restore();
  }
  ctx.save(); ctx.font = "11px " + FONTS; ctx.fillStyle = "#666"; ctx.textAlign = "left";
  ctx.fillText("query ↓  key →", 2, 10); ctx.restore();
}
// a position axis along the left and top of a map of n tokens from i0 (rows) and j0 (keys), drawn in
// a margin of M px: a tick and the token's position every "nice" step (1, 2, 5 × 10^k) of >= 40 px
export function positionAxis(ctx, i0, j0, n, size, M) {
  const raw = n * 40 / size, p = Math.pow(10, Math.floor(Math.log10(Math.max(1, raw))));
  const step = [1, 2, 5, 10].map((f) => f * p).find((s) => s >= raw) || 10 * p;
  ctx.save(); ctx.fillStyle = "#444"; ctx.strokeStyle = "#999"; ctx.font = "10px " + FONTS;
  for (const [start, vertical] of [[i0, true], [j0, false]]) {
    for (let t = Math.ceil(start / step) * step; t <= start + n; t += step) {
      const at = M + (t - start) * size / n;
      ctx.beginPath();
      if (vertical) { ctx.moveTo(M - 5, at); ctx.lineTo(M, at); } else { ctx.moveTo(at, M - 5); ctx.lineTo(at, M); }
      ctx.stroke();
      ctx.textAlign = vertical ? "right" : "center"; ctx.textBaseline = vertical ? "middle" : "bottom";
      ctx.fillText(String(t), vertical ? M - 7 : at, vertical ? at : M - 7);
    }
  }
  ctx.textAlign = "left"; ctx.textBaseline = "top"; ctx.fillText("token position (query ↓, key →)", 2, 2);
  ctx.restore();
}
export function colourBar(ctx, x, y, h, name, max) {  // white (0) to blue (max, default 1), ticks
  for (let k = 0; k < h; k++) { ctx.fillStyle = blue(1 - k / h); ctx.fillRect(x, y + k, 12, 1); }
  ctx.strokeStyle = "#999"; ctx.strokeRect(x, y, 12, h);
  ctx.fillStyle = "#222"; ctx.font = "10px " + FONTS; ctx.textAlign = "left";
  // the end labels sit inside the bar's span (top: hanging below its top, bottom: standing on its end),
  // so neither is cut by the canvas's edge
  ticks(max).forEach(([f, text]) => {
    ctx.textBaseline = f === 0 ? "top" : f === 1 ? "bottom" : "middle";
    ctx.fillText(text, x + 15, y + f * h);
  });
  ctx.save(); ctx.translate(x + 46, y + h / 2); ctx.rotate(-Math.PI / 2); ctx.textAlign = "center"; ctx.fillText(name, 0, 0); ctx.restore();
}
