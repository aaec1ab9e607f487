"""The attention page end to end in headless Chromium: no errors, no network, the views respond."""

import json
import shutil
import time

import pytest
import torch

import multihead as mh
from multihead.viz.page import page_data, page_html, view_page, write_page

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
pytestmark = pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="Debian chromium + chromium-driver not installed")

HOSTILE = '<script>alert(1)</script> "onmouseover=alert(2)'


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
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


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    model = mh.hf.load("minilm")
    texts = ["The animal didn't cross the street because it was too tired.", HOSTILE]
    report = mh.analyze(model, [*texts, "Heads specialise."], coreference=False)
    path = tmp_path_factory.mktemp("page") / "page.html"
    write_page(view_page(model, texts, report), path)
    return path


def _open(browser, path):
    browser.get_log("performance")  # drop earlier entries
    browser.get_log("browser")
    start = time.perf_counter()
    browser.get(path.as_uri())
    root = browser.find_element("css selector", ".mh-page")
    for _ in range(200):
        if root.get_attribute("data-ready") == "1":
            break
        time.sleep(0.05)
    assert root.get_attribute("data-ready") == "1", "the page script did not finish"
    return root, time.perf_counter() - start


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
    root, _ = _open(browser, page)
    from selenium.common.exceptions import NoAlertPresentException

    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text  # noqa: B018 - no alert() ever ran
    options = [o.text for o in root.find_elements("css selector", "select.mh-sentence option")]
    assert options[1] == HOSTILE[:80]
    assert len(browser.find_elements("css selector", "script")) == 2  # the data and the page code, nothing injected
    assert not browser.find_elements("css selector", "[onmouseover]")


def test_clicking_the_model_view_opens_a_head_and_hover_shows_a_value(browser, page):
    from selenium.webdriver.common.action_chains import ActionChains

    root, _ = _open(browser, page)
    canvas = root.find_element("css selector", "canvas.mh-modelview")
    # the thumbnail of layer 3, head 5 (40 px margin, 64 px thumbnails 6 px apart, 18 px label rows)
    x, y = 40 + 5 * 70 + 30, 3 * 82 + 18 + 30
    size = canvas.size
    ActionChains(browser).move_to_element_with_offset(canvas, x - size["width"] / 2, y - size["height"] / 2) \
        .click().perform()
    title = root.find_element("css selector", ".mh-matrix-title").text
    assert title.startswith("layer 3, head 5")
    matrix = root.find_element("css selector", "canvas.mh-matrix")
    first = matrix.screenshot_as_png
    ActionChains(browser).move_to_element_with_offset(matrix, 5, 5).perform()
    info = root.find_element("css selector", ".mh-info").text
    assert "→" in info and info.split(": ")[-1].replace(".", "").isdigit()
    # another layer draws another picture
    from selenium.webdriver.support.ui import Select

    Select(root.find_element("css selector", "select.mh-layer")).select_by_value("0")
    root.find_element("css selector", '.mh-tab[data-view="matrix"]').click()
    assert matrix.screenshot_as_png != first


def test_head_toggles_change_the_head_view(browser, page):
    root, _ = _open(browser, page)
    root.find_element("css selector", '.mh-tab[data-view="head"]').click()
    canvas = root.find_element("css selector", "canvas.mh-headview")
    before = canvas.screenshot_as_png
    for box in root.find_elements("css selector", ".mh-headbox")[:6]:
        box.click()
    assert canvas.screenshot_as_png != before


def test_the_head_table_sorts(browser, page):
    root, _ = _open(browser, page)
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
def test_a_512_token_page_is_small_and_becomes_interactive_quickly(browser, tmp_path, L, H):
    torch.manual_seed(0)
    T = 512
    maps = torch.softmax(torch.randn(L, H, T, T) * 4, -1)
    tokens = [f"tok{i}" for i in range(T)]
    path = write_page(page_html(page_data([("long", tokens, maps)])), tmp_path / "long.html")
    size_mib = path.stat().st_size / 2**20
    assert size_mib < 12  # dense float32 maps would be 72 MiB (MiniLM) and 270 MiB (SmolLM2)
    root, seconds = _open(browser, path)
    assert seconds < 15
    root.find_element("css selector", '.mh-tab[data-view="head"]').click()
    assert root.find_element("css selector", "canvas.mh-headview").size["height"] > 0


def test_two_pages_in_one_document_do_not_interfere(browser, tmp_path):
    from multihead.viz.page import AttentionPage

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
    root, _ = _open(browser, page)
    browser.execute_script(
        "window.__downloads = []; HTMLAnchorElement.prototype.click = function () {"
        " window.__downloads.push([this.getAttribute('download'), this.href]); };")
    root.find_element("css selector", ".mh-export-png").click()
    root.find_element("css selector", ".mh-export-svg").click()
    (png_name, png), (svg_name, svg) = browser.execute_script("return window.__downloads;")
    assert png_name == "multihead-model.png" and png.startswith("data:image/png;base64,") and len(png) > 1000
    assert svg_name == "multihead-matrix.svg" and svg.startswith("data:image/svg+xml") and "rect" in svg
