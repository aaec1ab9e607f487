// The head view: lines from each token to the tokens it attends to, heads toggled by colour.
import { COLORS, counted, grouped } from "./scales.js";
import { FONTS } from "./canvas.js";

export function headView(page) {
  const { data, state, LONG, q, info, pooled, eachStored } = page;
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
      c.fillText("This text has " + counted(T, "token") + ": the head view draws texts up to " + grouped(LONG) + "; the matrix view zooms.", 4, 20);
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
  return { draw: drawHeadView };
}
