// multihead attention page: the views, drawn from the page's data (everything inline, nothing from the
// network). The pure parts — decoding, colours, labels, zoom arithmetic, the similarity's order — are
// modules of their own (decode.js, scales.js, labels.js, zoom.js, layout.js); render/js/__init__.py joins
// them with this file into the page's one script, each page instance in its own closure, so several in
// one notebook do not interfere.
import { b64, dataProblem, eachEntry, inflatedEntry, keptShare, pooledBlock, rolloutLayer, sparseEntry, weightAt } from "./decode.js";
import { codeOf, colourOf, evidenceOf, labelOf, markOf } from "./labels.js";
import { groupSummary, similarityLayout } from "./layout.js";
import { blue, COLORS, fmt, grey, ticks } from "./scales.js";
import { blockSpan, cellAt, wholeRegion, ZOOM_FULL, zoomed } from "./zoom.js";

const root = document.getElementById("__ROOT_ID__");
const data = JSON.parse(document.getElementById("__ROOT_ID__-data").textContent);
const problem = dataProblem(data);
if (problem) {  // say so on the page, and draw nothing from data this script cannot read
  root.prepend(document.createTextNode("multihead page: " + problem));
  throw new Error("multihead page: " + problem);
}
const L = data.num_layers, H = data.num_heads;
// the page's own glyphs (a subset of Noto Sans CJK, a data: font) after the system's: no tofu offline
const FONTS = "sans-serif, 'mh-glyphs'";
const LONG = data.long_text || 512;  // texts longer than this are stored pooled
const state = { poolMode: "mass", zoom: null, sentence: 0, layer: 0, head: 0, heads: new Set([...Array(H).keys()]), view: data.overview ? "overview" : "model", hover: null,
                sortKey: null, sortDesc: false, simOrder: "layer" };

function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = String(text);  // text, never markup
  return e;
}
const q = (sel) => root.querySelector(sel);

// --- data: per row, the k largest weights: uint16 key indices + uint8 values (0..255 = 0..1), base64;
// long texts also carry block-pooled maps, and their arrays are gzip-compressed (inflated at start) ---
const decoded = new Map();
async function prepare(s) {  // a long text's arrays are inflated once, at the start
  const d = data.sentences[s];
  if (d.gzip) decoded.set(s, await inflatedEntry(d));
}
function sparse(s) {
  if (!decoded.has(s)) decoded.set(s, sparseEntry(data.sentences[s]));
  return decoded.get(s);
}
function pooled(s) { return sparse(s).pooled || null; }
function eachStored(s, l, h, i, fn) { eachEntry(sparse(s), H, l, h, i, fn); }  // fn(j, weight) for the row's kept entries
function label(l, h) { return labelOf(data, l, h); }
// a label tested by ablation: confirmed (the behaviour needs the head) or attention-only; marked after its code
function evidence(l, h) { return evidenceOf(data, l, h); }
function mark(l, h) { return markOf(data, l, h); }

// --- controls ---
const controls = q(".mh-controls");
const sentenceSelect = el("select", { "class": "mh-sentence", "aria-label": "sentence" });
data.sentences.forEach((s, i) => sentenceSelect.appendChild(el("option", { value: String(i) }, s.text.slice(0, 80))));
const layerSelect = el("select", { "class": "mh-layer", "aria-label": "layer" });
for (let l = 0; l < L; l++) layerSelect.appendChild(el("option", { value: String(l) }, "layer " + l));
controls.append(el("span", {}, "sentence "), sentenceSelect, el("span", {}, " "), layerSelect);
const headBoxes = el("span", { "class": "mh-heads" });
for (let h = 0; h < H; h++) {
  const box = el("span", { "class": "mh-headbox on", "data-head": String(h), title: "head " + h });
  box.style.background = COLORS[h % COLORS.length];
  box.textContent = String(h);
  box.addEventListener("click", () => {
    if (state.heads.has(h)) state.heads.delete(h); else state.heads.add(h);
    box.classList.toggle("on");
    draw();
  });
  box.addEventListener("dblclick", () => {  // one head alone (double-click again: all heads)
    const alone = state.heads.size === 1 && state.heads.has(h);
    state.heads = alone ? new Set([...Array(H).keys()]) : new Set([h]);
    headBoxes.querySelectorAll(".mh-headbox").forEach((b, k) => b.classList.toggle("on", state.heads.has(k)));
    draw();
  });
  headBoxes.appendChild(box);
}
controls.appendChild(headBoxes);
sentenceSelect.addEventListener("change", () => { state.sentence = +sentenceSelect.value; state.zoom = null; draw(); });
layerSelect.addEventListener("change", () => { state.layer = +layerSelect.value; draw(); });
root.querySelectorAll(".mh-tab").forEach((tab) => tab.addEventListener("click", () => {
  state.view = tab.getAttribute("data-view");
  root.querySelectorAll(".mh-tab").forEach((t) => t.classList.toggle("active", t === tab));
  root.querySelectorAll(".mh-view").forEach((v) => { v.style.display = v.getAttribute("data-view") === state.view ? "" : "none"; });
  info.textContent = "";  // the last hover's text belongs to the view left behind
  draw();
}));
const info = q(".mh-info");
function showView(view) { const tab = root.querySelector('.mh-tab[data-view="' + view + '"]'); if (tab) tab.click(); }
// any head, from anywhere: the map, a table row, a similarity cell, a thumbnail, a probe table
function openHead(l, h, view) {
  state.layer = l; state.head = h; layerSelect.value = String(l);
  showView(view || "matrix");
}
function headLink(l, h, text) {
  const a = el("a", { href: "#s=" + state.sentence + "&l=" + l + "&h=" + h + "&v=matrix", "class": "mh-headlink" }, text || ("L" + l + ".H" + h));
  a.addEventListener("click", (ev) => { ev.preventDefault(); openHead(l, h); });
  return a;
}
// the selection (sentence, layer, head, view) lives in the URL fragment, so a view can be linked
function writeFragment() {
  const frag = "#s=" + state.sentence + "&l=" + state.layer + "&h=" + state.head + "&v=" + state.view;
  if (location.hash !== frag) { try { history.replaceState(null, "", frag); } catch { /* sandboxed frames */ } }
}
function readFragment() {
  const p = new URLSearchParams(location.hash.slice(1)), n = (k, max) => { const v = parseInt(p.get(k), 10); return v >= 0 && v < max ? v : null; };
  const s = n("s", data.sentences.length), l = n("l", L), h = n("h", H), v = p.get("v");
  if (s !== null) { state.sentence = s; sentenceSelect.value = String(s); }
  if (l !== null) { state.layer = l; layerSelect.value = String(l); }
  if (h !== null) state.head = h;
  return v && root.querySelector('.mh-tab[data-view="' + v + '"]') ? v : null;
}

// --- head view: lines from each token to the tokens it attends to ---
// Every token keeps a readable label at any stored length (up to LONG): long texts make a tall
// canvas that its box scrolls, rather than rows too thin to name.
const headRow = (T) => T > 200 ? 12 : 16;
function drawHeadView() {
  const canvas = q("canvas.mh-headview");
  const toks = data.sentences[state.sentence].tokens, T = toks.length;
  if (pooled(state.sentence)) {  // thousands of lines say nothing: the matrix view zooms instead
    canvas.width = 520; canvas.height = 40;
    const c = canvas.getContext("2d");
    c.clearRect(0, 0, canvas.width, canvas.height); c.fillStyle = "#222"; c.font = "12px " + FONTS;
    c.fillText("This text has " + T + " tokens: the head view draws texts up to " + LONG + "; the matrix view zooms.", 4, 20);
    return;
  }
  const row = headRow(T), width = 520;
  canvas.width = width; canvas.height = Math.max(60, T * row + 20);
  const ctx = canvas.getContext("2d");
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  ctx.font = (row - 2) + "px " + FONTS;
  ctx.textBaseline = "middle";
  ctx.fillStyle = "#222";
  toks.forEach((t, i) => {
    ctx.textAlign = "right"; ctx.fillText(t, 150, 10 + i * row + row / 2);
    ctx.textAlign = "left"; ctx.fillText(t, width - 150, 10 + i * row + row / 2);
  });
  ctx.lineWidth = 1.5;
  const hv = state.hover;
  if (hv) {  // the hovered token, marked in its column
    ctx.fillStyle = "rgba(255, 200, 0, 0.35)";
    ctx.fillRect(hv.side === "from" ? 0 : width - 156, 10 + hv.i * row, 156, row);
  }
  for (const h of state.heads) {
    ctx.strokeStyle = COLORS[h % COLORS.length];
    for (let i = 0; i < T; i++) eachStored(state.sentence, state.layer, h, i, (j, w) => {
      if (w < 0.02) return;
      const lit = !hv || (hv.side === "from" ? i === hv.i : j === hv.i);
      ctx.globalAlpha = lit ? Math.min(1, w * (hv ? 1.5 : 1)) : Math.min(1, w) * 0.08;
      ctx.beginPath(); ctx.moveTo(158, 10 + i * row + row / 2); ctx.lineTo(width - 158, 10 + j * row + row / 2); ctx.stroke();
    });
  }
  ctx.globalAlpha = 1;
}

function headViewToken(ev) {  // which column and token the pointer is over in the head view
  const canvas = q("canvas.mh-headview"), r = canvas.getBoundingClientRect(), T = data.sentences[state.sentence].tokens.length;
  if (pooled(state.sentence)) return null;
  const row = headRow(T), x = (ev.clientX - r.left) * canvas.width / r.width, y = (ev.clientY - r.top) * canvas.height / r.height;
  const i = Math.floor((y - 10) / row);
  if (i < 0 || i >= T) return null;
  if (x < 158) return { side: "from", i: i };
  if (x > canvas.width - 158) return { side: "to", i: i };
  return null;
}
q("canvas.mh-headview").addEventListener("mousemove", (ev) => {
  const t = headViewToken(ev), old = state.hover;
  if ((t === null) !== (old === null) || (t && (t.side !== old.side || t.i !== old.i))) {
    state.hover = t; drawHeadView();
    const toks = data.sentences[state.sentence].tokens;
    info.textContent = t ? (t.side === "from" ? "what " + toks[t.i] + " attends to" : "what attends to " + toks[t.i]) : "";
  }
});
q("canvas.mh-headview").addEventListener("mouseleave", () => { state.hover = null; drawHeadView(); });

// --- model view: L x H thumbnails with labels; a click opens the matrix view ---
const THUMB = 64, GAP = 18;
function drawModelView() {
  const canvas = q("canvas.mh-modelview");
  canvas.width = H * (THUMB + 6) + 40; canvas.height = L * (THUMB + GAP) + 10;
  const ctx = canvas.getContext("2d");
  ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, canvas.width, canvas.height);
  const T = data.sentences[state.sentence].tokens.length;
  for (let l = 0; l < L; l++) for (let h = 0; h < H; h++) {
    const x0 = 40 + h * (THUMB + 6), y0 = l * (THUMB + GAP) + GAP;
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
  for (let l = 0; l < L; l++) { ctx.fillText("L" + l, 4, l * (THUMB + GAP) + GAP + THUMB / 2); }
}
function modelViewCell(ev) {
  const canvas = q("canvas.mh-modelview"), r = canvas.getBoundingClientRect();
  const x = (ev.clientX - r.left) * canvas.width / r.width - 40, y = (ev.clientY - r.top) * canvas.height / r.height - GAP;
  const h = Math.floor(x / (THUMB + 6)), l = Math.floor(y / (THUMB + GAP));
  return (h >= 0 && h < H && l >= 0 && l < L) ? [l, h] : null;
}

// --- matrix view: one head's heatmap, value under the pointer; long texts: pooled, with zoom ---
function region() {  // the shown square: rows i0.., keys j0.., n tokens a side
  const T = data.sentences[state.sentence].tokens.length;
  if (!state.zoom || state.zoom.T !== T) state.zoom = wholeRegion(T);
  return state.zoom;
}
function drawMatrixView() {
  const canvas = q("canvas.mh-matrix");
  const toks = data.sentences[state.sentence].tokens, T = toks.length, pool = pooled(state.sentence);
  const k = sparse(state.sentence).k;
  q(".mh-zoom").style.display = pool ? "" : "none";
  const tested = evidence(state.layer, state.head);
  const title = "layer " + state.layer + ", head " + state.head + ": " + label(state.layer, state.head) +
    (tested ? " (" + tested + " by ablation)" : "");
  const stored = k < T ? " — each row stores its " + k + " largest weights; the rest are not stored" : "";
  const ctx = canvas.getContext("2d");
  if (pool && region().n === T) {  // the whole map, block by block
    const C = pool.cells, cell = Math.max(2, Math.floor(512 / C)), base = (state.layer * H + state.head) * C * C;
    const arr = state.poolMode === "max" ? pool.max : pool.mass;
    canvas.width = C * cell + BAR; canvas.height = C * cell;
    setGeometry(canvas, 0, 0, C * cell);
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, canvas.width, canvas.height);
    colourBar(ctx, C * cell + 12, 0, C * cell, state.poolMode === "max" ? "√ largest weight" : "√ block mass");
    for (let a = 0; a < C; a++) for (let b = 0; b < C; b++) {
      ctx.fillStyle = blue(arr[base + a * C + b] / 255); ctx.fillRect(b * cell, a * cell, cell, cell);
    }
    q(".mh-matrix-title").textContent = title + " — blocks of " + pool.block + " x " + pool.block + " tokens, " +
      (state.poolMode === "max" ? "the largest weight in each block" : "each block's mass (its rows' mean weight on its keys)") +
      " (colour ∝ √value); click to zoom" + stored;
    return;
  }
  const z = region(), G = Math.min(z.n, 256), cell = Math.max(2, Math.min(24, Math.floor(560 / G)));
  const labelled = z.n <= ZOOM_FULL, M = labelled ? MARGIN : 0;  // every cell one (query, key) pair: name them
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
  colourBar(ctx, M + G * cell + 12, M, G * cell, "weight");
  const where = z.n < T ? " — rows " + z.i0 + "–" + (Math.min(T, z.i0 + z.n) - 1) + ", keys " + z.j0 + "–" + (Math.min(T, z.j0 + z.n) - 1) +
    (z.n > ZOOM_FULL ? " (each cell the largest stored weight in it; click to zoom)" : " at full resolution") : "";
  q(".mh-matrix-title").textContent = title + where + stored;
}
const MARGIN = 96, BAR = 64;
function setGeometry(canvas, x0, y0, size) {  // where the cells are: the hover and the tests read it
  canvas.setAttribute("data-x0", x0); canvas.setAttribute("data-y0", y0); canvas.setAttribute("data-size", size);
}
function tokenLabels(ctx, toks, i0, j0, G, cell, M) {
  ctx.fillStyle = "#222"; ctx.font = Math.min(12, Math.max(7, cell - 2)) + "px " + FONTS; ctx.textBaseline = "middle";
  for (let a = 0; a < G; a++) {
    ctx.textAlign = "right"; ctx.fillText(toks[i0 + a].slice(0, 14), M - 4, M + a * cell + cell / 2);
    ctx.save(); ctx.translate(M + a * cell + cell / 2, M - 4); ctx.rotate(-Math.PI / 2);
    ctx.textAlign = "left"; ctx.fillText(toks[j0 + a].slice(0, 14), 0, 0); ctx.restore();
  }
  ctx.save(); ctx.font = "11px " + FONTS; ctx.fillStyle = "#666"; ctx.textAlign = "left";
  ctx.fillText("query ↓  key →", 2, 10); ctx.restore();
}
function colourBar(ctx, x, y, h, name, max) {  // white (0) to blue (max, default 1), ticks
  for (let k = 0; k < h; k++) { ctx.fillStyle = blue(1 - k / h); ctx.fillRect(x, y + k, 12, 1); }
  ctx.strokeStyle = "#999"; ctx.strokeRect(x, y, 12, h);
  ctx.fillStyle = "#222"; ctx.font = "10px " + FONTS; ctx.textAlign = "left"; ctx.textBaseline = "middle";
  ticks(max).forEach(([f, text]) => ctx.fillText(text, x + 15, y + f * h));
  ctx.save(); ctx.translate(x + 46, y + h / 2); ctx.rotate(-Math.PI / 2); ctx.textAlign = "center"; ctx.fillText(name, 0, 0); ctx.restore();
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

// --- rollout view: the text's attention followed back to the input tokens (residual ½·I + ½·mean over heads) ---
const decodedRollout = new Map();
function rolloutValues(s, mode) {  // (T, T) bytes of the shown layer, or null
  const d = data.sentences[s], key = s + ":" + mode;
  if (!d[mode]) return null;
  if (!decodedRollout.has(key)) decodedRollout.set(key, b64(d[mode]));
  return rolloutLayer(decodedRollout.get(key), d.tokens.length, state.layer, mode);
}
const LABEL_W = 90;
function drawRollout() {
  const canvas = q("canvas.mh-rollout"), mode = q(".mh-rollout-mode").value, d = data.sentences[state.sentence];
  const toks = d.tokens, T = toks.length, values = rolloutValues(state.sentence, mode), ctx = canvas.getContext("2d");
  const title = q(".mh-rollout-title");
  if (!values) {
    canvas.width = 10; canvas.height = 10;
    title.textContent = mode === "flow" ? "attention flow is solved for short texts only (its cost grows as layers × tokens⁴)"
                                        : "rollout is stored for texts up to 64 tokens";
    return;
  }
  const cell = Math.max(6, Math.min(20, Math.floor(480 / T)));
  canvas.width = LABEL_W + T * cell; canvas.height = LABEL_W + T * cell;
  ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, canvas.width, canvas.height);
  let top = 1;
  for (let c = 0; c < T * T; c++) top = Math.max(top, values[c]);
  for (let i = 0; i < T; i++) for (let j = 0; j < T; j++) {
    ctx.fillStyle = blue(values[i * T + j] / top); ctx.fillRect(LABEL_W + j * cell, LABEL_W + i * cell, cell, cell);
  }
  ctx.fillStyle = "#222"; ctx.font = Math.min(12, cell) + "px " + FONTS; ctx.textBaseline = "middle";
  toks.forEach((t, i) => {
    ctx.textAlign = "right"; ctx.fillText(t.slice(0, 12), LABEL_W - 4, LABEL_W + i * cell + cell / 2);
    ctx.save(); ctx.translate(LABEL_W + i * cell + cell / 2, LABEL_W - 4); ctx.rotate(-Math.PI / 2);
    ctx.textAlign = "left"; ctx.fillText(t.slice(0, 12), 0, 0); ctx.restore();
  });
  title.textContent = (mode === "flow" ? "attention flow after the last layer (" + (L - 1) + ")"
                                       : "attention rollout after layer " + state.layer) +
    ": row = position, column = input token it draws on; residual convention ½·I + ½·(mean over heads); darkest = " +
    (top / 255).toFixed(3);
}
q(".mh-rollout-mode").addEventListener("change", () => draw());
q("canvas.mh-rollout").addEventListener("mousemove", (ev) => {
  const canvas = q("canvas.mh-rollout"), r = canvas.getBoundingClientRect(), mode = q(".mh-rollout-mode").value;
  const toks = data.sentences[state.sentence].tokens, T = toks.length, values = rolloutValues(state.sentence, mode);
  if (!values) return;
  const cell = (canvas.width - LABEL_W) / T, x = (ev.clientX - r.left) * canvas.width / r.width - LABEL_W,
        y = (ev.clientY - r.top) * canvas.height / r.height - LABEL_W;
  const i = Math.floor(y / cell), j = Math.floor(x / cell);
  if (i < 0 || j < 0 || i >= T || j >= T) return;
  info.textContent = toks[i] + " ← " + toks[j] + ": " + mode + " " + (values[i * T + j] / 255).toFixed(3);
});

// --- similarity matrix with clusters ---
// The similarity's order: by layer, or grouped (the Ward groups one after another, so a group is a
// block on the diagonal), with the spans its axes name and, grouped, each group's colour.
function similarityOrder() { return similarityLayout(L, H, data.groups, state.simOrder === "group", label); }
function summary(g) { return groupSummary(g, label); }  // the group's most common label and its share (%)
function drawSimilarity() {
  const canvas = q("canvas.mh-similarity");
  if (!data.similarity) { canvas.style.display = "none"; return; }
  const N = L * H, cell = Math.max(2, Math.floor(480 / N)), M = 44, lay = similarityOrder(), order = lay.order;
  const legendWidth = lay.grouped ? 230 : 0;
  canvas.width = M + N * cell + BAR + 20 + legendWidth; canvas.height = Math.max(M + N * cell, lay.grouped ? M + 16 * lay.spans.length : 0);
  setGeometry(canvas, M, M, N * cell);
  const ctx = canvas.getContext("2d");
  ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, canvas.width, canvas.height);
  for (let a = 0; a < N; a++) for (let b = 0; b < N; b++) {
    ctx.fillStyle = grey(data.similarity[order[a] * N + order[b]] / 255); ctx.fillRect(M + b * cell, M + a * cell, cell, cell);
  }
  ctx.strokeStyle = "rgba(220, 50, 50, 0.6)"; ctx.lineWidth = 1;  // layer (or group) boundaries
  ctx.font = "10px " + FONTS; ctx.textBaseline = "middle";
  const every = lay.grouped || L <= 12 ? 1 : Math.ceil(L / 12), gap = lay.grouped ? 10 : 4;
  lay.spans.forEach((sp, k) => {
    const p = M + sp.from * cell, mid = M + (sp.from + sp.to) * cell / 2;
    ctx.beginPath(); ctx.moveTo(M, p); ctx.lineTo(M + N * cell, p); ctx.moveTo(p, M); ctx.lineTo(p, M + N * cell); ctx.stroke();
    if (sp.colour) {  // the group's colour along both axes
      ctx.fillStyle = sp.colour;
      ctx.fillRect(M - 7, p, 6, (sp.to - sp.from) * cell); ctx.fillRect(p, M - 7, (sp.to - sp.from) * cell, 6);
    }
    if (k % every === 0) {
      ctx.fillStyle = "#222"; ctx.textAlign = "right"; ctx.fillText(sp.name, M - gap, mid);
      ctx.save(); ctx.translate(mid, M - gap); ctx.rotate(-Math.PI / 2); ctx.textAlign = "left"; ctx.fillText(sp.name, 0, 0); ctx.restore();
    }
  });
  ctx.beginPath(); ctx.moveTo(M, M + N * cell); ctx.lineTo(M + N * cell, M + N * cell); ctx.moveTo(M + N * cell, M); ctx.lineTo(M + N * cell, M + N * cell); ctx.stroke();
  const x = M + N * cell + 12;  // legend: black = identical attention, white = disjoint
  for (let k = 0; k < N * cell; k++) { ctx.fillStyle = grey(k / (N * cell)); ctx.fillRect(x, M + k, 12, 1); }
  ctx.strokeStyle = "#999"; ctx.strokeRect(x, M, 12, N * cell);
  ctx.fillStyle = "#222"; ctx.textAlign = "left"; ctx.fillText("0", x + 15, M + 4); ctx.fillText("1", x + 15, M + N * cell - 4);
  ctx.save(); ctx.translate(x + 34, M + N * cell / 2); ctx.rotate(-Math.PI / 2); ctx.textAlign = "center"; ctx.fillText("Jensen–Shannon distance", 0, 0); ctx.restore();
  if (lay.grouped) {  // which colour is which group, and what it holds
    const x2 = x + 50;
    lay.spans.forEach((sp, k) => {
      ctx.fillStyle = sp.colour; ctx.fillRect(x2, M + k * 16, 10, 10);
      ctx.fillStyle = "#222"; ctx.textAlign = "left"; ctx.fillText(sp.text, x2 + 14, M + k * 16 + 5);
    });
  }
}

// --- sortable head table; every string through textContent ---
function buildTable() {
  const table = q("table.mh-table");
  table.textContent = "";
  const head = el("tr");
  const cols = ["layer", "head", "label", ...(data.evidence ? ["evidence"] : []), "flags", ...data.metric_names];
  cols.forEach((c) => {
    const th = el("th", { "data-key": c }, c + (state.sortKey === c ? (state.sortDesc ? " ▼" : " ▲") : ""));
    th.addEventListener("click", () => { state.sortDesc = state.sortKey === c ? !state.sortDesc : false; state.sortKey = c; buildTable(); });
    head.appendChild(th);
  });
  table.appendChild(head);
  const rows = data.heads.slice();
  if (state.sortKey) {
    const k = state.sortKey, sign = state.sortDesc ? -1 : 1;
    const val = (r) => (k === "evidence" ? String(evidence(r.layer, r.head) || "") :
                        k in r ? r[k] : (r.metrics[k] === null ? -Infinity : r.metrics[k]));
    rows.sort((a, b) => { const x = val(a), y = val(b); return x < y ? -sign : x > y ? sign : 0; });
  }
  rows.forEach((r) => {
    const tr = el("tr", { "class": "mh-row", "data-layer": String(r.layer), "data-head": String(r.head) });
    tr.addEventListener("click", () => openHead(r.layer, r.head));
    tr.appendChild(el("td", {}, r.layer)); tr.appendChild(el("td", {}, r.head));
    tr.appendChild(el("td", {}, r.label));
    if (data.evidence) tr.appendChild(el("td", { "class": "mh-evidence" }, evidence(r.layer, r.head) || ""));
    tr.appendChild(el("td", {}, r.flags.join(", ")));
    data.metric_names.forEach((m) => tr.appendChild(el("td", {}, r.metrics[m] === null ? "–" : r.metrics[m].toFixed(3))));
    table.appendChild(tr);
  });
}

// --- overview: what was analysed, the label map with its legend, flags, redundancy, the probes ---
function colour(lab) { return colourOf(data, lab); }
function code(lab) { return codeOf(data, lab); }
function tableOf(head, rows) {
  const t = el("table", { "class": "mh-probe" }), tr = el("tr");
  head.forEach((h) => tr.appendChild(el("th", {}, h)));
  t.appendChild(tr);
  rows.forEach((r) => {
    const row = el("tr");
    r.forEach((c) => { const td = el("td"); if (c instanceof Node) td.appendChild(c); else td.textContent = c; row.appendChild(td); });
    t.appendChild(row);
  });
  return t;
}
function topHeads(metric, n, desc) {
  return data.heads.filter((r) => r.metrics[metric] !== null && r.metrics[metric] !== undefined)
    .sort((a, b) => (desc === false ? 1 : -1) * (a.metrics[metric] - b.metrics[metric])).slice(0, n);
}
let overviewBuilt = false;
function drawOverview() {
  if (overviewBuilt) return;
  overviewBuilt = true;
  const o = data.overview, box = q(".mh-overview");
  const corpus = o.corpus ? ", corpus " + o.corpus.sha256.slice(0, 12) : "";
  box.appendChild(el("p", { "class": "mh-meta" }, o.model + ": " + L + " layers × " + H + " heads" + (o.causal ? " (causal)" : "") +
    "; " + o.sentences + " sentences, " + o.tokens + " tokens" + corpus + "; page written " + o.written + " by multihead " + o.version));
  box.appendChild(el("h3", {}, "Heads by label (click a head to open it)"));
  const map = el("table", { "class": "mh-labelmap" }), head = el("tr");
  head.appendChild(el("th", {}, ""));
  for (let h = 0; h < H; h++) head.appendChild(el("th", {}, "H" + h));
  map.appendChild(head);
  const flagged = {};
  (o.flags || []).forEach(([l, h, f]) => { flagged[l * H + h] = f; });
  for (let l = 0; l < L; l++) {
    const tr = el("tr");
    tr.appendChild(el("th", {}, "L" + l));
    for (let h = 0; h < H; h++) {
      const lab = label(l, h), td = el("td", { "class": "mh-mapcell", "data-layer": String(l), "data-head": String(h),
                                                 title: "L" + l + ".H" + h + ": " + lab + (flagged[l * H + h] ? " — " + flagged[l * H + h].join(", ") : "") });
      td.style.background = colour(lab);
      td.textContent = code(lab) + mark(l, h) + (flagged[l * H + h] ? " !" : "");
      td.addEventListener("click", () => openHead(l, h));
      tr.appendChild(td);
    }
    map.appendChild(tr);
  }
  box.appendChild(map);
  const legend = el("dl", { "class": "mh-legend" }), used = new Set(data.labels.map((x) => x.startsWith("syntactic:") ? "syntactic:REL" : x));
  Object.entries(o.legend).forEach(([lab, rule]) => {
    if (!used.has(lab)) return;
    const dt = el("dt", {}, lab); dt.style.background = colour(lab === "syntactic:REL" ? "syntactic" : lab);
    legend.append(dt, el("dd", {}, rule));
  });
  Object.entries(o.flag_legend).forEach(([flag, rule]) => legend.append(el("dt", {}, "! " + flag), el("dd", {}, "flag: " + rule)));
  if (data.evidence) {
    Object.entries(data.marks || {}).forEach(([m, sign]) => legend.append(el("dt", {}, sign), el("dd", {}, (data.mark_words || {})[m] || m)));
  }
  box.appendChild(legend);
  const flags = el("p");
  flags.appendChild(document.createTextNode("Degenerate heads (flags): "));
  if (!(o.flags || []).length) flags.appendChild(document.createTextNode("none"));
  (o.flags || []).forEach(([l, h, f], k) => { if (k) flags.appendChild(document.createTextNode(", ")); flags.appendChild(headLink(l, h)); flags.appendChild(document.createTextNode(" " + f.join("/"))); });
  box.appendChild(flags);
  if (data.pairs && data.pairs.length) {
    box.appendChild(el("h3", {}, "Most redundant pairs (Jensen–Shannon distance of their attention)"));
    box.appendChild(tableOf(["head", "head", "JS distance"], data.pairs.slice(0, 8).map(([a, b, v]) => [headLink(a[0], a[1]), headLink(b[0], b[1]), fmt(v)])));
  }
  if (o.syntax) {
    box.appendChild(el("h3", {}, "Syntax: best head per relation against the best fixed offset"));
    const rows = Object.entries(o.syntax.relations).filter(([, d]) => d.count >= o.syntax.min_count)
      .sort((a, b) => (b[1].best.accuracy - b[1].baseline) - (a[1].best.accuracy - a[1].baseline)).slice(0, 15);
    box.appendChild(tableOf(["relation", "count", "best head", "accuracy", "baseline (offset)"],
      rows.map(([rel, d]) => [rel, d.count, headLink(d.best.layer, d.best.head), fmt(d.best.accuracy), fmt(d.baseline) + " (" + (d.baseline_offset > 0 ? "+" : "") + d.baseline_offset + ")"])));
  }
  if (o.coreference) {
    box.appendChild(el("h3", {}, "Coreference: pronoun → antecedent (" + o.coreference.examples + " examples), against the nearest mention (" + fmt(o.coreference.baseline_nearest) + ")"));
    box.appendChild(tableOf(["head", "accuracy", "baseline"], topHeads("coreference", 5).map((r) => [headLink(r.layer, r.head), fmt(r.metrics.coreference), fmt(o.coreference.baseline_nearest)])));
  }
  if (o.induction) {
    const uniform = 1 / (1.5 * o.induction.length);
    box.appendChild(el("h3", {}, "Induction (repeated random tokens), against uniform attention (" + fmt(uniform) + ")"));
    box.appendChild(tableOf(["head", "induction", "duplicate token", "uniform"], topHeads("induction", 6).map((r) => [headLink(r.layer, r.head), fmt(r.metrics.induction), fmt(r.metrics.duplicate_token), fmt(uniform)])));
  }
  if (o.ablation) {
    box.appendChild(el("h3", {}, "Ablation: the heads whose removal changes " + o.ablation.objective + " most (" + o.ablation.texts + " texts)"));
    box.appendChild(tableOf(["head", "zero ablation", "mean ablation"], topHeads("zero_ablation", 6).map((r) => [headLink(r.layer, r.head), fmt(r.metrics.zero_ablation, 4), fmt(r.metrics.mean_ablation, 4)])));
  }
  if (o.evidence && o.evidence.heads.length) {
    box.appendChild(el("h3", {}, "Labels tested by ablation"));
    box.appendChild(tableOf(["head", "label", "measured", "confirmed at", "mark"], o.evidence.heads.map((e) => [headLink(e.layer, e.head), e.label, fmt(e.value, 4), fmt(e.threshold, 4), e.mark])));
    box.appendChild(el("p", { "class": "mh-note" }, Object.entries(o.evidence.tests).map(([k, v]) => k + ": " + v).join(" · ")));
  }
  if (o.long_context) {
    box.appendChild(el("h3", {}, "Long context (" + o.long_context.longest_tokens + " tokens): attention sinks and long-range heads"));
    box.appendChild(tableOf(["head", "on the first token", "beyond 1,024 tokens (sinks aside)"], topHeads("sink_first", 6).map((r) => [headLink(r.layer, r.head), fmt(r.metrics.sink_first), fmt(r.metrics.long_1024_past_sinks)])));
  }
}

// --- head detail (under the matrix): this head's metrics against its layer and the model, and the
// page's sentences ranked by how typical the head's attention is of its label on each ---
function measure(s, l, h, lab) {
  if (pooled(s)) return null;
  const T = data.sentences[s].tokens.length;
  let total = 0;
  for (let i = 0; i < T; i++) eachStored(s, l, h, i, (j, w) => {
    if (lab === "previous" ? j === i - 1 : lab === "next" ? j === i + 1 : lab === "self" ? j === i :
        lab === "special-token" ? (j === 0 || j === T - 1) : lab === "local" ? Math.abs(i - j) <= 2 : false) total += w;
  });
  if (!["previous", "next", "self", "special-token", "local"].includes(lab)) {  // otherwise: how peaked its rows are
    total = 0;
    for (let i = 0; i < T; i++) { let top = 0; eachStored(s, l, h, i, (j, w) => { top = Math.max(top, w); }); total += top; }
  }
  return total / T;
}
function drawDetail() {
  const box = q(".mh-detail");
  box.textContent = "";
  const l = state.layer, h = state.head, lab = label(l, h);
  if (data.heads.length) {
    const me = data.heads[l * H + h], rows = [];
    data.metric_names.forEach((m) => {
      const v = me.metrics[m];
      if (v === null || v === undefined) return;
      const layer = data.heads.filter((r) => r.layer === l && r.metrics[m] !== null).map((r) => r.metrics[m]);
      const all = data.heads.filter((r) => r.metrics[m] !== null).map((r) => r.metrics[m]);
      const mean = layer.reduce((a, b) => a + b, 0) / layer.length, below = all.filter((x) => x < v).length;
      rows.push([m, fmt(v, 4), fmt(mean, 4), fmt(Math.min(...layer), 3) + " – " + fmt(Math.max(...layer), 3), Math.round(100 * below / all.length) + "%"]);
    });
    box.appendChild(el("h4", {}, "L" + l + ".H" + h + " (" + lab + mark(l, h) + "): its metrics against its layer and the model"));
    box.appendChild(tableOf(["metric", "this head", "layer mean", "layer range", "model percentile"], rows));
  }
  const typical = data.overview && data.overview.typical;
  const mine = typical && typical.heads.find((e) => e.layer === l && e.head === h);
  if (mine && mine.texts.length) {  // over the whole corpus, kept while it was analysed
    const syntax = mine.measure.startsWith("syntax:");
    const words = { repeat_successor: "attention to the token after an earlier occurrence", "cls+sep": "attention to [CLS]/[SEP]",
                    entropy_norm: "normalised entropy", max_weight: "largest weight per row" };
    const name = syntax ? "share of its " + mine.measure.slice(7) + " dependents on their governor" : "mean " + (words[mine.measure] || mine.measure.replace("_token", "-token attention"));
    box.appendChild(el("h4", {}, "The corpus texts where it is most typical of its label (" + name + ", of " + data.overview.sentences + " texts)"));
    box.appendChild(tableOf(["text", name, syntax ? "dependents" : "tokens"], mine.texts.map(([i, v, n]) => {
      const text = typical.texts[String(i)] || "", s = data.sentences.findIndex((d) => d.text === text);
      if (s < 0) return [text, fmt(v), n];
      const a = el("a", { href: "#s=" + s + "&l=" + l + "&h=" + h + "&v=matrix" }, text);
      a.addEventListener("click", (ev) => { ev.preventDefault(); state.sentence = s; sentenceSelect.value = String(s); state.zoom = null; draw(); });
      return [a, fmt(v), n];
    })));
  }
  const what = ["previous", "next", "self", "special-token", "local"].includes(lab) ? lab.replace("-token", "") + " attention" : "mean largest weight per row";
  const ranked = data.sentences.map((d, s) => [s, measure(s, l, h, lab)]).filter((x) => x[1] !== null).sort((a, b) => b[1] - a[1]);
  if (ranked.length) {
    box.appendChild(el("h4", {}, "The page's texts, most typical first (" + what + ")"));
    box.appendChild(tableOf(["text", what], ranked.map(([s, v]) => {
      const a = el("a", { href: "#s=" + s + "&l=" + l + "&h=" + h + "&v=matrix" }, data.sentences[s].text.slice(0, 80));
      a.addEventListener("click", (ev) => { ev.preventDefault(); state.sentence = s; sentenceSelect.value = String(s); state.zoom = null; draw(); });
      return [a, fmt(v)];
    })));
  }
}

function draw() {
  writeFragment();
  if (state.view === "overview") drawOverview();
  else if (state.view === "head") drawHeadView();
  else if (state.view === "model") drawModelView();
  else if (state.view === "matrix") { drawMatrixView(); drawDetail(); }
  else if (state.view === "similarity") drawSimilarity();
  else if (state.view === "rollout") drawRollout();
}

q("canvas.mh-modelview").addEventListener("click", (ev) => {
  const c = modelViewCell(ev);
  if (!c) return;
  state.layer = c[0]; state.head = c[1]; layerSelect.value = String(c[0]);
  root.querySelector('.mh-tab[data-view="matrix"]').click();
});
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
  if (cellAt && pooled(state.sentence)) zoomAt(cellAt[0], cellAt[1], 4);
});
q(".mh-zoom-out").addEventListener("click", () => { const z = region(); zoomAt(z.i0 + z.n / 2, z.j0 + z.n / 2, 0.25); });
q(".mh-zoom-all").addEventListener("click", () => { state.zoom = null; draw(); });
q(".mh-pool-mode").addEventListener("change", (ev) => { state.poolMode = ev.target.value; draw(); });
function similarityCell(ev) {
  const canvas = q("canvas.mh-similarity"), r = canvas.getBoundingClientRect(), N = L * H;
  const x0 = +canvas.getAttribute("data-x0"), size = +canvas.getAttribute("data-size");
  const x = (ev.clientX - r.left) * canvas.width / r.width - x0, y = (ev.clientY - r.top) * canvas.height / r.height - x0;
  const b = Math.floor(x / size * N), a = Math.floor(y / size * N);
  const order = similarityOrder().order;  // display position -> head index
  return (a < 0 || b < 0 || a >= N || b >= N) ? null : [order[a], order[b]];
}
q("canvas.mh-similarity").addEventListener("click", (ev) => {
  const c = similarityCell(ev);
  if (c) openHead(Math.floor(c[0] / H), c[0] % H);
});
q("canvas.mh-similarity").addEventListener("mousemove", (ev) => {
  const c = similarityCell(ev), N = L * H;
  if (!c) return;
  const [a, b] = c;
  info.textContent = "L" + Math.floor(a / H) + ".H" + (a % H) + " ~ L" + Math.floor(b / H) + ".H" + (b % H) +
    ": JS distance " + (data.similarity[a * N + b] / 255).toFixed(3);
});
function download(name, href) { const a = el("a", { href: href, download: name }); root.appendChild(a); a.click(); a.remove(); }
function tableCSV() {
  const cell = (v) => { const t = v === null || v === undefined ? "" : String(v); return /[",\n]/.test(t) ? '"' + t.replace(/"/g, '""') + '"' : t; };
  const rows = [["layer", "head", "label", "evidence", "flags", ...data.metric_names].join(",")];
  data.heads.forEach((r) => rows.push([r.layer, r.head, r.label, evidence(r.layer, r.head) || "", r.flags.join(";"),
                                       ...data.metric_names.map((m) => r.metrics[m])].map(cell).join(",")));
  return rows.join("\n") + "\n";
}
q(".mh-export-csv").addEventListener("click", () => {
  if (!data.heads.length) { info.textContent = "no report on this page: the table is empty"; return; }
  download("multihead-heads.csv", "data:text/csv;charset=utf-8," + encodeURIComponent(tableCSV()));
});
q(".mh-export-png").addEventListener("click", () => {
  if (state.view === "overview") {  // the label map: its SVG drawn at twice the size into a PNG
    const img = new Image(), svg = mapSVG();
    img.onload = () => {
      const c = document.createElement("canvas");
      c.width = img.width * 2; c.height = img.height * 2;
      const ctx = c.getContext("2d");
      ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, c.width, c.height); ctx.drawImage(img, 0, 0, c.width, c.height);
      download("multihead-map.png", c.toDataURL("image/png"));
    };
    img.src = "data:image/svg+xml;charset=utf-8," + encodeURIComponent(svg);
    return;
  }
  if (state.view === "table") { q(".mh-export-csv").click(); return; }  // a table exports as CSV
  const canvas = root.querySelector('.mh-view[data-view="' + state.view + '"] canvas');
  if (canvas) download("multihead-" + state.view + ".png", canvas.toDataURL("image/png"));
});
const escSVG = (t) => String(t).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
function mapSVG() {  // the layer x head label map, labelled
  const cw = 64, ch = 18, M = 34, parts = ['<svg xmlns="http://www.w3.org/2000/svg" width="' + (M + H * cw) + '" height="' + (M + L * ch + 4) +
    '" font-family="sans-serif, mh-glyphs" font-size="9">', '<text x="2" y="12" font-size="11">' + escSVG((data.model || "") + ": heads by label") + '</text>'];
  for (let h = 0; h < H; h++) parts.push('<text x="' + (M + h * cw + cw / 2) + '" y="' + (M - 4) + '" text-anchor="middle">H' + h + '</text>');
  for (let l = 0; l < L; l++) {
    parts.push('<text x="' + (M - 4) + '" y="' + (M + l * ch + 12) + '" text-anchor="end">L' + l + '</text>');
    for (let h = 0; h < H; h++) {
      parts.push('<rect x="' + (M + h * cw) + '" y="' + (M + l * ch) + '" width="' + cw + '" height="' + ch + '" fill="' + colour(label(l, h)) + '" stroke="#ccc"/>');
      parts.push('<text x="' + (M + h * cw + cw / 2) + '" y="' + (M + l * ch + 12) + '" text-anchor="middle">' + escSVG(code(label(l, h)) + mark(l, h)) + '</text>');
    }
  }
  parts.push("</svg>");
  return parts.join("");
}
function similaritySVG() {  // the head x head distances with layer (or group) labels and boundaries
  if (!data.similarity) return null;
  const lay = similarityOrder(), order = lay.order;
  const N = L * H, cell = Math.max(2, Math.floor(540 / N)), M = 48, legendHeight = lay.grouped ? 14 * lay.spans.length + 6 : 0;
  const parts = ['<svg xmlns="http://www.w3.org/2000/svg" width="' + (M + N * cell + 10) +
    '" height="' + (M + N * cell + 10 + legendHeight) + '" font-family="sans-serif" font-size="9">', '<text x="2" y="12" font-size="11">' +
    escSVG((data.model || "") + ": Jensen–Shannon distance between heads (black 0, white 1)" + (lay.grouped ? ", grouped" : "")) + '</text>'];
  for (let a = 0; a < N; a++) for (let b = 0; b < N; b++) {
    const c = data.similarity[order[a] * N + order[b]];
    parts.push('<rect x="' + (M + b * cell) + '" y="' + (M + a * cell) + '" width="' + cell + '" height="' + cell + '" fill="rgb(' + c + ',' + c + ',' + c + ')"/>');
  }
  lay.spans.forEach((sp) => {
    const p = M + sp.from * cell, w = (sp.to - sp.from) * cell;
    parts.push('<line x1="' + M + '" y1="' + p + '" x2="' + (M + N * cell) + '" y2="' + p + '" stroke="#d33" stroke-width="0.5"/>');
    parts.push('<line x1="' + p + '" y1="' + M + '" x2="' + p + '" y2="' + (M + N * cell) + '" stroke="#d33" stroke-width="0.5"/>');
    if (sp.colour) parts.push('<rect x="' + (M - 7) + '" y="' + p + '" width="6" height="' + w + '" fill="' + sp.colour + '"/>');
    parts.push('<text x="' + (M - (sp.colour ? 10 : 4)) + '" y="' + (p + w / 2 + 3) + '" text-anchor="end">' + escSVG(sp.name) + '</text>');
  });
  lay.spans.forEach((sp, k) => {
    if (!sp.text) return;
    const y = M + N * cell + 10 + k * 14;
    parts.push('<rect x="' + M + '" y="' + y + '" width="10" height="10" fill="' + sp.colour + '"/>');
    parts.push('<text x="' + (M + 14) + '" y="' + (y + 9) + '">' + escSVG(sp.text) + '</text>');
  });
  parts.push("</svg>");
  return parts.join("");
}
q(".mh-export-svg").addEventListener("click", () => {  // the overview's map, the similarity, or the matrix
  const [name, svg] = state.view === "overview" ? ["map", mapSVG()] : state.view === "similarity" ? ["similarity", similaritySVG()] : ["matrix", matrixSVG()];
  if (svg === null) {
    info.textContent = name === "matrix" ? "SVG export draws texts up to " + LONG + " tokens; use export PNG" : "no similarity on this page";
    return;
  }
  download("multihead-" + name + ".svg", "data:image/svg+xml;charset=utf-8," + encodeURIComponent(svg));
});

const simOrderSelect = q("select.mh-sim-order");
if (!data.groups) simOrderSelect.style.display = "none";
simOrderSelect.addEventListener("change", (ev) => { state.simOrder = ev.target.value; draw(); });
const clusters = q(".mh-clusters");
function headList(parent, heads) { heads.forEach((x, k) => { if (k) parent.appendChild(document.createTextNode(" ")); parent.appendChild(headLink(x[0], x[1])); }); }
if (data.groups) {
  const title = el("li", { "class": "mh-groups-title" }, "Groups of heads that attend alike (Ward clustering of the JS distance, cut into " +
    data.groups.groups.length + " groups where the silhouette is best: " + data.groups.silhouette.toFixed(2) + "):");
  clusters.appendChild(title);
  data.groups.groups.forEach((g, k) => {
    const [top, share] = summary(g);
    const item = el("li", { "class": "mh-group" }, "group " + (k + 1) + " (G" + (k + 1) + "): " + g.length + " heads, " + share + "% " + top + " — ");
    headList(item, g);
    clusters.appendChild(item);
  });
}
if (data.similarity) {
  const near = el("li", { "class": "mh-near" }, (data.clusters || []).length ? "Near-identical heads (JS distance ≤ 0.2, linked): " :
    "No two heads attend near-identically (no pair within JS distance 0.2).");
  (data.clusters || []).forEach((g, k) => { if (k) near.appendChild(document.createTextNode("; ")); headList(near, g); });
  clusters.appendChild(near);
} else {
  clusters.appendChild(el("li", {}, "No similarity on this page: it needs the report of an analysis with redundancy."));
}
buildTable();
const glyphs = document.fonts ? document.fonts.load("12px 'mh-glyphs'", data.sentences.map((s) => s.tokens.join("")).join(""))
                               .catch(() => null) : Promise.resolve();
Promise.all([...data.sentences.map((_, s) => prepare(s)), glyphs]).then(() => {
  const view = readFragment();
  if (view) showView(view); else showView(state.view);
  window.addEventListener("hashchange", () => {  // a link to another view of this page, or back/forward
    const next = readFragment();
    state.zoom = null;
    showView(next || state.view);
  });
  root.setAttribute("data-ready", "1");
}, (err) => { info.textContent = "could not read the page's data: " + err; });
