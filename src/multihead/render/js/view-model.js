// The model view: L x H thumbnails titled with their labels' codes; a click opens the matrix view.
import { FONTS } from "./canvas.js";

export function modelView(page) {
  const { data, state, L, H, q, pooled, eachStored, label, mark, code, openHead } = page;
  // --- model view: L x H thumbnails with labels; a click opens the matrix view ---
  const THUMB = 64, GAP = 18, TOP = 16;  // TOP: the row of head names above the thumbnails
  function drawModelView() {
    const canvas = q("canvas.mh-modelview");
    canvas.width = H * (THUMB + 6) + 40; canvas.height = TOP + L * (THUMB + GAP) + 10;
    const ctx = canvas.getContext("2d");
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, canvas.width, canvas.height);
    ctx.fillStyle = "#222"; ctx.font = "bold 11px " + FONTS; ctx.textAlign = "center"; ctx.textBaseline = "top";
    for (let h = 0; h < H; h++) ctx.fillText("H" + h, 40 + h * (THUMB + 6) + THUMB / 2, 2);
    const T = data.sentences[state.sentence].tokens.length;
    for (let l = 0; l < L; l++) for (let h = 0; h < H; h++) {
      const x0 = 40 + h * (THUMB + 6), y0 = TOP + l * (THUMB + GAP) + GAP;
      const img = ctx.createImageData(THUMB, THUMB), cells = new Float32Array(THUMB * THUMB);
      const pool = pooled(state.sentence);
      const n = Math.min(pool ? pool.cells : T, THUMB);
      if (pool) {  // the block maxima, pooled once more to the thumbnail
        const C = pool.cells, base = (l * H + h) * C * C;
        for (let a = 0; a < C; a++) for (let b = 0; b < C; b++) {
          const w = Math.pow(pool.max[base + a * C + b] / 255, 2), c = Math.floor(a * n / C) * THUMB + Math.floor(b * n / C);
          if (w > cells[c]) cells[c] = w;
        }
      } else {
        for (let i = 0; i < T; i++) eachStored(state.sentence, l, h, i, (j, w) => {
          const c = Math.floor(i * n / T) * THUMB + Math.floor(j * n / T);
          if (w > cells[c]) cells[c] = w;
        });
      }
      const scale = THUMB / n;
      for (let y = 0; y < THUMB; y++) for (let x = 0; x < THUMB; x++) {
        const w = cells[Math.floor(y / scale) * THUMB + Math.floor(x / scale)];
        const k = (y * THUMB + x) * 4, c = 255 - Math.round(255 * Math.min(1, w * 2));
        img.data[k] = c; img.data[k + 1] = c; img.data[k + 2] = 255; img.data[k + 3] = 255;
      }
      ctx.putImageData(img, x0, y0);
      ctx.fillStyle = "#222"; ctx.font = "10px " + FONTS; ctx.textAlign = "left"; ctx.textBaseline = "bottom";
      ctx.fillText(code(label(l, h)) + mark(l, h), x0, y0 - 2);  // the legend (overview) explains the codes
    }
    ctx.font = "bold 11px " + FONTS; ctx.textBaseline = "middle";
    for (let l = 0; l < L; l++) { ctx.fillText("L" + l, 4, TOP + l * (THUMB + GAP) + GAP + THUMB / 2); }
  }
  function modelViewCell(ev) {
    const canvas = q("canvas.mh-modelview"), r = canvas.getBoundingClientRect();
    const x = (ev.clientX - r.left) * canvas.width / r.width - 40, y = (ev.clientY - r.top) * canvas.height / r.height - GAP - TOP;
    const h = Math.floor(x / (THUMB + 6)), l = Math.floor(y / (THUMB + GAP));
    return (h >= 0 && h < H && l >= 0 && l < L) ? [l, h] : null;
  }

  q("canvas.mh-modelview").addEventListener("click", (ev) => {
    const c = modelViewCell(ev);
    if (c) openHead(c[0], c[1]);
  });
  return { draw: drawModelView };
}
