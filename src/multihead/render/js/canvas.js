// Canvas helpers every view shares: the page's fonts, margins, the colour bar, token labels, and the
// geometry a canvas records of its cells (the hover and the browser tests read it).

import { blue, ticks } from "./scales.js";

// the page's own glyphs (a subset of Noto Sans CJK, a data: font) after the system's: no tofu offline
export const FONTS = "sans-serif, 'mh-glyphs'";
export const MARGIN = 96, BAR = 64;
export function setGeometry(canvas, x0, y0, size) {  // where the cells are: the hover and the tests read it
  canvas.setAttribute("data-x0", x0); canvas.setAttribute("data-y0", y0); canvas.setAttribute("data-size", size);
}
export function tokenLabels(ctx, toks, i0, j0, G, cell, M) {
  ctx.fillStyle = "#222"; ctx.font = Math.min(12, Math.max(7, cell - 2)) + "px " + FONTS; ctx.textBaseline = "middle";
  for (let a = 0; a < G; a++) {
    ctx.textAlign = "right"; ctx.fillText(toks[i0 + a].slice(0, 14), M - 4, M + a * cell + cell / 2);
    ctx.save(); ctx.translate(M + a * cell + cell / 2, M - 4); ctx.rotate(-Math.PI / 2);
    ctx.textAlign = "left"; ctx.fillText(toks[j0 + a].slice(0, 14), 0, 0); ctx.restore();
  }
  ctx.save(); ctx.font = "11px " + FONTS; ctx.fillStyle = "#666"; ctx.textAlign = "left";
  ctx.fillText("query ↓  key →", 2, 10); ctx.restore();
}
export function colourBar(ctx, x, y, h, name, max) {  // white (0) to blue (max, default 1), ticks
  for (let k = 0; k < h; k++) { ctx.fillStyle = blue(1 - k / h); ctx.fillRect(x, y + k, 12, 1); }
  ctx.strokeStyle = "#999"; ctx.strokeRect(x, y, 12, h);
  ctx.fillStyle = "#222"; ctx.font = "10px " + FONTS; ctx.textAlign = "left"; ctx.textBaseline = "middle";
  ticks(max).forEach(([f, text]) => ctx.fillText(text, x + 15, y + f * h));
  ctx.save(); ctx.translate(x + 46, y + h / 2); ctx.rotate(-Math.PI / 2); ctx.textAlign = "center"; ctx.fillText(name, 0, 0); ctx.restore();
}
