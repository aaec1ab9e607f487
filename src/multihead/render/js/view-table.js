// The head table: every head's label, evidence, flags and metrics, sortable by any column.
import { el } from "./dom.js";
import { blue } from "./scales.js";

export function tableView(page) {
  const { data, state, q, evidence, openHead } = page;
  // --- sortable head table; every string through textContent ---
  function buildTable() {
    const table = q("table.mh-table");
    table.textContent = "";
    const head = el("tr");
    const stable = data.heads.some((r) => r.stability !== null && r.stability !== undefined);
    const cols = ["layer", "head", "label", ...(stable ? ["stability"] : []), ...(data.evidence ? ["evidence"] : []), "flags", ...data.metric_names];
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
    const range = {};  // each metric's smallest and largest over the heads: its cells are shaded between them
    data.metric_names.forEach((m) => {
      const v = data.heads.map((r) => r.metrics[m]).filter((x) => x !== null && x !== undefined);
      range[m] = [Math.min(...v), Math.max(...v)];
    });
    rows.forEach((r) => {
      const tr = el("tr", { "class": "mh-row", "data-layer": String(r.layer), "data-head": String(r.head) });
      tr.addEventListener("click", () => openHead(r.layer, r.head));
      tr.appendChild(el("td", {}, r.layer)); tr.appendChild(el("td", {}, r.head));
      tr.appendChild(el("td", { title: r.describe || r.label }, r.describe || r.label));
      if (stable) tr.appendChild(el("td", { title: "share of resampled corpora giving this label" }, r.stability === null ? "–" : Math.round(100 * r.stability) + "%"));
      if (data.evidence) tr.appendChild(el("td", { "class": "mh-evidence" }, evidence(r.layer, r.head) || ""));
      tr.appendChild(el("td", {}, r.flags.join(", ") + (r.degenerate ? " (degenerate)" : "")));
      data.metric_names.forEach((m) => {
        const v = r.metrics[m], [lo, hi] = range[m], td = el("td", { "class": "mh-metric" }, v === null ? "–" : v.toFixed(3));
        if (v !== null && hi > lo) td.style.background = blue(0.6 * (v - lo) / (hi - lo));
        tr.appendChild(td);
      });
      table.appendChild(tr);
    });
  }
  return { draw: buildTable };
}
