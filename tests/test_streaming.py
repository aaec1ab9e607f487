"""Streaming capture: each layer's maps in chunks of query rows give the same per-head statistics
as whole maps, for any chunk size and padding on either side, and the model's outputs do not change."""

import pytest
import torch

import multihead as mh
from architectures import build, inputs
from multihead.analysis.analyze import collect_statistics
from multihead.analysis.metrics import HeadStatistics, TokenInfo

transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")


def _tokens(valid):
    B, T = valid.shape
    first = torch.zeros_like(valid)
    first[torch.arange(B), valid.long().argmax(-1)] = True
    g = torch.Generator().manual_seed(3)
    separator = (torch.rand(B, T, generator=g) < 0.2) & valid & ~first
    punctuation = (torch.rand(B, T, generator=g) < 0.2) & valid
    return TokenInfo(valid=valid, first=first, separator=separator, punctuation=punctuation)


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("chunk", [1, 3, 7, 12])
def test_chunks_of_rows_give_the_whole_maps_statistics(side, chunk):
    B, H, T = 3, 4, 12
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([12, 9, 5])
    ar = torch.arange(T)
    valid = ar[None] < lengths[:, None] if side == "right" else ar[None] >= (T - lengths)[:, None]  # (B, T)
    visible = (valid[:, None, None, :] & (ar[None, :] <= ar[:, None])[None, None])  # causal over real keys
    scores = torch.randn(B, H, T, T, generator=g) * 3
    maps = torch.softmax(scores.masked_fill(~visible, float("-inf")), -1).nan_to_num(0.0)
    tokens = _tokens(valid)
    whole, parts = HeadStatistics(2, H), HeadStatistics(2, H)
    for layer in range(2):
        whole.update(layer, maps, visible, tokens)
        for start in range(0, T, chunk):
            stop = min(T, start + chunk)
            parts.update(layer, maps[:, :, start:stop], visible[:, :, start:stop], tokens, start)
    for name, value in whole.means().items():
        torch.testing.assert_close(parts.means()[name], value, atol=1e-6, rtol=1e-6, equal_nan=True, msg=name)
    assert parts._columns == {}  # nothing held once a layer's last rows are in


def test_rows_past_the_end_are_refused():
    stats = HeadStatistics(1, 1)
    valid = torch.ones(1, 4, dtype=torch.bool)
    rows = torch.full((1, 1, 3, 4), 0.25)
    with pytest.raises(ValueError, match=r"rows 3\.\.6 of a \(T, T\) map with T = 4"):
        stats.update(0, rows, torch.ones(1, 1, 3, 4, dtype=torch.bool), _tokens(valid), 3)


@pytest.mark.parametrize("name", ["bert", "llama (GQA)", "gemma2 (window 4, softcap 1)", "t5"])
def test_a_streamed_capture_equals_the_whole_maps_and_leaves_outputs_alone(name):
    model = build(name)
    batch = inputs(name, model)
    stack = "encoder" if name == "t5" else None
    dense: dict[int, torch.Tensor] = {}
    with mh.hf.AttentionCapture(model, lambda layer, w, out, vis: dense.__setitem__(layer, w), stack=stack), \
            torch.no_grad():
        want = model(**batch).last_hidden_state
    rows: dict[int, list] = {}
    with mh.hf.AttentionCapture(model, lambda layer, w, out, vis, start: rows.setdefault(layer, []).append((start, w)),
                                stack=stack, chunk=3), torch.no_grad():
        got = model(**batch).last_hidden_state
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    for layer, maps in dense.items():
        starts = [start for start, _ in rows[layer]]
        assert starts == list(range(0, maps.shape[2], 3))  # in order, every row once
        torch.testing.assert_close(torch.cat([w for _, w in rows[layer]], 2), maps, atol=1e-12, rtol=0)


@pytest.mark.slow
def test_streamed_analysis_of_minilm_equals_the_dense_one(minilm):
    texts = ["The animal didn't cross the street because it was too tired.", "Heads look.",
             "A longer sentence about how every head of a model looks at the words around it."]
    dense = collect_statistics(minilm, texts, batch_size=2, redundancy=False).heads.means()
    for chunk in (1, 5, 64):
        streamed = collect_statistics(minilm, texts, batch_size=2, redundancy=False, chunk=chunk).heads.means()
        for name, value in dense.items():
            torch.testing.assert_close(streamed[name], value, atol=1e-5, rtol=1e-5, equal_nan=True, msg=name)
    with pytest.raises(ValueError, match="redundancy=False"):
        collect_statistics(minilm, texts, chunk=4)


@pytest.mark.slow
def test_cli_document_streams_one_long_text(tmp_path, capsys):
    from conftest import run_cli

    doc = tmp_path / "doc.txt"
    doc.write_text("The first paragraph says one thing.\n\nThe second says another, at some length.\n" * 40)
    code, out, err = run_cli(["analyze", "--file", str(doc), "--document", "--truncate", "--syntax", "off",
                              "--no-coreference", "--out", str(tmp_path / "r")], capsys)
    assert code == 0 and "layer |" in out, err
    import json

    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["sentences"] == 1 and report["tokens"] == 512 and "redundancy" not in report
    assert "<script" not in (tmp_path / "r" / "report.html").read_text()  # the static page: no whole maps held
    for args, words in ((["--document", "x"], "--document reads one --file"),
                        (["--file", str(doc), "--document", "--syntax", "spacy"], "use --syntax off")):
        code, _, err = run_cli(["analyze", *args, "--out", str(tmp_path / "bad")], capsys)
        assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err
