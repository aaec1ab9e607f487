"""Per-head analysis: metrics with known answers, capture, padding invariance, the CLI."""

import json
import math
import subprocess
import sys

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings

import multihead as mh
from conftest import float_tolerance, run_cli
from multihead.analysis import METRICS, HeadStatistics, Report, TokenInfo, analyze, label_for
from multihead.analysis.pipelines.analyze import collect_statistics
from reducing import feed

transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")


def _tokens(B, T, lengths=None):
    lengths = lengths or [T] * B
    valid = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
    first = torch.zeros(B, T, dtype=torch.bool)
    first[:, 0] = True
    sep = torch.zeros(B, T, dtype=torch.bool)
    for b, n in enumerate(lengths):
        sep[b, n - 1] = True
    return TokenInfo(valid=valid, first=first, separator=sep, punctuation=torch.zeros(B, T, dtype=torch.bool))


def _metrics_of(weights, tokens=None, visible=None):
    B, H, T, _ = weights.shape
    stats = HeadStatistics(1, H)
    tokens = tokens or _tokens(B, T)
    feed(stats, tokens, [weights], visible=visible)
    means = stats.result()
    return [{k: float(means[k][0, h]) for k in METRICS} for h in range(H)]


def test_identity_map_is_a_self_head_with_zero_entropy():
    (m,) = _metrics_of(torch.eye(6).view(1, 1, 6, 6))
    assert m["self"] == pytest.approx(1) and m["entropy"] == pytest.approx(0) and m["distance"] == 0
    assert m["max_weight"] == pytest.approx(1) and m["kl_uniform"] == pytest.approx(math.log(6))
    assert label_for(m) == "self"


def test_uniform_map_has_normalised_entropy_one():
    (m,) = _metrics_of(torch.full((1, 1, 5, 5), 0.2))
    assert m["entropy_norm"] == pytest.approx(1) and m["kl_uniform"] == pytest.approx(0, abs=1e-6)
    assert m["entropy"] == pytest.approx(math.log(5)) and m["vertical"] == pytest.approx(0.2)
    assert m["cls"] == pytest.approx(0.2) and m["sep"] == pytest.approx(0.2)
    assert label_for(m) == "broad"


def test_shifted_identity_is_a_previous_token_head():
    w = torch.zeros(1, 1, 6, 6)
    w[0, 0, 0, 0] = 1
    for i in range(1, 6):
        w[0, 0, i, i - 1] = 1
    (m,) = _metrics_of(w)
    assert m["previous_token"] == pytest.approx(5 / 6) and m["distance"] == pytest.approx(5 / 6)
    assert label_for(m) == "previous"


def test_column_map_is_vertical_and_special():
    w = torch.zeros(1, 1, 4, 4)
    w[..., 0] = 1  # every query on the first token
    (m,) = _metrics_of(w)
    assert m["vertical"] == pytest.approx(1) and m["cls"] == pytest.approx(1)
    assert label_for(m) == "special-token"


def test_padding_rows_and_causal_visibility_are_respected():
    # Example 1 is padded to 5 from 3 real tokens; padded rows carry garbage that must not count.
    w = torch.zeros(2, 1, 5, 5)
    w[0, 0] = torch.eye(5)
    w[1, 0, :3, :3] = torch.eye(3)
    w[1, 0, 3:, :] = 0.2  # padded query rows
    (m,) = _metrics_of(w, _tokens(2, 5, [5, 3]))
    assert m["self"] == pytest.approx(1)
    causal = mh.masks.causal().materialize(4, 4).view(1, 1, 4, 4)
    uniform_causal = causal.float() / causal.sum(-1, keepdim=True)
    (m,) = _metrics_of(uniform_causal.view(1, 1, 4, 4), visible=causal)
    assert m["entropy_norm"] == pytest.approx(1)  # uniform over what each query may see


SENTENCES = [
    "The animal didn't cross the street because it was too tired.",
    "小明把蛋糕递给小红，因为她不饿了。",
    "Heads specialise.",
    "A much longer sentence about attention heads, their patterns, and the padding that surrounds short ones.",
]


@pytest.mark.slow
def test_capture_equals_transformers_eager_attention(minilm):
    tok = minilm.tokenizer
    batch = tok(SENTENCES, padding=True, return_tensors="pt")
    eager = transformers.AutoModel.from_pretrained(minilm.path, attn_implementation="eager").eval()
    with torch.no_grad():
        ref = eager(**batch, output_attentions=True)
    seen = {}
    with mh.hf.AttentionCapture(minilm.model, lambda c: seen.__setitem__(c.layer, c.weights)), \
            torch.no_grad():
        hidden = minilm.model(**batch).last_hidden_state
    assert sorted(seen) == list(range(6))
    valid = batch["attention_mask"].bool()
    for layer, w in seen.items():
        assert w.shape == ref.attentions[layer].shape
        keep = valid[:, None, :, None] & valid[:, None, None, :]
        torch.testing.assert_close(w[keep.expand_as(w)], ref.attentions[layer][keep.expand_as(w)],
                                   atol=float_tolerance(ref.attentions[layer][keep.expand_as(w)], ops=512), rtol=1e-4)
    torch.testing.assert_close(hidden[valid], ref.last_hidden_state[valid],
                               atol=float_tolerance(ref.last_hidden_state[valid], ops=512), rtol=1e-4)
    assert minilm.model.config._attn_implementation != "multihead_capture"  # restored


@pytest.mark.slow
def test_statistics_do_not_depend_on_padding_or_batch_size(minilm):
    one = collect_statistics(minilm, SENTENCES, batch_size=1)
    many = collect_statistics(minilm, SENTENCES, batch_size=4)
    for name in METRICS:
        torch.testing.assert_close(one.heads.result()[name], many.heads.result()[name], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(one.redundancy.js(), many.redundancy.js(), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(one.redundancy.cosine(), many.redundancy.cosine(), atol=1e-6, rtol=1e-5)


@pytest.mark.slow
def test_analyze_minilm_report(minilm, tmp_path):
    report = analyze(minilm, SENTENCES, batch_size=2)
    assert (report.num_layers, report.num_heads, report.sentences) == (6, 12, 4)
    data = json.loads(report.to_json(tmp_path / "r.json"))
    assert data["schema"] == "multihead.report/2" and len(data["heads"]) == 72
    required = {"entropy", "entropy_norm", "distance", "self", "previous_token", "next_token", "local", "cls", "sep",
                "punctuation", "max_weight", "kl_uniform", "vertical"}
    for h in data["heads"]:
        assert required <= set(h["metrics"]) and {"layer", "head", "label", "flags"} <= set(h)
        assert 0 <= h["metrics"]["entropy_norm"] <= 1 + 1e-9
    back = Report.from_json(tmp_path / "r.json")
    assert back.head(3, 4).label == report.head(3, 4).label
    assert back.to_dict()["sections"] == data["sections"]  # a loaded report writes back the same
    red = data["sections"]["redundancy"]
    assert len(red["js_distance"]) == 72 and len(red["cosine"][0]) == 72
    assert all(red["js_distance"][n][n] == pytest.approx(0, abs=1e-6) for n in range(72))
    assert all(red["cosine"][n][n] == pytest.approx(1, abs=1e-6) for n in range(72))
    assert len(red["pairs_js"]) == 10 and red["pairs_js"][0]["value"] <= red["pairs_js"][-1]["value"]
    report.to_csv(tmp_path / "r.csv")
    assert len((tmp_path / "r.csv").read_text().splitlines()) == 73
    assert "layer |" in report.label_map()


def _tiny_llama(tmp_path):
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(tmp_path)
    return model


def test_capture_works_for_a_gqa_decoder(tmp_path):
    model = _tiny_llama(tmp_path).eval()
    ids = torch.randint(0, 64, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, 6:] = 0
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask).logits
    seen = {}
    with mh.hf.AttentionCapture(model, lambda c: seen.__setitem__(c.layer, (c.weights, c.outputs))), \
            torch.no_grad():
        got = model(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(got[mask.bool()], want[mask.bool()],
                               atol=float_tolerance(want[mask.bool()], ops=512), rtol=1e-4)
    w, out = seen[1]
    assert w.shape == (2, 4, 9, 9) and out.shape == (2, 4, 9, 8)
    assert (w.triu(1) == 0).all()  # causal
    assert (w[1, :, :, 6:] == 0).all()  # padding keys


def test_cli_rejects_bad_input_without_traceback(tmp_path, cli_rejects):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\xff\xfe\x00")
    cli_rejects("analyze", [
        (["   "], "empty"),
        (["--file", str(bad)], "not UTF-8"),
        (["--file", str(tmp_path / "missing.txt")], "no such file"),
        (["--model", str(tmp_path / "nope"), "hi"], "neither a known name"),
        (["--batch-size", "0", "hi"], "batch-size"),
    ])


@pytest.mark.slow
def test_cli_analyze_writes_a_report_and_rejects_too_long_text(tmp_path, capsys):
    out = tmp_path / "rep"
    done = subprocess.run([sys.executable, "-m", "multihead.cli", "analyze", *SENTENCES[:3], "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "layer |" in done.stdout and (out / "report.json").is_file() and (out / "report.csv").is_file()
    assert "Ablation (1 - cosine of the mean-pooled last hidden state" in done.stdout  # on by default
    report = json.loads((out / "report.json").read_text())
    assert report["sections"]["ablation"]["texts"] == 3
    assert {"zero_ablation", "mean_ablation"} <= set(report["heads"][0]["metrics"])
    # the rest in this process (the console script's start-up is paid once above)
    code, _, err = run_cli(["analyze", "Again.", "--out", str(out), "--ablation", "0", "--syntax", "off",
                            "--no-coreference", "--quiet"], capsys)
    assert code == 0, err  # an earlier report may be replaced
    assert json.loads((out / "report.json").read_text())["sentences"] == 1
    code, _, err = run_cli(["analyze", "word " * 600, "--out", str(tmp_path / "x")], capsys)
    assert code == 2 and "at most 512" in err and "Traceback" not in err
    assert not (tmp_path / "x").exists()


def test_redundancy_on_hand_built_heads():
    from multihead.analysis import RedundancyStatistics, clusters, most_redundant

    T = 5
    eye = torch.eye(T)
    uniform = torch.full((T, T), 1 / T)
    # layer 0: heads 0 and 1 identical (identity); layer 1: head 0 identity, head 1 uniform
    maps = [torch.stack([eye, eye]).unsqueeze(0), torch.stack([eye, uniform]).unsqueeze(0)]
    outs = [torch.randn(1, 2, T, 3) for _ in range(2)]
    outs[1][:, 0] = outs[0][:, 0]  # L1.H0 writes exactly what L0.H0 writes
    w_o = torch.randn(4, 6)
    red = RedundancyStatistics(2, 2)
    valid = torch.ones(1, T, dtype=torch.bool)
    none = torch.zeros_like(valid)
    feed(red, TokenInfo(valid, none, none, none), maps, outputs=outs, w_o=w_o)
    js, cos = red.result().js(), red.cosine()
    assert js[0, 1] == pytest.approx(0, abs=1e-9) and js[0, 2] == pytest.approx(0, abs=1e-9)
    assert 0.3 < js[0, 3] < 1  # identity vs uniform
    assert cos[0, 2] == pytest.approx(1) and cos[1, 1] == pytest.approx(1)
    pairs = most_redundant(js, 2, k=3)
    assert {(a, b) for a, b, _ in pairs} >= {((0, 0), (0, 1)), ((0, 0), (1, 0))}
    assert clusters(js, 0.01) == [[0, 1, 2]]


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 7), st.integers(1, 6), st.integers(1, 40), st.integers(0, 2**31 - 1))
def test_pairwise_js_reads_each_row_to_its_last_weighed_key_and_equals_the_definition(N, R, S, seed):
    from multihead.analysis.stats.redundancy import _pairwise_js

    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, S + 1, (R,), generator=g)  # causal / padded rows: zeros after each row's keys
    maps = torch.softmax(torch.randn(N, R, S, generator=g) * 2, -1)
    maps = maps * (torch.arange(S) < lengths[:, None])
    maps = maps / maps.sum(-1, keepdim=True)
    p, q = maps[:, None].double(), maps[None].double()  # (N, 1, R, S), (1, N, R, S)
    m = (p + q) / 2

    def kl(a, b):
        return torch.where(a > 0, a * (a / b).log(), torch.zeros_like(a)).sum(-1)

    divergence = ((kl(p, m) + kl(q, m)) / 2 / math.log(2)).clamp_min(0)  # (N, N, R)
    # float32 sums of plogp terms round a row's divergence by up to ~1e-7 — for two nearly equal rows
    # (a divergence near 0) an error that the square root lifts to ~3e-4 of distance: each row's
    # distance is held within the square roots of its divergence moved by ROUNDING either way
    rounding = 1e-6
    low = (divergence - rounding).clamp_min(0).sqrt().mean(-1) - 1e-6  # (N, N)
    high = (divergence + rounding).sqrt().mean(-1) + 1e-6
    got = _pairwise_js(maps, budget=64).double()
    assert ((low <= got) & (got <= high)).all(), (got, divergence.sqrt().mean(-1))
    torch.testing.assert_close(got, divergence.sqrt().mean(-1), atol=2e-3, rtol=0)


def test_left_and_right_padding_give_the_same_statistics():
    """Right padding takes the diagonal fast path, left padding the general one: same numbers."""
    torch.manual_seed(0)
    lengths, T = [6, 3, 5], 7
    right = torch.zeros(3, 2, T, T)
    left = torch.zeros(3, 2, T, T)
    tok_r, tok_l = _tokens(3, T, lengths), _tokens(3, T, lengths)
    for b, n in enumerate(lengths):
        p = torch.softmax(torch.randn(2, n, n) * 2, -1)
        right[b, :, :n, :n] = p
        left[b, :, T - n:, T - n:] = p
        for field in ("valid", "first", "separator"):
            getattr(tok_l, field)[b] = getattr(tok_r, field)[b].roll(T - n)
    vis_r = tok_r.valid[:, None, None, :].expand(3, 1, T, T)
    vis_l = tok_l.valid[:, None, None, :].expand(3, 1, T, T)
    stats_r, stats_l = HeadStatistics(1, 2), HeadStatistics(1, 2)
    feed(stats_r, tok_r, [right], visible=vis_r)
    feed(stats_l, tok_l, [left], visible=vis_l)
    for name in METRICS:
        torch.testing.assert_close(stats_l.result()[name], stats_r.result()[name], msg=name)
