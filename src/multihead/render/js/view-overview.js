// The overview: what was analysed, the label map with its legend, flags, redundancy and the probes.
import { blue, counted, fmt } from "./scales.js";
import { el, escSVG, tableOf } from "./dom.js";
import { flagNote } from "./labels.js";

export function overviewView(page) {
  const { data, L, H, q, label, mark, code, colour, headLink, openHead } = page;
  // --- overview: what was analysed, the label map with its legend, flags, redundancy, the probes ---
  function topHeads(metric, n, desc) {
    return data.heads.filter((r) => r.metrics[metric] !== null && r.metrics[metric] !== undefined)
      .sort((a, b) => (desc === false ? 1 : -1) * (a.metrics[metric] - b.metrics[metric])).slice(0, n);
  }
  // the map's cells by label colour, or by a metric: white (its smallest over the heads) to blue (its largest)
  function shadeMap(map, metric) {
    const values = data.heads.map((r) => r.metrics[metric]).filter((v) => v !== null && v !== undefined);
    const lo = Math.min(...values), hi = Math.max(...values);
    map.querySelectorAll("td.mh-mapcell").forEach((td) => {
      const l = +td.getAttribute("data-layer"), h = +td.getAttribute("data-head"), v = metric ? data.heads[l * H + h].metrics[metric] : null;
      const t = v === null || v === undefined || !(hi > lo) ? 0 : (v - lo) / (hi - lo);
      td.style.background = metric ? blue(t) : colour(label(l, h));
      td.style.color = metric && t > 0.6 ? "#fff" : "";
      td.setAttribute("data-value", metric && v !== null && v !== undefined ? String(v) : "");
      td.title = td.title.split(" | ")[0] + (metric ? " | " + metric + " " + fmt(v, 4) : "");
    });
  }
  let overviewBuilt = false;
  function drawOverview() {
    if (overviewBuilt) return;
    overviewBuilt = true;
    const o = data.overview, box = q(".mh-overview");
    const corpus = o.corpus ? ", corpus " + o.corpus.sha256.slice(0, 12) : "";
    box.appendChild(el("p", { "class": "mh-meta" }, (data.shown ? "the report: " : "") + o.model + ": " + L + " layers × " + H + " heads" + (o.causal ? " (causal)" : "") +
      "; " + counted(o.sentences, "text") + ", " + counted(o.tokens, "token") + corpus + (o.placement ? "; " + o.placement : "") +
      "; page written " + o.written + " by multihead " + o.version));
    box.appendChild(el("h3", {}, "Heads by label (click a head to open it)"));
    const shade = el("select", { "class": "mh-map-shade", "aria-label": "shade the map by" });
    shade.appendChild(el("option", { value: "" }, "shaded by label"));
    data.metric_names.forEach((m) => shade.appendChild(el("option", { value: m }, "shaded by " + m)));
    box.appendChild(shade);
    const map = el("table", { "class": "mh-labelmap" }), head = el("tr");
    head.appendChild(el("th", {}, ""));
    for (let h = 0; h < H; h++) head.appendChild(el("th", {}, "H" + h));
    map.appendChild(head);
    for (let l = 0; l < L; l++) {
      const tr = el("tr");
      tr.appendChild(el("th", {}, "L" + l));
      for (let h = 0; h < H; h++) {
        const lab = label(l, h), flag = flagNote(data.heads[l * H + h]);
        const td = el("td", { "class": "mh-mapcell", "data-layer": String(l), "data-head": String(h),
                              title: "L" + l + ".H" + h + ": " + lab + (flag ? " — " + flag : "") });
        td.style.background = colour(lab);
        td.textContent = code(lab) + mark(l, h) + (flag ? " !" : "");
        td.addEventListener("click", () => openHead(l, h));
        tr.appendChild(td);
      }
      map.appendChild(tr);
    }
    box.appendChild(map);
    shade.addEventListener("change", () => shadeMap(map, shade.value));
    const legend = el("dl", { "class": "mh-legend" }), used = new Set(data.labels.map((x) => x.startsWith("syntactic:") ? "syntactic:REL" : x.includes("+") ? "A+B" : x));
    Object.entries(o.legend).forEach(([lab, rule]) => {
      if (!used.has(lab)) return;
      const dt = el("dt", {}, lab); dt.style.background = colour(lab === "syntactic:REL" ? "syntactic" : lab);
      legend.append(dt, el("dd", {}, rule));
    });
    // the flags this model's heads carry, as the labels: a decoder's legend once listed stuck-on-sep, which it cannot have
    const flagsUsed = new Set(data.heads.flatMap((r) => r.flags));
    if (data.heads.some((r) => r.degenerate)) flagsUsed.add("degenerate");
    if (data.heads.some((r) => (r.traits || []).includes("sink"))) flagsUsed.add("sink (trait)");
    Object.entries(o.flag_legend).forEach(([flag, rule]) => { if (flagsUsed.has(flag)) legend.append(el("dt", {}, "! " + flag), el("dd", {}, "flag: " + rule)); });
    if (data.evidence) {
      Object.entries(data.marks || {}).forEach(([m, sign]) => legend.append(el("dt", {}, sign), el("dd", {}, (data.mark_words || {})[m] || m)));
    }
    box.appendChild(legend);
    const flags = el("p");  // degenerate: input-independent attention *and* removing the head changes nothing
    flags.appendChild(document.createTextNode("Degenerate heads (input-independent attention, and removing them changes nothing): "));
    if (!(o.flags || []).length) flags.appendChild(document.createTextNode("none"));
    (o.flags || []).forEach(([l, h, f], k) => { if (k) flags.appendChild(document.createTextNode(", ")); flags.appendChild(headLink(l, h)); flags.appendChild(document.createTextNode(" " + f.join("/"))); });
    box.appendChild(flags);
    if ((o.untested || []).length) {
      const untested = el("p", { "class": "mh-note" }, "Input-independent attention, not tested by ablation (so not called degenerate): ");
      o.untested.forEach(([l, h, f], k) => { if (k) untested.appendChild(document.createTextNode(", ")); untested.appendChild(headLink(l, h)); untested.appendChild(document.createTextNode(" " + f.join("/"))); });
      box.appendChild(untested);
    }
    if (data.pairs && data.pairs.length) {
      // what the averages rest on, as the text report says it: a long document's JS is a sample of its rows
      const over = data.pairs_rows ? ", over " + counted(data.pairs_rows, "query token") : "";
      box.appendChild(el("h3", {}, "Most redundant pairs (Jensen–Shannon distance of their attention" + over + ")"));
      box.appendChild(tableOf(["head", "head", "JS distance"], data.pairs.slice(0, 8).map(([a, b, v]) => [headLink(a[0], a[1]), headLink(b[0], b[1]), fmt(v)])));
    }
    if (o.syntax) {
      box.appendChild(el("h3", {}, "Syntax: best head per relation against the best fixed offset"));
      if (o.syntax.not_parsed) box.appendChild(el("p", { "class": "mh-note" }, o.syntax.not_parsed + (o.syntax.not_parsed === 1 ? " text" : " texts") + " not parsed: not in Latin script (spaCy's en_core_web_sm reads English)."));
      const rows = Object.entries(o.syntax.relations).filter(([, d]) => d.count >= o.syntax.min_count)
        .sort((a, b) => (b[1].best.accuracy - b[1].baseline) - (a[1].best.accuracy - a[1].baseline)).slice(0, 15);
      if (Object.keys(o.syntax.relations).length) box.appendChild(tableOf(["relation", "count", "best head", "accuracy", "baseline (offset)", "margin needed (95%)", "beats it"],
        rows.map(([rel, d]) => [rel, d.count, headLink(d.best.layer, d.best.head), fmt(d.best.accuracy), fmt(d.baseline) + " (" + (d.baseline_offset > 0 ? "+" : "") + d.baseline_offset + ")",
                                fmt(d.margin_needed), d.beats === undefined ? "–" : d.beats ? "yes" : "no"])));
      if (o.causal) box.appendChild(el("p", { "class": "mh-note" }, "A causal head is scored only on the instances whose target it can see (before the query): a direction no causal head can attend has no count."));
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
    if (o.ablation && o.ablation.skipped) {  // said, not drawn as an empty table of "0 texts"
      box.appendChild(el("h3", {}, "Ablation: the heads whose removal changes " + o.ablation.objective + " most"));
      box.appendChild(el("p", { "class": "mh-note mh-ablation-skipped" }, "Not measured: " + o.ablation.skipped + "."));
    } else if (o.ablation) {
      const unit = o.ablation.unit ? " (" + o.ablation.unit + ")" : "";
      const exact = new Set((o.ablation.exact || []).map(([l, h]) => l * H + h)), estimated = o.ablation.method === "attribution";
      box.appendChild(el("h3", {}, "Ablation: the heads whose removal changes " + o.ablation.objective + " most (" + o.ablation.texts + " texts)"));
      box.appendChild(tableOf(["head", "zero ablation" + unit, "mean ablation" + unit, "how"], topHeads("zero_ablation", 6).map((r) => [headLink(r.layer, r.head), fmt(r.metrics.zero_ablation, 4), fmt(r.metrics.mean_ablation, 4),
        !estimated || exact.has(r.layer * H + r.head) ? "exact" : "attribution estimate"])));
    }
    if (o.evidence && o.evidence.heads.length) {
      box.appendChild(el("h3", {}, "Labels tested by ablation"));
      box.appendChild(tableOf(["head", "label", "measured", "unit", "random heads (mean ± sd)", "confirmed above", "mark"], o.evidence.heads.map((e) => [headLink(e.layer, e.head), e.label, fmt(e.value, 4), e.unit || "",
        e.baseline_heads ? e.baseline_heads + " heads: " + fmt(e.baseline_mean, 4) + " ± " + fmt(e.baseline_sd, 4) : "–", fmt(e.threshold, 4), e.mark])));
      box.appendChild(el("p", { "class": "mh-note" }, Object.entries(o.evidence.tests).map(([k, v]) => k + ": " + v).join(" · ")));
    }
    if (o.long_context) {
      // what the text report says of a long run: sinks, long-range heads, retrieval heads, the heads a window would keep
      const lc = o.long_context, value = (r, m) => r.metrics[m] || 0, n = data.heads.length;
      const above = (m, floor) => topHeads(m, 6).filter((r) => value(r, m) > floor);
      const sinks = data.heads.filter((r) => value(r, "sink_first") >= lc.sink_head).length;
      const kept = data.heads.filter((r) => value(r, "window_256") + value(r, "sink_first4") >= lc.window_kept).length;
      box.appendChild(el("h3", {}, "Long context (" + counted(lc.longest_tokens, "token") + "): attention sinks, long-range and retrieval heads"));
      box.appendChild(el("p", { "class": "mh-note mh-long-counts" }, sinks + " of " + n + " heads put ≥ " + Math.round(100 * lc.sink_head) +
        " % of their attention on the first token (sinks); a window of ±256 tokens with 4 sinks would keep ≥ " + Math.round(100 * lc.window_kept) +
        " % of the attention of " + kept + " of " + n + "."));
      box.appendChild(tableOf(["head", "on the first token", "beyond 1,024 tokens (sinks aside)"], topHeads("sink_first", 6).map((r) => [headLink(r.layer, r.head), fmt(r.metrics.sink_first), fmt(r.metrics.long_1024_past_sinks)])));
      const far = above("long_1024_past_sinks", lc.long_range_head);
      box.appendChild(el("h4", {}, "Long-range heads (attention beyond 1,024 tokens, the first 4 aside)"));
      box.appendChild(far.length ? tableOf(["head", "beyond 1,024 tokens", "on the first token"], far.map((r) => [headLink(r.layer, r.head), fmt(r.metrics.long_1024_past_sinks), fmt(r.metrics.sink_first)]))
        : el("p", { "class": "mh-note" }, "None: no head puts more than " + Math.round(100 * lc.long_range_head) + " % of its attention beyond 1,024 tokens."));
      const probe = o.retrieval, found = above("retrieval", lc.retrieval_head), scored = data.heads.length && "retrieval" in data.heads[0].metrics;
      if (probe || scored) {  // a causal model's probe (an encoder has none)
        box.appendChild(el("h4", {}, "Retrieval heads (copy a needle from far back)"));
        if (probe && !probe.copy_steps) {  // every head's score is 0 of 0 copies: unmeasured, not "none"
          box.appendChild(el("p", { "class": "mh-note mh-retrieval" }, "Not measured: the model copied the needle on none of the probe's " + probe.steps + " steps."));
        } else {
          box.appendChild(found.length ? tableOf(["head", "retrieval"], found.map((r) => [headLink(r.layer, r.head), fmt(r.metrics.retrieval)]))
            : el("p", { "class": "mh-note mh-retrieval" }, "None: no head's most-attended key was the needle's on more than " + Math.round(100 * lc.retrieval_head) + " % of the steps the model copied it."));
        }
      }
    }
    if (o.what_if) {  // the text report's what-if table: the loss with every layer, and each alone, through the mask
      const w = o.what_if, change = (d) => (Math.round(d * 1e4) / 1e4 < 0 ? "-" : "+") + fmt(Math.abs(d), 4);
      box.appendChild(el("h3", {}, "What if the model attended through " + w.mask + "?"));
      box.appendChild(el("p", { "class": "mh-note mh-what-if" }, "Mean next-token loss over " + counted(w.tokens, "token") + " (nats): intact " +
        fmt(w.loss, 4) + ", every layer " + fmt(w.loss_all_layers, 4) + " (" + change(w.delta_all_layers) + ")."));
      box.appendChild(tableOf(["layer alone", "loss", "change"], w.delta_per_layer.map((d, l) => ["L" + l, fmt(w.loss + d, 4), change(d)])));
    }
  }

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
  return { draw: drawOverview, svg: mapSVG };
}
