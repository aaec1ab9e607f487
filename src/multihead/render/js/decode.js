// The page's data, decoded: base64 bytes, each row's k largest weights, block-pooled maps, rollout.
// Pure functions (no DOM): the page reads its arrays through these, Node's test runner tests them.

//: the version of the page data this script reads (render/page.py writes PAGE_DATA_VERSION)
export const DATA_VERSION = 2;

// A problem with the page's data as one sentence, or null when the script can read it.
export function dataProblem(data) {
  if (!data || typeof data !== "object") return "the page carries no data";
  if (data.version !== DATA_VERSION) {
    return "the page's data is version " + data.version + "; this page reads version " + DATA_VERSION;
  }
  if (!(data.num_layers > 0) || !(data.num_heads > 0) || !Array.isArray(data.sentences) || !data.sentences.length) {
    return "the page's data has no layers, heads or texts";
  }
  return null;
}

// base64 text -> bytes
export function b64(text) {
  const bin = atob(text), arr = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) arr[i] = bin.charCodeAt(i);
  return arr;
}

// gzip'd base64 -> bytes, with the browser's (or Node's) own DecompressionStream: nothing is loaded
export async function inflate(text) {
  const stream = new Blob([b64(text)]).stream().pipeThrough(new DecompressionStream("gzip"));
  return new Uint8Array(await new Response(stream).arrayBuffer());
}

// Stored keys: uint16, or uint32 for a text of more than 65,536 tokens (key_bytes 4)
function keys(bytes, width) {
  return width === 4 ? new Uint32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4)
    : new Uint16Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 2);
}

// Which heads' rows are stored: all (null), or — a long text whose rows of every head would pass the
// page's size — the listed flat heads l·H + h, their rows one after another in that order
function slots(heads) { return heads ? new Map(heads.map((flat, n) => [flat, n])) : null; }

// A text's rows as the views read them: {idx: Uint16Array | Uint32Array, val: Uint8Array, k, T, slots[, pooled]} (plain)
export function sparseEntry(d) {
  return { idx: keys(b64(d.index), d.key_bytes), val: b64(d.values), k: d.k, T: d.tokens.length, slots: slots(d.heads) };
}

// The same for a long text, whose arrays (and block-pooled maps) are gzip-compressed
export async function inflatedEntry(d) {
  const [idx, val] = await Promise.all([inflate(d.index), inflate(d.values)]);
  const entry = { idx: keys(idx, d.key_bytes), val: val, k: d.k, T: d.tokens.length, slots: slots(d.heads) };
  if (d.pooled) {
    const [mass, max] = await Promise.all([inflate(d.pooled.mass), inflate(d.pooled.max)]);
    entry.pooled = { block: d.pooled.block, cells: d.pooled.cells, mass: mass, max: max, scale: d.pooled.mass_scale };
  }
  return entry;
}

// Whether the page stored head (l, h)'s rows (a long text's page may keep only some heads')
export function storedHead(entry, H, l, h) { return !entry.slots || entry.slots.has(l * H + h); }

// Where row i of head (l, h) begins in the stored arrays, or -1 when its head's rows were not stored
function rowAt(entry, H, l, h, i) {
  const slot = entry.slots ? entry.slots.get(l * H + h) : l * H + h;
  return slot === undefined ? -1 : (slot * entry.T + i) * entry.k;
}

// fn(j, weight) for each stored entry of row i of head (l, h); H heads per layer
export function eachEntry(entry, H, l, h, i, fn) {
  const base = rowAt(entry, H, l, h, i);
  if (base < 0) return;
  for (let e = 0; e < entry.k; e++) {
    const v = entry.val[base + e];
    if (v > 0) fn(entry.idx[base + e], v / 255);
  }
}

// The stored weight of key j in row i, or null when the row did not keep it
export function weightAt(entry, H, l, h, i, j) {
  const base = rowAt(entry, H, l, h, i);
  if (base < 0) return null;
  for (let e = 0; e < entry.k; e++) if (entry.idx[base + e] === j) return entry.val[base + e] / 255;
  return null;
}

// The share of row i's attention its stored weights carry (at most 1)
export function keptShare(entry, H, l, h, i) {
  let sum = 0;
  eachEntry(entry, H, l, h, i, (j, v) => { sum += v; });
  return Math.min(1, sum);
}

// One block (a, b) of a pooled head: its mass (its rows' mean weight on its keys) and largest weight,
// undoing the page's square-root byte scale
export function pooledBlock(pool, H, l, h, a, b) {
  const C = pool.cells, at = ((l * H + h) * C + a) * C + b;
  return { mass: Math.pow(pool.mass[at] / 255, 2) * pool.scale[l * H + h], max: Math.pow(pool.max[at] / 255, 2) };
}

// The (T, T) bytes of rollout at one layer (all of flow: it is stored after the last layer only)
export function rolloutLayer(bytes, T, layer, mode) {
  return mode === "flow" ? bytes : bytes.subarray(layer * T * T, (layer + 1) * T * T);
}
