// The rollout view: the text's attention followed back to the input tokens (rollout and flow).
import { b64, rolloutLayer } from "./decode.js";
import { blue } from "./scales.js";
import { FONTS } from "./canvas.js";

export function rolloutView(page) {
  const { data, state, L, q, info, draw } = page;
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
  return { draw: drawRollout };
}
