"""Attention rollout and attention flow (Abnar & Zuidema 2020, "Quantifying Attention Flow in
Transformers"): how much each output position draws on each *input token* after l layers, when
attention is followed back through every layer below.

The residual-connection convention (theirs): a layer's output at position i is half its input at
i and half what its heads attend to, so each layer's graph is

    Â_l = ½·I + ½·Ā_l,    Ā_l = the mean over heads of A_l (rows sum to 1, so do Â_l's)

(``residual`` changes the ½; 0 ignores the residual path). Over these graphs:

* **rollout** multiplies them: ``R_0 = Â_0``, ``R_l = Â_l · R_{l−1}`` — the share of input token j
  in position i after layer l if identities mix linearly; every row sums to 1;
* **flow** treats the layers as a flow network — node (l, i) is position i after layer l (layer 0:
  the input tokens), an edge from (l, i) down to (l−1, j) has capacity Â_l[i, j] — and
  ``flow[l, i, j]`` is the maximum flow from (l+1, i) to input token j. It counts a token once per
  path's bottleneck, not as a product, so it spreads credit less sharply than rollout.

Maximum flows are computed here (Dinic's algorithm on the layered graph); one flow per (output,
input) pair and layer, so attention flow is for short texts (:data:`FLOW_TOKENS`).
"""

from __future__ import annotations

from collections import deque

import torch
from torch import Tensor

__all__ = ["FLOW_TOKENS", "attention_flow", "attention_rollout", "residual_graphs"]

#: The longest text attention flow takes (L·T² maximum flows on a graph of L·T² edges).
FLOW_TOKENS = 48
#: Capacities below this are left out of the flow network (they cannot carry a visible share).
_SMALLEST = 1e-9


def residual_graphs(maps: Tensor, residual: float = 0.5) -> Tensor:
    """Â_l = residual·I + (1 − residual)·mean_h A_l for maps (L, H, T, T) — or (L, T, T) already
    averaged over heads — as (L, T, T) float64, rows renormalised to sum to 1 (a fully masked
    row, e.g. padding, keeps only its residual)."""
    if not 0.0 <= residual <= 1.0:
        raise ValueError(f"residual must be a share in [0, 1]; got {residual}")
    if maps.dim() == 4:
        maps = maps.mean(1)  # (L, T, T)
    if maps.dim() != 3 or maps.shape[-1] != maps.shape[-2]:
        raise ValueError(f"maps must be (L, H, T, T) or (L, T, T) of one text; got {tuple(maps.shape)}")
    maps = maps.double()
    T = maps.shape[-1]
    graphs = residual * torch.eye(T, dtype=torch.float64) + (1 - residual) * maps  # (L, T, T)
    return graphs / graphs.sum(-1, keepdim=True).clamp_min(1e-300)


def attention_rollout(maps: Tensor, *, residual: float = 0.5) -> Tensor:
    """(L, T, T): row i of layer l is the share of each input token in position i after layer l."""
    graphs = residual_graphs(maps, residual)
    out = torch.empty_like(graphs)
    rolled = torch.eye(graphs.shape[-1], dtype=torch.float64)
    for layer, graph in enumerate(graphs):
        rolled = graph @ rolled  # (T, T)
        out[layer] = rolled
    return out


def attention_flow(maps: Tensor, *, residual: float = 0.5, layers: list[int] | None = None) -> Tensor:
    """(L, T, T): ``flow[l, i, j]`` the maximum flow from position i after layer l to input token j
    (see the module); ``layers``: only these layers (the others are NaN), default all."""
    graphs = residual_graphs(maps, residual)
    L, T, _ = graphs.shape
    if T > FLOW_TOKENS:
        raise ValueError(f"attention flow solves L·T² maximum flows; the text has {T} tokens, at most {FLOW_TOKENS} "
                         "are taken (attention_rollout has no such limit)")
    wanted = sorted(set(range(L) if layers is None else layers))
    if any(not 0 <= layer < L for layer in wanted):
        raise ValueError(f"layers must be in 0..{L - 1}; got {layers}")
    out = torch.full((L, T, T), float("nan"), dtype=torch.float64)
    caps = graphs.tolist()
    for top in wanted:
        network = _Network(caps[:top + 1], T)
        for i in range(T):
            for j in range(T):
                out[top, i, j] = network.max_flow(top + 1, i, j)
    return out


class _Network:
    """The layered flow network of layers 0..len(graphs): node (l, i) is ``l·T + i``; an edge runs
    from (l, i) down to (l−1, j) with capacity graphs[l−1][i][j]. Edges are stored once, with
    their reverse, as parallel lists (Dinic's usual layout)."""

    def __init__(self, graphs: list[list[list[float]]], T: int) -> None:
        self.T = T
        self.nodes = (len(graphs) + 1) * T
        self.head: list[list[int]] = [[] for _ in range(self.nodes)]
        self.to: list[int] = []
        self.capacity: list[float] = []
        for layer, graph in enumerate(graphs, start=1):
            for i, row in enumerate(graph):
                for j, c in enumerate(row):
                    if c > _SMALLEST:
                        self._edge(layer * T + i, (layer - 1) * T + j, c)

    def _edge(self, u: int, v: int, c: float) -> None:
        self.head[u].append(len(self.to))
        self.to.append(v)
        self.capacity.append(c)
        self.head[v].append(len(self.to))
        self.to.append(u)
        self.capacity.append(0.0)

    def max_flow(self, layer: int, i: int, j: int) -> float:
        """The maximum flow from node (layer, i) to input token j."""
        source, sink = layer * self.T + i, j
        residual = list(self.capacity)
        total = 0.0
        while True:
            level = self._levels(source, sink, residual)
            if level[sink] < 0:
                return total
            cursor = [0] * self.nodes
            while (pushed := self._push(source, sink, float("inf"), level, cursor, residual)) > _SMALLEST:
                total += pushed

    def _levels(self, source: int, sink: int, residual: list[float]) -> list[int]:
        level = [-1] * self.nodes
        level[source] = 0
        queue = deque([source])
        while queue:
            u = queue.popleft()
            for e in self.head[u]:
                v = self.to[e]
                if level[v] < 0 and residual[e] > _SMALLEST:
                    level[v] = level[u] + 1
                    queue.append(v)
        return level

    def _push(self, u: int, sink: int, limit: float, level: list[int], cursor: list[int],
              residual: list[float]) -> float:
        """One augmenting path along increasing levels from u (depth ≤ 2·layers: recursion is shallow)."""
        if u == sink:
            return limit
        edges = self.head[u]
        while cursor[u] < len(edges):
            e = edges[cursor[u]]
            v = self.to[e]
            if residual[e] > _SMALLEST and level[v] == level[u] + 1:
                pushed = self._push(v, sink, min(limit, residual[e]), level, cursor, residual)
                if pushed > _SMALLEST:
                    residual[e] -= pushed
                    residual[e ^ 1] += pushed
                    return pushed
            cursor[u] += 1
        return 0.0
