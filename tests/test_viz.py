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
    plt = viz.figures._pyplot()
    fig = plt.figure(figsize=(3, 1), dpi=100)
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


def test_layer_grid_model_grid_and_similarity(tmp_path):
    maps = torch.softmax(torch.randn(2, 4, 5, 5), -1)
    report = mh.analysis.Report("m", False, 2, 4, 1, 5, [
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
def test_attention_maps_of_minilm_for_a_chinese_sentence(tmp_path):
    model = mh.hf.load("minilm")
    tokens, maps = viz.attention_maps(model, "小明把蛋糕递给小红，因为她不饿了。")
    assert maps.shape == (6, 12, len(tokens), len(tokens)) and "小" in tokens
    torch.testing.assert_close(maps.sum(-1), torch.ones(6, 12, len(tokens)))
    viz.save(viz.head_heatmap(maps[3, 4], tokens, title="L3.H4"), tmp_path / "zh.png")
