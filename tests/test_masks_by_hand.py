"""Each structured mask against small matrices written out by hand from its definition in
docs/long.md — not from the code — so an off-by-one in a definition fails here even though every
kernel agrees with ``materialize``."""

import pytest
import torch

from multihead import masks


def grid(*rows: str) -> torch.Tensor:
    """A bool matrix from rows of '1' (may attend) and '.' (may not)."""
    return torch.tensor([[c == "1" for c in row] for row in rows])


def dense(mask, T, S=None):
    m = mask.materialize(T, S if S is not None else T)
    return m.reshape(m.shape[-2:]) if m.dim() > 2 else m


CASES = [
    # window(2) on 6 tokens: query i sees keys i-2 .. i+2
    ("window(2)", masks.window(2), 6, 6, grid(
        "111...",
        "1111..",
        "11111.",
        ".11111",
        "..1111",
        "...111")),
    # window(1, 0): the query itself and the one before it
    ("window(1, 0)", masks.window(1, 0), 4, 4, grid(
        "1...",
        "11..",
        ".11.",
        "..11")),
    # window(0, 2): the query and the two after it
    ("window(0, 2)", masks.window(0, 2), 4, 4, grid(
        "111.",
        ".111",
        "..11",
        "...1")),
    # T=3 queries over S=5 keys, aligned like causal(): i' = i + S - T = i + 2; window(1) sees i'-1 .. i'+1
    ("window(1), T=3, S=5", masks.window(1), 3, 5, grid(
        ".111.",
        "..111",
        "...11")),
    ("causal, T=3, S=5", masks.causal(), 3, 5, grid(
        "111..",
        "1111.",
        "11111")),
    # global tokens 0 and -1 (= 4) of 5: their rows and columns, nothing else
    ("global_tokens([0, -1])", masks.global_tokens([0, -1]), 5, 5, grid(
        "11111",
        "1...1",
        "1...1",
        "1...1",
        "11111")),
    # Longformer: a band of 1 plus a global first token
    ("window(1) | global_tokens([0])", masks.window(1) | masks.global_tokens([0]), 5, 5, grid(
        "11111",
        "111..",
        "1111.",
        "1.111",
        "1..11")),
    # causal sliding window of 2
    ("window(2) & causal", masks.window(2) & masks.causal(), 5, 5, grid(
        "1....",
        "11...",
        "111..",
        ".111.",
        "..111")),
    # packed sequences of 2 and 3 tokens in a row of 6: block diagonal, position 5 sees nothing
    ("segments([2, 3])", masks.segments([2, 3]), 6, 6, grid(
        "11....",
        "11....",
        "..111.",
        "..111.",
        "..111.",
        "......")),
    # block layout: blocks of 2; query block 0 sees key block 0, query block 1 sees both
    ("blocks(2, [[1, 0], [1, 1]])", masks.blocks(2, torch.tensor([[True, False], [True, True]])), 4, 4, grid(
        "11..",
        "11..",
        "1111",
        "1111")),
    # the last, partial block (T=5, blocks of 2: 3 query blocks) follows its layout row
    ("blocks(2, 3x3 layout), T=5", masks.blocks(2, torch.tensor([[True, False, False], [False, True, False],
                                                                 [True, False, True]])), 5, 5, grid(
        "11...",
        "11...",
        "..11.",
        "..11.",
        "11..1")),
    ("~causal", ~masks.causal(), 3, 3, grid(
        ".11",
        "..1",
        "...")),
]


@pytest.mark.parametrize(("name", "mask", "T", "S", "want"), CASES, ids=[c[0] for c in CASES])
def test_mask_equals_the_matrix_written_from_its_definition(name, mask, T, S, want):
    assert torch.equal(dense(mask, T, S), want), f"{name}:\n{dense(mask, T, S).int()}"


def test_padding_by_hand():
    got = masks.padding([3, 1]).materialize(2, 4)  # (B, 1, T, S)
    assert got.shape == (2, 1, 2, 4)
    assert torch.equal(got[0, 0], grid("111.", "111.")) and torch.equal(got[1, 0], grid("1...", "1..."))


def test_random_blocks_follow_their_definition():
    """BigBird random attention: each query block sees exactly n key blocks, whole blocks, the same per seed."""
    T, size, n = 12, 3, 2
    m = dense(masks.random_blocks(n, size, seed=7), T)
    blocks = m.view(T // size, size, T // size, size)  # (query block, row, key block, column)
    whole = blocks.all(-1).all(1)  # (query block, key block) fully on
    assert torch.equal(blocks.any(-1).any(1), whole)  # blocks are all on or all off
    assert (whole.sum(-1) == n).all()
    assert torch.equal(m, dense(masks.random_blocks(n, size, seed=7), T))
    others = [dense(masks.random_blocks(n, size, seed=s), T) for s in range(8, 14)]
    assert any(not torch.equal(m, o) for o in others)  # the seed matters


def test_topk_keeps_each_rows_largest_allowed_scores():
    scores = torch.tensor([[3.0, 1.0, 2.0, 0.0],
                           [0.0, 5.0, 4.0, 9.0]])
    assert torch.equal(masks.topk(2).materialize(2, 4, scores=scores), grid("1.1.", ".1.1"))
    # with a rest, the k largest among the allowed keys: window(1) with T=2, S=4 allows keys 1-3 and 2-3
    k, rest = masks.split_topk(masks.topk(2) & masks.window(1))
    assert k == 2 and torch.equal(rest.materialize(2, 4), grid(".111", "..11"))
    allowed = scores.masked_fill(~rest.materialize(2, 4), float("-inf"))
    assert torch.equal(masks.topk(k).materialize(2, 4, scores=allowed), grid(".11.", "..11"))
