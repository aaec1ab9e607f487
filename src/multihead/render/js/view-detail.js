// The head detail under the matrix: the head's metrics against its layer and the model, its most
// typical corpus texts, and the page's texts ranked by how typical the head is of its label on each.
import { blue, counted, fmt } from "./scales.js";
import { el, tableOf } from "./dom.js";
import { eachEntry, sparseEntry } from "./decode.js";
import { setGeometry, tokenLabels } from "./canvas.js";

export function detailView(page) {
  const { data, state, H, q, pooled, eachStored, label, mark, draw, sentenceSelect, openHead } = page;
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
  // one head's map on one of its typical corpus texts (kept by the analysis for this head only)
  function drawTypical(box, l, h, entry, text) {
    box.textContent = "";
    const tokens = data.typical_tokens[String(entry.text)], T = tokens.length;
    const sparse = sparseEntry({ index: entry.index, values: entry.values, k: entry.k, key_bytes: entry.key_bytes, tokens: tokens });
    const cell = Math.max(4, Math.min(22, Math.floor(420 / T))), M = 96;
    const canvas = el("canvas", { "class": "mh-typical-map" });
    canvas.width = M + T * cell + 8; canvas.height = M + T * cell + 8;
    const ctx = canvas.getContext("2d");
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, canvas.width, canvas.height);
    for (let i = 0; i < T; i++) eachEntry(sparse, 1, 0, 0, i, (j, w) => { ctx.fillStyle = blue(w); ctx.fillRect(M + j * cell, M + i * cell, cell, cell); });
    ctx.strokeStyle = "#ccc"; ctx.strokeRect(M, M, T * cell, T * cell);
    tokenLabels(ctx, tokens, 0, 0, T, cell, M);
    setGeometry(canvas, M, M, T * cell);
    box.appendChild(el("h4", {}, "L" + l + ".H" + h + " on a corpus text where it is most typical of its label: " + text));
    box.appendChild(canvas);
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
        const band = (me.intervals || {})[m];
        rows.push([m, fmt(v, 4), band ? "[" + fmt(band[0], 4) + ", " + fmt(band[1], 4) + "]" : "–", fmt(mean, 4), fmt(Math.min(...layer), 3) + " – " + fmt(Math.max(...layer), 3), Math.round(100 * below / all.length) + "%"]);
      });
      const stable = me.stability === null || me.stability === undefined ? "" : "; the same label on " + Math.round(100 * me.stability) + "% of resampled corpora";
      box.appendChild(el("h4", {}, "L" + l + ".H" + h + " (" + (me.describe || lab) + mark(l, h) + stable + "): its metrics against its layer and the model"));
      box.appendChild(tableOf(["metric", "this head", "95% interval (bootstrap over texts)", "layer mean", "layer range", "model percentile"], rows));
    }
    const inputs = data.sentences.map((d, s) => [d, s]).filter(([d]) => d.purpose);
    if (inputs.length) {  // the inputs that define the labels: a probe's, the heads' typical texts
      const p = el("p", { "class": "mh-evidence-inputs" }, "Open L" + l + ".H" + h + " on the inputs that define the labels: ");
      inputs.forEach(([d, s], k) => {
        if (k) p.appendChild(document.createTextNode(" · "));
        const a = el("a", { href: "#s=" + s + "&l=" + l + "&h=" + h + "&v=matrix", "class": "mh-evidence-link", "data-sentence": String(s) },
          d.purpose + (s === state.sentence ? " (shown)" : ""));
        a.addEventListener("click", (ev) => { ev.preventDefault(); openHead(l, h, "matrix", s); });
        p.appendChild(a);
      });
      box.appendChild(p);
    }
    const typical = data.overview && data.overview.typical;
    const mine = typical && typical.heads.find((e) => e.layer === l && e.head === h);
    if (mine && mine.texts.length) {  // over the whole corpus, kept while it was analysed
      const syntax = mine.measure.startsWith("syntax:");
      const words = { repeat_successor: "attention to the token after an earlier occurrence", "cls+sep": "attention to [CLS]/[SEP]",
                      entropy_norm: "normalised entropy", max_weight: "largest weight per row" };
      const name = syntax ? "share of its " + mine.measure.slice(7) + " dependents on their governor" : "mean " + (words[mine.measure] || mine.measure.replace("_token", "-token attention"));
      box.appendChild(el("h4", {}, "The corpus texts where it is most typical of its label (" + name + ", of " + counted(data.overview.sentences, "text") + ")"));
      const kept = (data.head_texts || {})[String(l * H + h)] || [];
      const shown = el("div", { "class": "mh-typical-view" });
      box.appendChild(tableOf(["text", name, syntax ? "dependents" : "tokens"], mine.texts.map(([i, v, n]) => {
        const text = typical.texts[String(i)] || "", s = data.sentences.findIndex((d) => d.text === text);
        if (s >= 0) {  // a text of the page: open it
          const a = el("a", { href: "#s=" + s + "&l=" + l + "&h=" + h + "&v=matrix" }, text);
          a.addEventListener("click", (ev) => { ev.preventDefault(); state.sentence = s; sentenceSelect.value = String(s); state.zoom = null; draw(); });
          return [a, fmt(v), n];
        }
        const mapOf = kept.find((e) => e.text === i);
        if (!mapOf) return [text, fmt(v), n];
        const a = el("a", { href: "#", "class": "mh-typical-link", "data-text": String(i) }, text);  // this head's map on it, here
        a.addEventListener("click", (ev) => { ev.preventDefault(); drawTypical(shown, l, h, mapOf, text); });
        return [a, fmt(v), n];
      })));
      box.appendChild(shown);
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
  return { draw: drawDetail };
}
