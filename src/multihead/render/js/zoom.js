// The matrix view's regions: which square of a (T, T) map is shown, where the pointer is in it, and
// zooming around a point. Pure arithmetic (no DOM).

// a region this many tokens wide or less is drawn cell by cell
export const ZOOM_FULL = 128;

// the whole map of T tokens
export function wholeRegion(T) {
  return { i0: 0, j0: 0, n: T, T: T };
}

// The region `factor` times narrower (factor < 1: wider) around row i, key j — never narrower than
// ZOOM_FULL (or the text), never outside the map
export function zoomed(z, i, j, factor, full) {
  const T = z.T, limit = full === undefined ? ZOOM_FULL : full;
  const n = Math.max(Math.min(limit, T), Math.min(T, Math.round(z.n / factor)));
  const clamp = (x) => Math.max(0, Math.min(T - n, Math.round(x - n / 2)));
  return { i0: clamp(i), j0: clamp(j), n: n, T: T };
}

// The (row, key) under a point (x, y) of a square of `size` pixels showing region z, or null outside
export function cellAt(z, x, y, size) {
  if (x < 0 || y < 0 || x >= size || y >= size) return null;
  const j = z.j0 + Math.floor(x / size * z.n), i = z.i0 + Math.floor(y / size * z.n);
  return (i < 0 || j < 0 || i >= z.T || j >= z.T) ? null : [i, j];
}

// The tokens of block x of `block` tokens, as text: "256–511"
export function blockSpan(x, block, T) {
  return (x * block) + "–" + (Math.min(T, (x + 1) * block) - 1);
}

// Which of the positions 0..T-1 get a label on an axis of `pixels` pixels: at most one per `spacing`
// pixels, so labels never overlap, always including the first
export function labelledPositions(T, pixels, spacing) {
  const every = Math.max(1, Math.ceil(T * spacing / Math.max(pixels, 1)));
  const out = [];
  for (let i = 0; i < T; i += every) out.push(i);
  return out;
}
