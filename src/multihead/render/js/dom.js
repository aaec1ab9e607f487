// DOM helpers every view shares: elements whose text is always text (never markup), tables of it,
// text escaped for SVG, a download.

export function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = String(text);  // text, never markup
  return e;
}

// a table of `head` cells and `rows` (each cell text, or a Node such as a head link)
export function tableOf(head, rows) {
  const t = el("table", { "class": "mh-probe" }), tr = el("tr");
  head.forEach((h) => tr.appendChild(el("th", {}, h)));
  t.appendChild(tr);
  rows.forEach((r) => {
    const row = el("tr");
    r.forEach((c) => { const td = el("td"); if (c instanceof Node) td.appendChild(c); else td.textContent = c; row.appendChild(td); });
    t.appendChild(row);
  });
  return t;
}

// text inside SVG markup: escaped
export const escSVG = (t) => String(t).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");

// a link clicked for the user: a data: URL saved as ``name``
export function download(root, name, href) { const a = el("a", { href: href, download: name }); root.appendChild(a); a.click(); a.remove(); }
