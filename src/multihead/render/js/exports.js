// The export buttons: the shown view as PNG or SVG, the head table as CSV.
import { download } from "./dom.js";

export function exportButtons(page, views) {
  const { root, data, state, LONG, q, info, evidence } = page;
  function tableCSV() {
    const cell = (v) => { const t = v === null || v === undefined ? "" : String(v); return /[",\n]/.test(t) ? '"' + t.replace(/"/g, '""') + '"' : t; };
    const rows = [["layer", "head", "label", "evidence", "flags", ...data.metric_names].join(",")];
    data.heads.forEach((r) => rows.push([r.layer, r.head, r.label, evidence(r.layer, r.head) || "", r.flags.join(";"),
                                         ...data.metric_names.map((m) => r.metrics[m])].map(cell).join(",")));
    return rows.join("\n") + "\n";
  }
  q(".mh-export-csv").addEventListener("click", () => {
    if (!data.heads.length) { info.textContent = "no report on this page: the table is empty"; return; }
    download(root, "multihead-heads.csv", "data:text/csv;charset=utf-8," + encodeURIComponent(tableCSV()));
  });
  q(".mh-export-png").addEventListener("click", () => {
    if (state.view === "overview") {  // the label map: its SVG drawn at twice the size into a PNG
      const img = new Image(), svg = views.overview.svg();
      img.onload = () => {
        const c = document.createElement("canvas");
        c.width = img.width * 2; c.height = img.height * 2;
        const ctx = c.getContext("2d");
        ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, c.width, c.height); ctx.drawImage(img, 0, 0, c.width, c.height);
        download(root, "multihead-map.png", c.toDataURL("image/png"));
      };
      img.src = "data:image/svg+xml;charset=utf-8," + encodeURIComponent(svg);
      return;
    }
    if (state.view === "table") { q(".mh-export-csv").click(); return; }  // a table exports as CSV
    const canvas = root.querySelector('.mh-view[data-view="' + state.view + '"] canvas');
    if (canvas) download(root, "multihead-" + state.view + ".png", canvas.toDataURL("image/png"));
  });
  q(".mh-export-svg").addEventListener("click", () => {  // the overview's map, the similarity, or the matrix
    const [name, svg] = state.view === "overview" ? ["map", views.overview.svg()] : state.view === "similarity" ? ["similarity", views.similarity.svg()] : ["matrix", views.matrix.svg()];
    if (svg === null) {
      info.textContent = name === "matrix" ? "SVG export draws texts up to " + LONG + " tokens; use export PNG" : "no similarity on this page";
      return;
    }
    download(root, "multihead-" + name + ".svg", "data:image/svg+xml;charset=utf-8," + encodeURIComponent(svg));
  });
  return null;
}
