"""Static figures: sizes, not blank, CJK glyphs rather than boxes."""

import pytest
import torch

import multihead as mh
from multihead.inputs import text_tokens

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
    # a character after a space: its first piece's span begins at the space, yet it is one character
    # in three tokens (once " 北", "北₁", "北₂": read as two)
    text = "I love 北京 and 上海."
    tokens = text_tokens(smollm2.tokenizer, smollm2.tokenizer(text)["input_ids"], text)
    assert tokens[1:6] == [" love", " 北₁", "北₂", "北₃", "京₁"], tokens
    # the patch's tokens and its one-token check read them so too
    from multihead.analysis.interventions.patching import _tokens
    from multihead.analysis.interventions.runs import single_token

    ids = smollm2.tokenizer("小明把蛋糕递给小红", return_tensors="pt")["input_ids"]
    assert _tokens(smollm2.tokenizer, ids, "小明把蛋糕递给小红")[:2] == ["小₁", "小₂"]
    with pytest.raises(ValueError, match=r"'很' is 2 tokens \['很₁', '很₂'\]"):
        single_token(smollm2.tokenizer, "很", "wrong")


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


def _pooled_view(L, H, T, k, seed=0):
    """A long text's pooled view with each row's k keys drawn anywhere in 0..T-1."""
    from multihead.analysis.stats.maps import Pooled, TextView

    g = torch.Generator().manual_seed(seed)
    index = torch.randint(0, T, (L, H, T, k), generator=g, dtype=torch.int32)
    values = torch.randint(0, 256, (L, H, T, k), generator=g).to(torch.uint8)
    cells = 4
    pooled = Pooled(block=-(-T // cells), cells=cells, k=k, index=index, values=values,
                    mass=torch.rand(L, H, cells, cells, generator=g),
                    largest=torch.rand(L, H, cells, cells, generator=g))
    return TextView("long", [f"t{i}" for i in range(T)], pooled=pooled)


def _unpacked(entry, field, dtype):
    import base64
    import gzip

    import numpy as np

    return torch.from_numpy(np.frombuffer(gzip.decompress(base64.b64decode(entry[field])), dtype).astype(np.int64))


def test_a_long_texts_keys_past_65536_are_stored_whole():
    """uint16 keys would wrap at 65,536 tokens (a 100k-token document's key 70,000 shown as 4,464):
    such a text's keys are stored as uint32, and the entry says so; shorter texts keep uint16."""
    from multihead.render.page import page_data

    view = _pooled_view(1, 1, 70_000, 1)
    view.pooled.index[0, 0, -1, 0] = 69_999
    entry = page_data([view])["sentences"][0]
    assert entry["key_bytes"] == 4
    assert torch.equal(_unpacked(entry, "index", "<u4"), view.pooled.index.flatten().long())
    short = page_data([_pooled_view(1, 1, 600, 2)])["sentences"][0]
    assert "key_bytes" not in short and len(_unpacked(short, "index", "<u2")) == 600 * 2
    from multihead.analysis.stats.maps import TOP_K_BYTES, top_k_for

    # the budget counts 5 bytes a weight past 65,536 tokens: 8 heads at 81,590 tokens keep 6 a row, not 10
    assert top_k_for(8, 81_590) == TOP_K_BYTES // (8 * 81_590 * 5) == 6 and top_k_for(8, 65_536) == 13


def test_several_long_texts_arrays_compressed_on_threads_land_in_their_own_entries(monkeypatch):
    """The page compresses every long text's arrays side by side on threads: each entry still holds
    its own (index, values, pooled mass and max, decoded against the text's view), as one thread gives;
    and a long input's purpose (the retrieval probe's) is on its entry."""
    import json

    from multihead.render import page

    views = [_pooled_view(2, 2, T, k, seed=T) for T, k in ((600, 3), (700, 2), (650, 4))]
    views[1].extra["purpose"] = "retrieval probe: the needle at token 61, copied at the end"
    data = page.page_data(views)
    # a long input that defines a label says so, as a short one does (the page lists it by its purpose)
    assert [e.get("purpose") for e in data["sentences"]] == [None, views[1].extra["purpose"], None]
    for view, entry in zip(views, data["sentences"], strict=True):
        assert torch.equal(_unpacked(entry, "index", "<u2"), view.pooled.index.flatten().long())
        assert torch.equal(_unpacked(entry, "values", "u1"), view.pooled.values.flatten().long())
        assert len(_unpacked(entry["pooled"], "mass", "u1")) == view.pooled.mass.numel()
    monkeypatch.setattr(page, "_cores", lambda: 1)
    assert json.dumps(page.page_data(views)) == json.dumps(data)


def test_a_long_texts_rows_stay_within_the_pages_size(monkeypatch):
    """Where even one weight a row of every head passes the page's budget (an 8B model's 1,024 heads
    at 32k tokens: 100 MB), the page stores the rows of as many heads as fit — those whose stored
    weights carry the most attention — and lists them; within the budget, every head's."""
    from multihead.analysis.stats import maps
    from multihead.render import page
    from multihead.render.page import page_data, stored_heads

    L, H, T, k = 2, 3, 50, 2
    view = _pooled_view(L, H, T, k, seed=1)
    values, index = view.pooled.values.view(L * H, T, k), view.pooled.index.view(L * H, T, k)
    index.clamp_min_(4)  # keys off the sinks ...
    values[4] = 250  # the sharpest heads: 4, then 1, then the rest (at most 200 a weight)
    values[1] = 220
    values[[0, 2, 3, 5]] = values[[0, 2, 3, 5]].clamp_max(200)
    values[0], index[0, :, 0] = 255, 0  # ... but head 0's largest weight of every row is on key 0: a sink
    pooled = view.pooled
    assert stored_heads(pooled.index, pooled.values) is None  # 6 heads x 50 rows x 2: far within 20 MiB
    assert "heads" not in page_data([view])["sentences"][0]
    budget = 2 * T * k * 3 + 5  # two heads' rows
    assert stored_heads(pooled.index, pooled.values, budget) == [1, 4]  # the sink's 255s do not count
    assert maps.top_k_for(1024, 32_768) == 1  # the budget's k: no floor above it
    monkeypatch.setattr(page, "TOP_K_BYTES", budget)
    entry = page_data([view])["sentences"][0]
    assert entry["heads"] == [1, 4] and entry["k"] == k
    index = _unpacked(entry, "index", "<u2").view(2, T, k)
    stored = _unpacked(entry, "values", "u1").view(2, T, k)
    assert torch.equal(index, view.pooled.index.view(L * H, T, k)[[1, 4]].long())
    assert torch.equal(stored, values[[1, 4]].long())
    assert len(_unpacked(entry["pooled"], "mass", "u1")) == L * H * 4 * 4  # the pooled blocks: every head's still
