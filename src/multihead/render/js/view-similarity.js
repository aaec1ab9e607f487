// The similarity view: the head x head Jensen–Shannon distances, ordered by layer or by group, with
// the groups and near-identical heads listed.
import { groupSummary, similarityLayout } from "./layout.js";
import { grey } from "./scales.js";
import { el, escSVG } from "./dom.js";
import { BAR, FONTS, setGeometry } from "./canvas.js";

export function similarityView(page) {
  const { data, state, L, H, q, info, label, headList, openHead, draw } = page;
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
  const simOrderSelect = q("select.mh-sim-order");
  if (!data.groups) simOrderSelect.style.display = "none";
  simOrderSelect.addEventListener("change", (ev) => { state.simOrder = ev.target.value; draw(); });
  const clusters = q(".mh-clusters");
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
  return { draw: drawSimilarity, svg: similaritySVG };
}
