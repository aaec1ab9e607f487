"""Attention beyond text, each a small real example built from our blocks.

* :func:`train_vit_digits` — a Vision Transformer on scikit-learn's ``load_digits`` (1,797 8×8
  images, offline): 2×2 patches are the tokens, plus a [CLS] token and learned positions.
* :func:`train_graph_karate` — a graph transformer on networkx's karate-club graph: every node a
  token, attention masked to the adjacency (plus self), semi-supervised node classification of
  the two factions from one labelled node per faction.
* :func:`train_recommender` — a sequential recommender: next-item prediction with a causal
  encoder on a synthetic behaviour log the example generates (users move through item
  "categories" with habits), against a most-popular baseline.

Each returns a small result dict with its held-out score; the tests check them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..masks import causal, from_tensor
from .blocks import EncoderBlock

__all__ = ["GraphTransformer", "VisionTransformer", "train_graph_karate", "train_recommender", "train_vit_digits"]


class VisionTransformer(nn.Module):
    """Patches → linear embedding + positions, [CLS], encoder blocks, linear head on [CLS]."""

    def __init__(self, image: int = 8, patch: int = 2, dim: int = 64, heads: int = 4, layers: int = 2,
                 classes: int = 10) -> None:
        super().__init__()
        if image % patch:
            raise ValueError(f"image size {image} must be a multiple of the patch size {patch}")
        self.patch = patch
        n = (image // patch) ** 2
        self.embed = nn.Linear(patch * patch, dim)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, n + 1, dim) * 0.02)
        self.blocks = nn.ModuleList([EncoderBlock(dim, heads, 2 * dim, dropout=0.0, norm_first=True)
                                     for _ in range(layers)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def patches(self, images: Tensor) -> Tensor:
        """(B, H, W) → (B, N, patch²) in row-major patch order."""
        B, H, W = images.shape
        p = self.patch
        x = images.view(B, H // p, p, W // p, p).permute(0, 1, 3, 2, 4)  # (B, H/p, W/p, p, p)
        return x.reshape(B, -1, p * p)

    def forward(self, images: Tensor) -> Tensor:
        x = self.embed(self.patches(images))  # (B, N, D)
        x = torch.cat([self.cls.expand(len(x), -1, -1), x], 1) + self.pos  # (B, N+1, D)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x[:, 0]))  # (B, classes)


def train_vit_digits(*, epochs: int = 30, seed: int = 0) -> dict:
    """Train on 1,347 digits, test on the other 450 (a fixed seeded split)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32) / 16.0  # (1797, 8, 8)
    y = torch.tensor(digits.target)
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(x), generator=g)
    train, test = order[:1347], order[1347:]
    torch.manual_seed(seed)
    model = VisionTransformer()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    for _ in range(epochs):
        model.train()
        shuffled = train[torch.randperm(len(train), generator=g)]
        for s in range(0, len(shuffled), 64):
            idx = shuffled[s:s + 64]
            loss = F.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        accuracy = float((model(x[test]).argmax(-1) == y[test]).float().mean())
    return {"test_accuracy": accuracy, "train_images": len(train), "test_images": len(test), "model": model}


class GraphTransformer(nn.Module):
    """Node features → encoder blocks whose attention mask is the adjacency plus self-loops."""

    def __init__(self, features: int, dim: int = 32, heads: int = 4, layers: int = 2, classes: int = 2) -> None:
        super().__init__()
        self.embed = nn.Linear(features, dim)
        self.blocks = nn.ModuleList([EncoderBlock(dim, heads, 2 * dim, dropout=0.0, norm_first=True)
                                     for _ in range(layers)])
        self.head = nn.Linear(dim, classes)

    def forward(self, features: Tensor, adjacency: Tensor) -> Tensor:
        """features (N, F), adjacency (N, N) bool → logits (N, classes)."""
        mask = from_tensor(adjacency | torch.eye(len(adjacency), dtype=torch.bool))  # who each node may attend to
        x = self.embed(features)[None]  # (1, N, D)
        for block in self.blocks:
            x = block(x, mask)
        return self.head(x[0])


def train_graph_karate(*, steps: int = 200, seed: int = 0) -> dict:
    """Zachary's karate club: predict each member's faction from one labelled member per faction.

    Node features are random (fixed) vectors, so only the graph structure, seen through the
    masked attention, can carry the labels from the two labelled nodes to the rest.
    """
    import networkx as nx

    graph = nx.karate_club_graph()
    n = graph.number_of_nodes()
    adjacency = torch.zeros(n, n, dtype=torch.bool)
    for a, b in graph.edges():
        adjacency[a, b] = adjacency[b, a] = True
    labels = torch.tensor([0 if graph.nodes[v]["club"] == "Mr. Hi" else 1 for v in range(n)])
    torch.manual_seed(seed)
    # features: each node's row of the adjacency, so nodes are told apart only through the graph
    features = adjacency.float() + torch.eye(n)
    labelled = torch.tensor([0, 33])  # the instructor and the administrator
    model = GraphTransformer(n)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=5e-3)
    for _ in range(steps):
        logits = model(features, adjacency)
        loss = F.cross_entropy(logits[labelled], labels[labelled])
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        pred = model(features, adjacency).argmax(-1)
    rest = torch.ones(n, dtype=torch.bool)
    rest[labelled] = False
    return {"accuracy": float((pred[rest] == labels[rest]).float().mean()), "nodes": n, "labelled": 2}


def behaviour_log(users: int = 600, length: int = 20, items: int = 60, seed: int = 0) -> Tensor:
    """Synthetic sessions (users, length): items come in 6 categories of 10; a user mostly moves to
    the next item of the same category, sometimes jumps to a random item."""
    g = torch.Generator().manual_seed(seed)
    log = torch.zeros(users, length, dtype=torch.long)
    log[:, 0] = torch.randint(0, items, (users,), generator=g)
    for t in range(1, length):
        prev = log[:, t - 1]
        follow = (prev // 10) * 10 + (prev % 10 + 1) % 10  # the next item of the same category
        jump = torch.randint(0, items, (users,), generator=g)
        log[:, t] = torch.where(torch.rand(users, generator=g) < 0.8, follow, jump)
    return log


class SequentialRecommender(nn.Module):
    def __init__(self, items: int, length: int, dim: int = 32, heads: int = 2, layers: int = 2) -> None:
        super().__init__()
        self.items = nn.Embedding(items, dim)
        self.pos = nn.Parameter(torch.randn(1, length, dim) * 0.02)
        self.blocks = nn.ModuleList([EncoderBlock(dim, heads, 2 * dim, dropout=0.0, norm_first=True)
                                     for _ in range(layers)])
        self.norm = nn.LayerNorm(dim)

    def forward(self, history: Tensor) -> Tensor:
        x = self.items(history) + self.pos[:, : history.shape[1]]  # (B, T, D)
        for block in self.blocks:
            x = block(x, causal())
        return self.norm(x) @ self.items.weight.T  # (B, T, items): next-item scores


def train_recommender(*, epochs: int = 8, seed: int = 0) -> dict:
    """Hit rate @10 of the next item on held-out users, against recommending the most popular items."""
    log = behaviour_log(seed=seed)
    train, test = log[:500], log[500:]
    torch.manual_seed(seed)
    model = SequentialRecommender(60, log.shape[1])
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3)
    for _ in range(epochs):
        for s in range(0, len(train), 50):
            batch = train[s:s + 50]
            loss = F.cross_entropy(model(batch[:, :-1]).transpose(1, 2), batch[:, 1:])
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        scores = model(test[:, :-1])[:, -1]  # (U, items): after the whole history
    target = test[:, -1]
    hit = (scores.topk(10, dim=-1).indices == target[:, None]).any(-1).float().mean()
    popular = torch.bincount(train.flatten(), minlength=60).topk(10).indices
    baseline = torch.isin(target, popular).float().mean()
    return {"hit_rate_at_10": float(hit), "popular_baseline": float(baseline), "test_users": len(test)}
