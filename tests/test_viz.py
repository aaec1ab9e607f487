"""Static figures: sizes, not blank, CJK glyphs rather than boxes."""

import pytest
import torch

import multihead as mh

matplotlib = pytest.importorskip("matplotlib")
from multihead import viz  # noqa: E402


def _png_array(path):
    import matplotlib.image as mpimg

    return mpimg.imread(str(path))  # (H, W, 4) floats


def test_head_heatmap_png_and_svg_are_real_images(tmp_path):
    w = torch.softmax(torch.randn(6, 6), -1)
    tokens = ["[CLS]", "the", "cat", "sat", ".", "[SEP]"]
    png = viz.save(viz.head_heatmap(w, tokens, title="L0.H0"), tmp_path / "h.png")
    img = _png_array(png)
    assert img.shape[0] >= 250 and img.shape[1] >= 250
    assert img[..., :3].std() > 0.05  # not blank
    svg = viz.save(viz.head_heatmap(w, tokens), tmp_path / "h.svg").read_text()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    with pytest.raises(ValueError, match=r"\.png or \.svg"):
        viz.save(viz.head_heatmap(w), tmp_path / "h.jpg")
    with pytest.raises(ValueError, match="2 dimensions"):
        viz.head_heatmap(torch.ones(2, 3, 3))
    with pytest.raises(ValueError, match="got 2 labels for 6 positions"):
        viz.head_heatmap(w, ["a", "b"])


def _ink(text, tmp_path, name):
    """Rendered pixels of one label, and how many distinct columns carry ink."""
    from multihead.plotting import new_figure, style

    with style():  # as the library's own figures are drawn
        fig, ax = new_figure(figsize=(3, 1), dpi=100)
        ax.axis("off")
        fig.text(0.05, 0.3, text, fontsize=28)
    path = viz.save(fig, tmp_path / f"{name}.png")
    gray = _png_array(path)[..., :3].mean(-1)
    return gray < 0.5


def test_chinese_tokens_render_as_glyphs_not_boxes(tmp_path):
    assert viz.cjk_font() is not None, "no CJK font: install cvttf-notosanscjk-regular or fonts-noto-cjk"
    a = _ink("小明", tmp_path, "a")
    b = _ink("蛋糕", tmp_path, "b")
    missing = _ink("\U000f0000\U000f0001", tmp_path, "tofu")  # private-use: no font has these
    assert a.sum() > 50 and b.sum() > 50
    # Different characters draw different shapes; missing glyphs draw the same box each time.
    assert (a != b).sum() > 0.2 * max(a.sum(), b.sum())
    assert (a != missing).sum() > 0.2 * a.sum()


def test_figures_leave_the_users_matplotlib_session_alone(tmp_path):
    """No backend switch, no rcParams change: a notebook keeps its inline backend and its fonts."""
    import matplotlib

    backend, family = matplotlib.get_backend(), list(matplotlib.rcParams["font.family"])
    fig = viz.head_heatmap(torch.softmax(torch.randn(4, 4), -1), ["小", "明", "a", "b"])
    viz.save(fig, tmp_path / "h.png")
    mh.heads.PruningCurve("sentiment", "accuracy", "m", 4, 0.9).plot(tmp_path / "c.png")
    assert matplotlib.get_backend() == backend and list(matplotlib.rcParams["font.family"]) == family
    assert "matplotlib.pyplot" not in fig.__class__.__module__ and fig.canvas.figure is fig


def test_layer_grid_model_grid_and_similarity(tmp_path):
    maps = torch.softmax(torch.randn(2, 4, 5, 5), -1)
    report = mh.analysis.Report(model="m", causal=False, num_layers=2, num_heads=4, sentences=1, tokens=5, heads=[
        mh.analysis.HeadRecord(layer, h, "syntactic:nsubj" if h == 1 else "broad", [], {})
        for layer in range(2) for h in range(4)])
    viz.save(viz.layer_grid(maps[0], list("abcde"), layer=0, labels=["x", "y", "z", "w"]), tmp_path / "l.png")
    fig = viz.model_grid(maps, report)
    titles = [ax.get_title() for ax in fig.axes]
    assert "syn:nsubj" in titles and titles.count("broad") == 6
    viz.save(fig, tmp_path / "m.png")
    sim = torch.rand(8, 8)
    viz.save(viz.similarity_matrix(sim, 4), tmp_path / "s.svg")
    for name in ("l.png", "m.png"):
        assert _png_array(tmp_path / name)[..., :3].std() > 0.05
    with pytest.raises(ValueError, match="report is for 2 x 4"):
        viz.model_grid(torch.rand(3, 4, 5, 5), report)
    with pytest.raises(ValueError, match="H=3"):
        viz.similarity_matrix(sim, 3)


@pytest.mark.slow
def test_attention_maps_of_minilm_for_a_chinese_sentence(minilm, tmp_path):
    model = minilm
    tokens, maps = viz.attention_maps(model, "小明把蛋糕递给小红，因为她不饿了。")
    assert maps.shape == (6, 12, len(tokens), len(tokens)) and "小" in tokens
    torch.testing.assert_close(maps.sum(-1), torch.ones(6, 12, len(tokens)))
    viz.save(viz.head_heatmap(maps[3, 4], tokens, title="L3.H4"), tmp_path / "zh.png")


@pytest.mark.slow
def test_the_page_data_holds_the_real_weights_of_transformers(minilm):
    """What the page stores for each row — its k largest weights, quantised to 1/255 — checked
    against transformers' own eager attention maps, without a browser."""
    import base64

    import numpy as np
    import transformers

    text = "The animal didn't cross the street because it was too tired."
    row = mh.viz.attention_page(minilm, [text]).data["sentences"][0]
    enc = minilm.tokenizer(text, return_tensors="pt")
    eager = transformers.AutoModel.from_pretrained(minilm.path, attn_implementation="eager").eval()
    with torch.no_grad():
        want = torch.stack(eager(**enc, output_attentions=True).attentions)[:, 0]  # (L, H, T, T)
    L, H, T, _ = want.shape
    k = row["k"]
    assert len(row["tokens"]) == T and k == min(T, 32)
    index = torch.from_numpy(np.frombuffer(base64.b64decode(row["index"]), "<u2").astype(np.int64))
    values = torch.from_numpy(np.frombuffer(base64.b64decode(row["values"]), np.uint8).astype(np.float32))
    index, values = index.view(L, H, T, k), values.view(L, H, T, k) / 255
    real = want.gather(-1, index)  # the real weight of every stored (row, key)
    assert (real - values).abs().max() <= 0.5 / 255 + 1e-4  # rounding to the nearest 1/255
    kth = want.topk(k, -1).values[..., -1:]  # the k-th largest real weight of each row
    assert (real >= kth - 1e-5).all()  # the stored keys are the row's k largest
    ordered = index.sort(-1).values
    assert (ordered[..., 1:] != ordered[..., :-1]).all()  # no key stored twice in a row


@pytest.mark.slow
def test_byte_level_tokens_are_shown_as_text(smollm2, minilm):
    tokens, _ = viz.attention_maps(smollm2, "小明把蛋糕递给小红。 The cat sat.")
    # not "å°", "æĺ": each byte token shows its character, numbered: one character in two tokens
    assert tokens[:4] == ["小₁", "小₂", "明₁", "明₂"], tokens[:4]
    assert not any("Ġ" in t or "\ufffd" in t for t in tokens) and tokens[-3:] == [" cat", " sat", "."]
    tokens, _ = viz.attention_maps(minilm, "Unbelievably, it sat.")
    assert tokens[:3] == ["[CLS]", "un", "##bel"] and tokens[-1] == "[SEP]"  # WordPiece pieces keep their ##


def test_a_written_page_is_the_page_as_utf8_with_its_data_in_ascii_json(tmp_path):
    """page_bytes (what a report folder writes for a text model's views) is page_html encoded, its
    data ASCII JSON that reads back whole — CJK, an emoji and markup in a text included — and it
    ends in one newline, as pages did before they were written piece by piece."""
    import json
    import re

    from multihead.render.page import page_bytes, page_data, page_html

    tokens = ["小明", "把", "🎂", "</script><b>&"]
    maps = torch.softmax(torch.randn(2, 3, 4, 4), -1)
    data = page_data([("小明把🎂</script><b>&", tokens, maps)])
    data["model"] = "模型 <i>"
    written = page_bytes(data)
    same = re.compile(rb"mh-[0-9a-f]{12}")  # each page's own container id
    assert same.sub(b"mh-x", written) == same.sub(b"mh-x", page_html(data).encode("utf-8"))
    assert written.endswith(b"</html>\n") and not written.endswith(b"\n\n")
    script = re.search(rb'<script type="application/json" id="mh-[0-9a-f]{12}-data">(.*?)</script>', written, re.S)
    assert script is not None and script.group(1).isascii() and b"<" not in script.group(1)
    assert json.loads(script.group(1)) == json.loads(json.dumps(data))  # every string back as it was
    assert "模型 &lt;i&gt;" in written.decode("utf-8")  # the title: escaped, in UTF-8
