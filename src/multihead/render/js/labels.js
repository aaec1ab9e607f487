// Labels as the page shows them: codes, marks and colours come with the data, from the one place that
// defines them (multihead/analysis/labels.py), so the page and the terminal say the same. Pure functions.

// head (l, h)'s label, or "" when the page has no report
export function labelOf(data, l, h) {
  return data.labels ? data.labels[l * data.num_heads + h] : "";
}

// a label's short code for maps (as the terminal's map writes it); the label itself when none is given
export function codeOf(data, label) {
  return data.codes && data.codes[label] !== undefined ? data.codes[label] : String(label);
}

// "confirmed" | "attention-only" | null: how the head's label fared when tested by ablation
export function evidenceOf(data, l, h) {
  return data.evidence ? data.evidence[l * data.num_heads + h] : null;
}

// the mark after a tested label's code (" ✓", " ~"), or ""
export function markOf(data, l, h) {
  const e = evidenceOf(data, l, h), marks = data.marks || {};
  return e && marks[e] ? " " + marks[e] : "";
}

// a label's background colour (syntactic labels share one)
export function colourOf(data, label) {
  // the report's own labels come with their colours (a combined label A+B takes A's); others by their kind
  const own = data.label_colours || {};
  if (Object.prototype.hasOwnProperty.call(own, label)) return own[label];
  const colours = data.colours || {};
  return colours[String(label).split(":")[0]] || "#ffffff";
}

// What a head's pattern flags say on the label map: "" without flags, else the flags and what removing the
// head was found to do ("degenerate" true: nothing; false: it matters; null: not measured) — every flagged
// head is marked "!" as the legend says, not only the degenerate ones
export function flagNote(r) {
  if (!r || !r.flags || !r.flags.length) return "";
  const verdict = r.degenerate === true ? "degenerate: removing it changes nothing"
    : r.degenerate === false ? "removing it matters" : "removal not measured";
  return "flag: " + r.flags.join(", ") + " (" + verdict + ")";
}
