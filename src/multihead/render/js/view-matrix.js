// The matrix view: one head's heatmap, the value under the pointer; long texts pooled, with zoom.
import { keptShare, pooledBlock, storedHead, weightAt } from "./decode.js";
import { blue } from "./scales.js";
import { blockSpan, cellAt, wholeRegion, ZOOM_FULL, zoomed } from "./zoom.js";
import { BAR, colourBar, MARGIN, positionAxis, setGeometry, tokenLabels } from "./canvas.js";

const AXIS = 48;  // the margin of a position axis (a long text's map, before its tokens can be named)

export function matrixView(page) {
  const { data, state, H, q, info, sparse, pooled, eachStored, label, evidence, draw } = page;
  // --- matrix view: one head's heatmap, value under the pointer; long texts: pooled, with zoom ---
  function region() {  // the shown square: rows i0.., keys j0.., n tokens a side
    const T = data.sentences[state.sentence].tokens.length;
    if (!state.zoom || state.zoom.T !== T) state.zoom = wholeRegion(T);
    return state.zoom;
  }
  function drawMatrixView() {
    const canvas = q("canvas.mh-matrix");
    const toks = data.sentences[state.sentence].tokens, T = toks.length, pool = pooled(state.sentence);
    const k = sparse(state.sentence).k, rows = storedHead(sparse(state.sentence), H, state.layer, state.head);
    if (pool && !rows) state.zoom = null;  // a head whose rows the page did not store: its blocks are all there is
    q(".mh-zoom").style.display = pool && rows ? "" : "none";
    // block mass / block max is a choice of the pooled map only: zoomed into stored weights it does not apply
    q(".mh-pool-mode").style.display = pool && region().n === T ? "" : "none";
    const tested = evidence(state.layer, state.head);
    const me = data.heads.length ? data.heads[state.layer * H + state.head] : null;  // the label with its defining value
    // the label with its value, and what ablation said of the label (not of a trait beside it); a page
    // without a report has no label, and its title no dangling colon
    const named = me && me.describe ? me.describe : label(state.layer, state.head);
    const title = "layer " + state.layer + ", head " + state.head + (named ? ": " + named : "") +
      (tested ? " — its label " + tested + " by ablation" : "");
    const stored = k < T ? " — each row stores its " + k + " largest weights; the rest are not stored" : "";
    const ctx = canvas.getContext("2d");
    if (pool && region().n === T) {  // the whole map, block by block
      const C = pool.cells, cell = Math.max(2, Math.floor(512 / C)), base = (state.layer * H + state.head) * C * C;
      const arr = state.poolMode === "max" ? pool.max : pool.mass, A = AXIS;
      canvas.width = A + C * cell + BAR; canvas.height = A + C * cell;
      setGeometry(canvas, A, A, C * cell);
      ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, canvas.width, canvas.height);
      colourBar(ctx, A + C * cell + 12, A, C * cell, state.poolMode === "max" ? "√ largest weight" : "√ block mass");
      for (let a = 0; a < C; a++) for (let b = 0; b < C; b++) {
        ctx.fillStyle = blue(arr[base + a * C + b] / 255); ctx.fillRect(A + b * cell, A + a * cell, cell, cell);
      }
      positionAxis(ctx, 0, 0, C * pool.block, C * cell, A);
      q(".mh-matrix-title").textContent = title + " — blocks of " + pool.block + " x " + pool.block + " tokens, " +
        (state.poolMode === "max" ? "the largest weight in each block" : "each block's mass (its rows' mean weight on its keys)") +
        " (colour ∝ √value)" + (rows ? "; click to zoom" + stored : unstored());
      return;
    }
    const z = region(), G = Math.min(z.n, 256), cell = Math.max(2, Math.min(24, Math.floor(560 / G)));
    // every cell one (query, key) pair: name them; a zoomed region of a long text: its positions
    const labelled = z.n <= ZOOM_FULL, M = labelled ? MARGIN : z.n < T ? AXIS : 0;
    canvas.width = M + G * cell + BAR; canvas.height = M + G * cell;
    setGeometry(canvas, M, M, G * cell);
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, canvas.width, canvas.height);
    const cells = new Float32Array(G * G);
    for (let i = z.i0; i < Math.min(T, z.i0 + z.n); i++) eachStored(state.sentence, state.layer, state.head, i, (j, w) => {
      if (j < z.j0 || j >= z.j0 + z.n) return;
      const c = Math.floor((i - z.i0) * G / z.n) * G + Math.floor((j - z.j0) * G / z.n);
      if (w > cells[c]) cells[c] = w;
    });
    for (let c = 0; c < G * G; c++) if (cells[c] > 0) {
      ctx.fillStyle = blue(cells[c]); ctx.fillRect(M + (c % G) * cell, M + Math.floor(c / G) * cell, cell, cell);
    }
    ctx.strokeStyle = "#ccc"; ctx.strokeRect(M, M, G * cell, G * cell);
    if (labelled) tokenLabels(ctx, toks, z.i0, z.j0, G, cell, M);
    else if (M) positionAxis(ctx, z.i0, z.j0, z.n, G * cell, M);
    colourBar(ctx, M + G * cell + 12, M, G * cell, "weight");
    const where = z.n < T ? " — rows " + z.i0 + "–" + (Math.min(T, z.i0 + z.n) - 1) + ", keys " + z.j0 + "–" + (Math.min(T, z.j0 + z.n) - 1) +
      (z.n > ZOOM_FULL ? " (each cell the largest stored weight in it; click to zoom)" : " at full resolution") : "";
    q(".mh-matrix-title").textContent = title + where + stored;
  }
  function unstored() {  // why a long text's head has no zoom: the page's size kept the rows of other heads
    const kept = sparse(state.sentence).slots.size;
    return " — its rows are not stored: of a text this long the page keeps the rows of " + kept + " of " + page.L * H +
      " heads within its size, those whose largest weights carry most of their attention";
  }
  function zoomAt(i, j, factor) {
    state.zoom = zoomed(region(), i, j, factor);
    draw();
  }
  function matrixCell(ev) {  // the (row, key) token under the pointer, in the shown region
    const canvas = q("canvas.mh-matrix"), r = canvas.getBoundingClientRect();
    const x0 = +canvas.getAttribute("data-x0"), y0 = +canvas.getAttribute("data-y0"), size = +canvas.getAttribute("data-size");
    return cellAt(region(), (ev.clientX - r.left) * canvas.width / r.width - x0, (ev.clientY - r.top) * canvas.height / r.height - y0, size);
  }
  function matrixSVG() {
    const toks = data.sentences[state.sentence].tokens, T = toks.length, cell = 10;
    if (pooled(state.sentence)) return null;  // thousands of tokens: the PNG export is the one to use
    const M = 100, esc = (t) => String(t).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
    const parts = ['<svg xmlns="http://www.w3.org/2000/svg" width="' + (M + T * cell + 60) + '" height="' + (M + T * cell + 20) +
                   '" font-family="sans-serif, mh-glyphs" font-size="8">',
                   '<text x="2" y="12" font-size="11">' + esc((data.model || "") + " layer " + state.layer + ", head " + state.head + ": " + label(state.layer, state.head)) + '</text>'];
    toks.forEach((t, i) => {
      parts.push('<text x="' + (M - 3) + '" y="' + (M + i * cell + cell * 0.8) + '" text-anchor="end">' + esc(t) + '</text>');
      parts.push('<text transform="translate(' + (M + i * cell + cell * 0.8) + ',' + (M - 3) + ') rotate(-90)">' + esc(t) + '</text>');
    });
    for (let i = 0; i < T; i++) eachStored(state.sentence, state.layer, state.head, i, (j, w) => {
      const c = 255 - Math.round(255 * Math.min(1, w));
      parts.push('<rect x="' + (M + j * cell) + '" y="' + (M + i * cell) + '" width="' + cell + '" height="' + cell + '" fill="rgb(' + c + ',' + c + ',255)"/>');
    });
    for (let k = 0; k <= 10; k++) {  // the colour bar
      const c = 255 - Math.round(25.5 * k);
      parts.push('<rect x="' + (M + T * cell + 10) + '" y="' + (M + (10 - k) * T * cell / 11) + '" width="10" height="' + (T * cell / 11) + '" fill="rgb(' + c + ',' + c + ',255)"/>');
    }
    parts.push('<text x="' + (M + T * cell + 24) + '" y="' + (M + 8) + '">1</text><text x="' + (M + T * cell + 24) + '" y="' + (M + T * cell) + '">0</text>');
    parts.push("</svg>");
    return parts.join("");
  }

  q("canvas.mh-matrix").addEventListener("mousemove", (ev) => {
    const cellAt = matrixCell(ev), toks = data.sentences[state.sentence].tokens, T = toks.length;
    if (!cellAt) return;
    const [i, j] = cellAt, pool = pooled(state.sentence);
    if (pool && region().n === T) {  // a block of the pooled map
      const a = Math.floor(i / pool.block), b = Math.floor(j / pool.block), block = pooledBlock(pool, H, state.layer, state.head, a, b);
      const span = (x) => blockSpan(x, pool.block, T);
      info.textContent = "rows " + span(a) + " → keys " + span(b) + ": mass " + block.mass.toFixed(4) + ", largest weight " + block.max.toFixed(3);
      return;
    }
    const w = weightAt(sparse(state.sentence), H, state.layer, state.head, i, j), k = sparse(state.sentence).k;
    const share = keptShare(sparse(state.sentence), H, state.layer, state.head, i);
    const note = k < T ? " (this row stores its " + k + " largest weights: " + (100 * share).toFixed(1) + "% of its attention)" : "";
    info.textContent = toks[i] + " → " + toks[j] + ": " + (w === null ? "not stored" : w.toFixed(3)) + note;
  });
  q("canvas.mh-matrix").addEventListener("click", (ev) => {
    const cellAt = matrixCell(ev);
    if (cellAt && pooled(state.sentence) && storedHead(sparse(state.sentence), H, state.layer, state.head)) zoomAt(cellAt[0], cellAt[1], 4);
  });
  q(".mh-zoom-out").addEventListener("click", () => { const z = region(); zoomAt(z.i0 + z.n / 2, z.j0 + z.n / 2, 0.25); });
  q(".mh-zoom-all").addEventListener("click", () => { state.zoom = null; draw(); });
  q(".mh-pool-mode").addEventListener("change", (ev) => { state.poolMode = ev.target.value; draw(); });
  return { draw: drawMatrixView, svg: matrixSVG };
}
