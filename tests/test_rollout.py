"""Attention rollout and flow (Abnar & Zuidema 2020) against their definitions: identity maps roll
out to the identity, rollout is the product of the residual graphs, and every flow equals a
maximum flow computed independently by networkx on the same layered graph."""

import pytest
import torch

import multihead as mh
from multihead.analysis.rollout import FLOW_TOKENS, attention_flow, attention_rollout, residual_graphs


def _maps(L=3, H=2, T=5, seed=0, causal=False):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(L, H, T, T, generator=g) * 2
    if causal:
        scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    return torch.softmax(scores, -1)


def test_rollout_of_identity_maps_is_the_identity():
    eye = torch.eye(6).expand(4, 3, 6, 6)
    torch.testing.assert_close(attention_rollout(eye), torch.eye(6, dtype=torch.float64).expand(4, 6, 6))
    flow = attention_flow(eye)
    torch.testing.assert_close(flow, torch.eye(6, dtype=torch.float64).expand(4, 6, 6))


def test_rollout_multiplies_the_residual_graphs_and_keeps_rows_stochastic():
    maps = _maps(L=4, T=7)
    graphs = 0.5 * torch.eye(7, dtype=torch.float64) + 0.5 * maps.double().mean(1)
    want = graphs[3] @ graphs[2] @ graphs[1] @ graphs[0]
    rolled = attention_rollout(maps)
    torch.testing.assert_close(rolled[3], want)
    torch.testing.assert_close(rolled.sum(-1), torch.ones(4, 7, dtype=torch.float64))
    # without the residual path rollout is the plain product of the head-averaged maps
    plain = attention_rollout(maps, residual=0.0)
    avg = maps.double().mean(1)
    torch.testing.assert_close(plain[1], avg[1] @ avg[0])


@pytest.mark.parametrize("causal", [False, True])
def test_flow_equals_networkx_maximum_flow(causal):
    nx = pytest.importorskip("networkx")
    maps = _maps(L=3, T=6, seed=3, causal=causal)
    flow = attention_flow(maps)
    graphs = residual_graphs(maps)
    L, T, _ = graphs.shape
    for top in range(L):
        G = nx.DiGraph()
        for layer in range(top + 1):
            for i in range(T):
                for j in range(T):
                    G.add_edge((layer + 1, i), (layer, j), capacity=float(graphs[layer, i, j]))
        for i in range(T):
            for j in range(T):
                want = nx.maximum_flow_value(G, (top + 1, i), (0, j))
                assert float(flow[top, i, j]) == pytest.approx(want, abs=1e-9), (top, i, j)
    if causal:  # nothing flows from a position to a later input token
        assert float(flow[L - 1].triu(1).abs().max()) == 0.0


def test_flow_is_bounded_by_one_and_by_rollout_support():
    maps = _maps(L=2, T=6, seed=5)
    flow = attention_flow(maps, layers=[1])
    assert torch.isnan(flow[0]).all()
    assert float(flow[1].max()) <= 1 + 1e-9 and float(flow[1].min()) >= 0
    with pytest.raises(ValueError, match="layers must be"):
        attention_flow(maps, layers=[2])


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match=r"\(L, H, T, T\)"):
        attention_rollout(torch.rand(3, 4, 5))
    with pytest.raises(ValueError, match="residual"):
        attention_rollout(_maps(), residual=1.5)
    T = FLOW_TOKENS + 1
    with pytest.raises(ValueError, match=f"{T} tokens"):
        attention_flow(torch.softmax(torch.randn(1, 1, T, T), -1))


@pytest.mark.slow
def test_rollout_of_a_real_model_and_its_figure(minilm, tmp_path):
    found = mh.viz.rollout(minilm, "The animal didn't cross the street because it was too tired.")
    L, T = 6, len(found.tokens)
    assert found.rollout.shape == (L, T, T) and found.flow.shape == (L, T, T)
    assert torch.isnan(found.flow[0]).all() and not torch.isnan(found.flow[L - 1]).any()
    torch.testing.assert_close(found.rollout.sum(-1), torch.ones(L, T, dtype=torch.float64))
    path = mh.viz.save(mh.viz.rollout_grid(found.tokens, found.rollout, found.flow), tmp_path / "rollout.svg")
    svg = path.read_text()
    assert "rollout after layer 5" in svg and "flow after layer 5" in svg and "animal" in svg
