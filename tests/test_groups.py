"""Informative groups of heads: Ward clustering cut where the silhouette is best, without a group
of most heads — found again on planted groups, never chained into one."""

import torch

from multihead.analysis.stats.redundancy import clusters, informative_groups


def _distances(sizes, spread=0.05, seed=0):
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(len(sizes), 8, generator=g) * 3
    points = torch.cat([c + spread * torch.randn(n, 8, generator=g) for c, n in zip(centres, sizes, strict=True)])
    D = torch.cdist(points, points)
    return D / D.max()


def test_planted_groups_are_found_again():
    D = _distances([10, 7, 5, 3])
    found = informative_groups(D)
    assert sorted(map(sorted, found["groups"])) == sorted([list(range(0, 10)), list(range(10, 17)),
                                                           list(range(17, 22)), list(range(22, 25))])
    assert found["silhouette"] > 0.8


def test_a_chain_of_neighbours_is_not_one_group():
    # points along a line: single linkage at a threshold links them all into one cluster
    t = torch.linspace(0, 1, 40)
    D = (t[:, None] - t[None, :]).abs()
    assert len(clusters(D, 0.05)) == 1 and len(clusters(D, 0.05)[0]) == 40
    groups = informative_groups(D)["groups"]
    assert len(groups) >= 2 and max(map(len, groups)) <= 20
    assert all(max(g) - min(g) == len(g) - 1 for g in groups)  # each group a contiguous stretch
