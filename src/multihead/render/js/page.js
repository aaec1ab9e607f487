// multihead attention page: the page's controls, its state, the link to each view, and the start.
// The views are modules of their own (view-*.js), each given this page's context; the pure parts —
// decoding, colours, labels, zoom arithmetic, the similarity's order — too (decode.js, scales.js,
// labels.js, zoom.js, layout.js). render/js/__init__.py joins them with this file into the page's one
// script, each page instance in its own closure, so several in one notebook do not interfere.
import { dataProblem, eachEntry, inflatedEntry, sparseEntry } from "./decode.js";
import { el } from "./dom.js";
import { exportButtons } from "./exports.js";
import { codeOf, colourOf, evidenceOf, labelOf, markOf } from "./labels.js";
import { COLORS } from "./scales.js";
import { detailView } from "./view-detail.js";
import { headView } from "./view-head.js";
import { matrixView } from "./view-matrix.js";
import { modelView } from "./view-model.js";
import { overviewView } from "./view-overview.js";
import { rolloutView } from "./view-rollout.js";
import { similarityView } from "./view-similarity.js";
import { tableView } from "./view-table.js";

const root = document.getElementById("__ROOT_ID__");
const data = JSON.parse(document.getElementById("__ROOT_ID__-data").textContent);
const problem = dataProblem(data);
if (problem) {  // say so on the page, and draw nothing from data this script cannot read
  root.prepend(document.createTextNode("multihead page: " + problem));
  throw new Error("multihead page: " + problem);
}
const L = data.num_layers, H = data.num_heads;
const LONG = data.long_text || 512;  // texts longer than this are stored pooled
const state = { poolMode: "mass", zoom: null, sentence: 0, layer: 0, head: 0, heads: new Set([...Array(H).keys()]), view: data.overview ? "overview" : "model", hover: null,
                sortKey: null, sortDesc: false, simOrder: "layer" };

const q = (sel) => root.querySelector(sel);

// --- data: per row, the k largest weights: uint16 key indices (uint32 past 65,536 tokens) + uint8 values
// (0..255 = 0..1), base64; long texts also carry block-pooled maps, and their arrays are gzip-compressed
// (inflated at start); a long text may store some heads' rows only (its "heads") ---
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
function code(lab) { return codeOf(data, lab); }
function colour(lab) { return colourOf(data, lab); }

// --- controls ---
const controls = q(".mh-controls");
const sentenceSelect = el("select", { "class": "mh-sentence", "aria-label": "text" });
data.sentences.forEach((s, i) => sentenceSelect.appendChild(el("option", { value: String(i) },
  (s.purpose ? "[" + s.purpose + "] " : "") + s.text.slice(0, 80))));
const layerSelect = el("select", { "class": "mh-layer", "aria-label": "layer" });
for (let l = 0; l < L; l++) layerSelect.appendChild(el("option", { value: String(l) }, "layer " + l));
// the head the one-head views (matrix, its detail) show; the boxes pick it there too
const headSelect = el("select", { "class": "mh-head", "aria-label": "head" });
for (let h = 0; h < H; h++) headSelect.appendChild(el("option", { value: String(h) }, "head " + h));
controls.append(el("span", {}, "text "), sentenceSelect, el("span", {}, " "), layerSelect, el("span", {}, " "), headSelect);
const ONE_HEAD = ["matrix"];  // views of one head: a box picks the head instead of toggling it
function syncBoxes() {
  headBoxes.querySelectorAll(".mh-headbox").forEach((b, k) =>
    b.classList.toggle("on", ONE_HEAD.includes(state.view) ? k === state.head : state.heads.has(k)));
}
const headBoxes = el("span", { "class": "mh-heads" });
for (let h = 0; h < H; h++) {
  const box = el("span", { "class": "mh-headbox on", "data-head": String(h), title: "head " + h });
  box.style.background = COLORS[h % COLORS.length];
  box.textContent = String(h);
  box.addEventListener("click", () => {
    if (ONE_HEAD.includes(state.view)) { state.head = h; headSelect.value = String(h); draw(); return; }
    if (state.heads.has(h)) state.heads.delete(h); else state.heads.add(h);
    draw();
  });
  box.addEventListener("dblclick", () => {  // one head alone (double-click again: all heads)
    const alone = state.heads.size === 1 && state.heads.has(h);
    state.heads = alone ? new Set([...Array(H).keys()]) : new Set([h]);
    draw();
  });
  headBoxes.appendChild(box);
}
controls.appendChild(headBoxes);
sentenceSelect.addEventListener("change", () => { state.sentence = +sentenceSelect.value; state.zoom = null; draw(); });
layerSelect.addEventListener("change", () => { state.layer = +layerSelect.value; draw(); });
headSelect.addEventListener("change", () => { state.head = +headSelect.value; draw(); });
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
function openHead(l, h, view, sentence) {
  state.layer = l; state.head = h; layerSelect.value = String(l); headSelect.value = String(h);
  if (sentence !== undefined && sentence !== state.sentence) { state.sentence = sentence; sentenceSelect.value = String(sentence); state.zoom = null; }
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
  if (h !== null) { state.head = h; headSelect.value = String(h); }
  return v && root.querySelector('.mh-tab[data-view="' + v + '"]') ? v : null;
}
function headList(parent, heads) {  // links to heads, separated by spaces
  heads.forEach((x, k) => { if (k) parent.appendChild(document.createTextNode(" ")); parent.appendChild(headLink(x[0], x[1])); });
}

// --- the views, each with this page's context ---
const page = { root, data, state, L, H, LONG, q, info, sparse, pooled, eachStored, label, evidence, mark, code, colour,
               headLink, headList, openHead, draw, showView, sentenceSelect, layerSelect, headSelect };
const views = { head: headView(page), model: modelView(page), matrix: matrixView(page), detail: detailView(page),
                rollout: rolloutView(page), similarity: similarityView(page), table: tableView(page),
                overview: overviewView(page) };
exportButtons(page, views);

function draw() {
  writeFragment();
  syncBoxes();
  if (state.view === "table") return;  // built at the start, rebuilt when sorted
  views[state.view].draw();
  if (state.view === "matrix") views.detail.draw();
}

views.table.draw();
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
