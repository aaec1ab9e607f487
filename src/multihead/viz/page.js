// multihead attention page: everything inline, nothing from the network.
// Each page instance lives in its own container and closure, so several in one notebook don't interfere.
(function () {
  "use strict";
  const root = document.getElementById("__ROOT_ID__");
  const data = JSON.parse(document.getElementById("__ROOT_ID__-data").textContent);
  const L = data.num_layers, H = data.num_heads;
  const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                  "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd"];
  // the page's own glyphs (a subset of Noto Sans CJK, a data: font) after the system's: no tofu offline
  const FONTS = "sans-serif, 'mh-glyphs'";
  const LONG = data.long_text || 512;  // texts longer than this are stored pooled
  const state = { poolMode: "mass", zoom: null, sentence: 0, layer: 0, head: 0, heads: new Set([...Array(H).keys()]), view: "model",
                  sortKey: null, sortDesc: false };

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
  function b64(text) {
    const bin = atob(text), arr = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) arr[i] = bin.charCodeAt(i);
    return arr;
  }
  async function inflate(text) {  // the browser's own gzip: nothing is loaded
    const stream = new Blob([b64(text)]).stream().pipeThrough(new DecompressionStream("gzip"));
    return new Uint8Array(await new Response(stream).arrayBuffer());
  }
  async function prepare(s) {
    const d = data.sentences[s];
    if (!d.gzip) return;
    const [idx, val] = await Promise.all([inflate(d.index), inflate(d.values)]);
    const entry = { idx: new Uint16Array(idx.buffer), val: val, k: d.k, T: d.tokens.length };
    if (d.pooled) {
      const [mass, max] = await Promise.all([inflate(d.pooled.mass), inflate(d.pooled.max)]);
      entry.pooled = { block: d.pooled.block, cells: d.pooled.cells, mass: mass, max: max, scale: d.pooled.mass_scale };
    }
    decoded.set(s, entry);
  }
  function sparse(s) {
    if (!decoded.has(s)) {
      const d = data.sentences[s];
      decoded.set(s, { idx: new Uint16Array(b64(d.index).buffer), val: b64(d.values), k: d.k, T: d.tokens.length });
    }
    return decoded.get(s);
  }
  function pooled(s) { return sparse(s).pooled || null; }
  function eachEntry(s, l, h, i, fn) {  // fn(j, weight) for the row's kept entries
    const d = sparse(s), base = ((l * H + h) * d.T + i) * d.k;
    for (let e = 0; e < d.k; e++) { const v = d.val[base + e]; if (v > 0) fn(d.idx[base + e], v / 255); }
  }
  function weight(s, l, h, i, j) {  // the stored weight of key j in row i, or null when the row did not keep it
    const d = sparse(s), base = ((l * H + h) * d.T + i) * d.k;
    for (let e = 0; e < d.k; e++) if (d.idx[base + e] === j) return d.val[base + e] / 255;
    return null;
  }
  function kept(s, l, h, i) {  // the share of row i's attention its stored weights carry
    let sum = 0;
    eachEntry(s, l, h, i, (j, v) => { sum += v; });
    return Math.min(1, sum);
  }
  function label(l, h) { return data.labels ? data.labels[l * H + h] : ""; }
  // a label tested by ablation: ✓ confirmed (the behaviour needs the head), ~ attention-only
  function evidence(l, h) { return data.evidence ? data.evidence[l * H + h] : null; }
  function mark(l, h) { const e = evidence(l, h); return e === "confirmed" ? " ✓" : e === "attention-only" ? " ~" : ""; }

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
    headBoxes.appendChild(box);
  }
  controls.appendChild(headBoxes);
  sentenceSelect.addEventListener("change", () => { state.sentence = +sentenceSelect.value; state.zoom = null; draw(); });
  layerSelect.addEventListener("change", () => { state.layer = +layerSelect.value; draw(); });
  root.querySelectorAll(".mh-tab").forEach((tab) => tab.addEventListener("click", () => {
    state.view = tab.getAttribute("data-view");
    root.querySelectorAll(".mh-tab").forEach((t) => t.classList.toggle("active", t === tab));
    root.querySelectorAll(".mh-view").forEach((v) => { v.style.display = v.getAttribute("data-view") === state.view ? "" : "none"; });
    draw();
  }));
  const info = q(".mh-info");

  // --- head view: lines from each token to the tokens it attends to ---
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
    const row = T > 200 ? 4 : 16, width = 520;
    canvas.width = width; canvas.height = Math.max(60, T * row + 20);
    const ctx = canvas.getContext("2d");
    ctx.clearRect(0, 0, canvas.width, canvas.height);
    ctx.font = (row >= 12 ? 12 : row) + "px " + FONTS;
    ctx.textBaseline = "middle";
    if (row >= 10) {
      toks.forEach((t, i) => {
        ctx.fillStyle = "#222";
        ctx.textAlign = "right"; ctx.fillText(t, 150, 10 + i * row + row / 2);
        ctx.textAlign = "left"; ctx.fillText(t, width - 150, 10 + i * row + row / 2);
      });
    }
    ctx.lineWidth = 1.5;
    for (const h of state.heads) {
      ctx.strokeStyle = COLORS[h % COLORS.length];
      for (let i = 0; i < T; i++) eachEntry(state.sentence, state.layer, h, i, (j, w) => {
        if (w < 0.02) return;
        ctx.globalAlpha = Math.min(1, w);
        ctx.beginPath(); ctx.moveTo(158, 10 + i * row + row / 2); ctx.lineTo(width - 158, 10 + j * row + row / 2); ctx.stroke();
      });
    }
    ctx.globalAlpha = 1;
  }

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
        for (let i = 0; i < T; i++) eachEntry(state.sentence, l, h, i, (j, w) => {
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
      ctx.fillText(label(l, h).replace("syntactic:", "syn:").slice(0, 11) + mark(l, h), x0, y0 - 2);
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
  const ZOOM_FULL = 128;  // a region this many tokens wide or less is drawn cell by cell
  function region() {  // the shown square: rows i0.., keys j0.., n tokens a side
    const T = data.sentences[state.sentence].tokens.length;
    if (!state.zoom || state.zoom.T !== T) state.zoom = { i0: 0, j0: 0, n: T, T: T };
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
      canvas.width = C * cell; canvas.height = C * cell;
      for (let a = 0; a < C; a++) for (let b = 0; b < C; b++) {
        const c = 255 - arr[base + a * C + b];
        ctx.fillStyle = "rgb(" + c + "," + c + ",255)"; ctx.fillRect(b * cell, a * cell, cell, cell);
      }
      q(".mh-matrix-title").textContent = title + " — blocks of " + pool.block + " x " + pool.block + " tokens, " +
        (state.poolMode === "max" ? "the largest weight in each block" : "each block's mass (its rows' mean weight on its keys)") +
        " (colour ∝ √value); click to zoom" + stored;
      return;
    }
    const z = region(), G = Math.min(z.n, 256), cell = Math.max(2, Math.min(24, Math.floor(560 / G)));
    canvas.width = G * cell; canvas.height = G * cell;
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, canvas.width, canvas.height);
    const cells = new Float32Array(G * G);
    for (let i = z.i0; i < Math.min(T, z.i0 + z.n); i++) eachEntry(state.sentence, state.layer, state.head, i, (j, w) => {
      if (j < z.j0 || j >= z.j0 + z.n) return;
      const c = Math.floor((i - z.i0) * G / z.n) * G + Math.floor((j - z.j0) * G / z.n);
      if (w > cells[c]) cells[c] = w;
    });
    for (let c = 0; c < G * G; c++) if (cells[c] > 0) {
      const v = 255 - Math.round(255 * Math.min(1, cells[c]));
      ctx.fillStyle = "rgb(" + v + "," + v + ",255)"; ctx.fillRect((c % G) * cell, Math.floor(c / G) * cell, cell, cell);
    }
    const where = z.n < T ? " — rows " + z.i0 + "–" + (Math.min(T, z.i0 + z.n) - 1) + ", keys " + z.j0 + "–" + (Math.min(T, z.j0 + z.n) - 1) +
      (z.n > ZOOM_FULL ? " (each cell the largest stored weight in it; click to zoom)" : " at full resolution") : "";
    q(".mh-matrix-title").textContent = title + where + stored;
  }
  function zoomAt(i, j, factor) {
    const T = data.sentences[state.sentence].tokens.length, z = region();
    const n = Math.max(Math.min(ZOOM_FULL, T), Math.min(T, Math.round(z.n / factor)));
    const clamp = (x) => Math.max(0, Math.min(T - n, Math.round(x - n / 2)));
    state.zoom = { i0: clamp(i), j0: clamp(j), n: n, T: T };
    draw();
  }
  function matrixCell(ev) {  // the (row, key) token under the pointer, in the shown region
    const canvas = q("canvas.mh-matrix"), r = canvas.getBoundingClientRect(), z = region();
    const T = data.sentences[state.sentence].tokens.length;
    const j = z.j0 + Math.floor((ev.clientX - r.left) / r.width * z.n), i = z.i0 + Math.floor((ev.clientY - r.top) / r.height * z.n);
    return (i < 0 || j < 0 || i >= T || j >= T) ? null : [i, j];
  }
  function matrixSVG() {
    const toks = data.sentences[state.sentence].tokens, T = toks.length, cell = 10;
    if (pooled(state.sentence)) return null;  // thousands of tokens: the PNG export is the one to use
    const parts = ['<svg xmlns="http://www.w3.org/2000/svg" width="' + T * cell + '" height="' + T * cell + '">'];
    for (let i = 0; i < T; i++) eachEntry(state.sentence, state.layer, state.head, i, (j, w) => {
      const c = 255 - Math.round(255 * Math.min(1, w));
      parts.push('<rect x="' + j * cell + '" y="' + i * cell + '" width="' + cell + '" height="' + cell + '" fill="rgb(' + c + ',' + c + ',255)"/>');
    });
    parts.push("</svg>");
    return parts.join("");
  }

  // --- rollout view: the text's attention followed back to the input tokens (residual ½·I + ½·mean over heads) ---
  const decodedRollout = new Map();
  function rolloutValues(s, mode) {  // (T, T) bytes of the shown layer, or null
    const d = data.sentences[s], key = s + ":" + mode;
    if (!d[mode]) return null;
    if (!decodedRollout.has(key)) decodedRollout.set(key, b64(d[mode]));
    const all = decodedRollout.get(key), T = d.tokens.length;
    return mode === "flow" ? all : all.subarray(state.layer * T * T, (state.layer + 1) * T * T);
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
      const v = 255 - Math.round(255 * values[i * T + j] / top);
      ctx.fillStyle = "rgb(" + v + "," + v + ",255)"; ctx.fillRect(LABEL_W + j * cell, LABEL_W + i * cell, cell, cell);
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
  function drawSimilarity() {
    const canvas = q("canvas.mh-similarity");
    if (!data.similarity) { canvas.style.display = "none"; return; }
    const N = L * H, cell = Math.max(2, Math.floor(480 / N));
    canvas.width = N * cell; canvas.height = N * cell;
    const ctx = canvas.getContext("2d");
    for (let a = 0; a < N; a++) for (let b = 0; b < N; b++) {
      const v = data.similarity[a * N + b] / 255, c = Math.round(255 * v);
      ctx.fillStyle = "rgb(" + c + "," + c + "," + c + ")"; ctx.fillRect(b * cell, a * cell, cell, cell);
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
      const tr = el("tr");
      tr.appendChild(el("td", {}, r.layer)); tr.appendChild(el("td", {}, r.head));
      tr.appendChild(el("td", {}, r.label));
      if (data.evidence) tr.appendChild(el("td", { "class": "mh-evidence" }, evidence(r.layer, r.head) || ""));
      tr.appendChild(el("td", {}, r.flags.join(", ")));
      data.metric_names.forEach((m) => tr.appendChild(el("td", {}, r.metrics[m] === null ? "–" : r.metrics[m].toFixed(3))));
      table.appendChild(tr);
    });
  }

  function draw() {
    if (state.view === "head") drawHeadView();
    else if (state.view === "model") drawModelView();
    else if (state.view === "matrix") drawMatrixView();
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
      const C = pool.cells, a = Math.floor(i / pool.block), b = Math.floor(j / pool.block), at = ((state.layer * H + state.head) * C + a) * C + b;
      const mass = Math.pow(pool.mass[at] / 255, 2) * pool.scale[state.layer * H + state.head], max = Math.pow(pool.max[at] / 255, 2);
      const span = (x) => (x * pool.block) + "–" + (Math.min(T, (x + 1) * pool.block) - 1);
      info.textContent = "rows " + span(a) + " → keys " + span(b) + ": mass " + mass.toFixed(4) + ", largest weight " + max.toFixed(3);
      return;
    }
    const w = weight(state.sentence, state.layer, state.head, i, j), k = sparse(state.sentence).k;
    const share = kept(state.sentence, state.layer, state.head, i);
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
  q("canvas.mh-similarity").addEventListener("mousemove", (ev) => {
    const canvas = q("canvas.mh-similarity"), r = canvas.getBoundingClientRect(), N = L * H;
    const b = Math.floor((ev.clientX - r.left) / r.width * N), a = Math.floor((ev.clientY - r.top) / r.height * N);
    if (a < 0 || b < 0 || a >= N || b >= N) return;
    info.textContent = "L" + Math.floor(a / H) + ".H" + (a % H) + " ~ L" + Math.floor(b / H) + ".H" + (b % H) +
      ": JS distance " + (data.similarity[a * N + b] / 255).toFixed(3);
  });
  function download(name, href) { const a = el("a", { href: href, download: name }); root.appendChild(a); a.click(); a.remove(); }
  q(".mh-export-png").addEventListener("click", () => {
    const canvas = root.querySelector('.mh-view[data-view="' + state.view + '"] canvas');
    if (canvas) download("multihead-" + state.view + ".png", canvas.toDataURL("image/png"));
  });
  q(".mh-export-svg").addEventListener("click", () => {
    const svg = matrixSVG();
    if (svg === null) { info.textContent = "SVG export draws texts up to " + LONG + " tokens; use export PNG"; return; }
    download("multihead-matrix.svg", "data:image/svg+xml;charset=utf-8," + encodeURIComponent(svg));
  });

  const clusters = q(".mh-clusters");
  (data.clusters || []).forEach((g) => clusters.appendChild(el("li", {}, g.map((x) => "L" + x[0] + ".H" + x[1]).join(" "))));
  buildTable();
  const glyphs = document.fonts ? document.fonts.load("12px 'mh-glyphs'", data.sentences.map((s) => s.tokens.join("")).join(""))
                                 .catch(() => null) : Promise.resolve();
  Promise.all([...data.sentences.map((_, s) => prepare(s)), glyphs]).then(() => {
    draw();
    root.setAttribute("data-ready", "1");
  }, (err) => { info.textContent = "could not read the page's data: " + err; });
})();
