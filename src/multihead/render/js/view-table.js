// The head table: every head's label, evidence, flags and metrics, sortable by any column.
import { el } from "./dom.js";

export function tableView(page) {
  const { data, state, q, evidence, openHead } = page;
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
  return { draw: buildTable };
}
