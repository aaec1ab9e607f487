import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import multihead as mh
from multihead import masks


def test_causal_square_is_lower_triangle():
    assert torch.equal(masks.causal().materialize(5, 5), torch.ones(5, 5, dtype=torch.bool).tril())


def test_causal_is_bottom_right_aligned():
    m = masks.causal().materialize(2, 5)  # two new queries over a cache of five keys
    assert m.tolist() == [[True, True, True, True, False], [True] * 5]
    tall = masks.causal().materialize(4, 2)  # more queries than keys: first rows see nothing
    assert tall.tolist() == [[False, False], [False, False], [True, False], [True, True]]


def test_padding_and_key_padding_agree():
    lengths = torch.tensor([3, 1, 4])
    valid = torch.arange(4).unsqueeze(0) < lengths.unsqueeze(1)
    a = masks.padding(lengths).materialize(2, 4)
    b = masks.key_padding(valid).materialize(2, 4)
    assert a.shape == b.shape == (3, 1, 2, 4)
    assert torch.equal(a, b)
    assert torch.equal(masks.key_padding(valid.long()).materialize(2, 4), b)  # HF 0/1 masks work


def test_from_tensor_bool_and_float():
    t = torch.tensor([[True, False], [False, True]])
    assert torch.equal(masks.from_tensor(t).materialize(2, 2), t)
    f = torch.tensor([[0.0, float("-inf")], [-1e9, 0.0]])
    m = masks.from_tensor(f)
    assert m.materialize(2, 2).tolist() == [[True, False], [True, True]]
    bias = m.bias(2, 2, dtype=torch.float32)
    assert bias.tolist() == [[0.0, 0.0], [-1e9, 0.0]]


@st.composite
def _structural_masks(draw):
    T = draw(st.integers(1, 6))
    S = draw(st.integers(1, 6))
    B = draw(st.integers(1, 3))
    lengths = draw(st.lists(st.integers(0, S), min_size=B, max_size=B))
    dense = draw(st.lists(st.booleans(), min_size=T * S, max_size=T * S))
    leaves = [
        masks.causal(),
        masks.padding(lengths),
        masks.from_tensor(torch.tensor(dense).view(T, S)),
    ]
    return T, S, leaves


@settings(max_examples=40, deadline=None)
@given(_structural_masks(), st.sampled_from(["and", "or", "not_and", "xor_like"]))
def test_composition_matches_elementwise_logic(case, op):
    T, S, (c, p, d) = case
    C, P, D = (m.materialize(T, S) for m in (c, p, d))
    if op == "and":
        got, want = (c & p & d).materialize(T, S), C & P & D
    elif op == "or":
        got, want = (c | p | d).materialize(T, S), C | P | D
    elif op == "not_and":
        got, want = (~c & p).materialize(T, S), ~C & P
    else:
        got, want = ((c & ~d) | (~c & d)).materialize(T, S), C ^ D
    assert torch.equal(got, want.expand_as(got))


@settings(max_examples=40, deadline=None)
@given(_structural_masks(), st.data())
def test_mask_mod_on_any_index_block_equals_the_dense_reference(case, data):
    T, S, (c, p, d) = case
    bias = masks.from_tensor(torch.randn(2, 1, T, S).double()) if p.lengths.numel() == 2 else masks.causal()
    mask = (c & d) | p if data.draw(st.booleans()) else c & p & bias
    rows = data.draw(st.lists(st.integers(0, T - 1), min_size=1, max_size=4))
    cols = data.draw(st.lists(st.integers(0, S - 1), min_size=1, max_size=4))
    i, j = torch.tensor(rows).view(-1, 1), torch.tensor(cols).view(1, -1)
    dense = mask.materialize(T, S)
    block = mask.mask_mod(i, j, T, S)
    want = dense[..., i, j]
    assert torch.equal(block.expand_as(want), want)
    if mask.has_bias:
        torch.testing.assert_close(mask.bias_mod(i, j, T, S, torch.float64).expand_as(want),
                                   mask.bias(T, S, dtype=torch.float64)[..., i, j])


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 9), st.integers(1, 9), st.data())
def test_rows_of_a_mask_are_its_rows_and_their_last_key_bounds_what_they_see(T, S, data):
    """A streamed chunk's mask: rows start.. of the full (T, S) mask over its first K keys, and
    the last key read from the mask's structure is never before one those rows may see."""
    left, right = data.draw(st.integers(0, 4)), data.draw(st.integers(0, 4))
    kinds = {
        "causal": masks.causal(),
        "window": masks.window(left, right),
        "causal window": masks.causal() & masks.window(left, 0),
        "window | sinks": masks.window(left, right) | masks.global_tokens([0]),
        "padded causal": masks.causal() & masks.padding([S, max(0, S - 2)]),
        "biased": masks.causal() & masks.from_tensor(torch.randn(T, S).double()),
    }
    mask = kinds[data.draw(st.sampled_from(sorted(kinds)))]
    start = data.draw(st.integers(0, T - 1))
    stop = data.draw(st.integers(start + 1, T))
    K = data.draw(st.integers(1, S))
    rows = masks.Rows(mask, start, T, S)
    dense = mask.materialize(T, S)
    got = rows.materialize(stop - start, K)
    want = dense[..., start:stop, :K]
    assert torch.equal(got.expand_as(want), want)
    if mask.has_bias:
        torch.testing.assert_close(rows.bias(stop - start, K, dtype=torch.float64),
                                   mask.bias(T, S, dtype=torch.float64)[..., start:stop, :K])
    last = rows.last_key(stop)
    seen = dense[..., start:stop, :].reshape(-1, S).any(0).nonzero()
    if last is not None and len(seen):
        assert int(seen[-1]) <= last <= S - 1
    if isinstance(mask, masks.Causal):  # a causal chunk ends at its last row's key: K is the rows' need, no more
        assert last == min(S - 1, stop - 1 + S - T)
    with pytest.raises(ValueError, match="query row"):
        masks.Rows(mask, T, T, S)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 9), st.integers(1, 9), st.integers(0, 4), st.integers(0, 4), st.integers(0, 4))
def test_a_relative_masks_pattern_depends_only_on_the_offset(T, S, left, right, w):
    """What lets the local kernel build one additive mask for every interior chunk of a band."""
    relative = [masks.causal(), masks.window(left, right), masks.causal() & masks.window(w, 0),
                masks.window(left, right) | masks.window(0, w), ~masks.window(w, w)]
    for mask in relative:
        assert mask.relative
        dense = mask.materialize(T, S)
        offset = torch.arange(S)[None, :] - torch.arange(T)[:, None] - (S - T)  # (T, S)
        for d in offset.unique().tolist():
            values = dense[offset == d]
            assert bool((values == values[0]).all()), (mask, d)
    for mask in (masks.padding([S]), masks.global_tokens([0]), masks.from_tensor(torch.ones(T, S, dtype=torch.bool)),
                 masks.causal() & masks.padding([S]), masks.window(w) | masks.global_tokens([0])):
        assert not mask.relative, mask


def test_combining_with_a_tensor_wraps_it():
    t = torch.ones(3, 3, dtype=torch.bool).triu()
    m = masks.causal() & t
    assert torch.equal(m.materialize(3, 3), torch.eye(3, dtype=torch.bool))


def test_and_adds_biases():
    a = masks.from_tensor(torch.full((2, 2), -1.0))
    b = masks.from_tensor(torch.full((2, 2), -2.0))
    assert (a & b).bias(2, 2, dtype=torch.float32).tolist() == [[-3.0, -3.0], [-3.0, -3.0]]
    assert (masks.causal() & a).bias(2, 2, dtype=torch.float32).tolist() == [[-1.0, -1.0], [-1.0, -1.0]]


@pytest.mark.parametrize(
    ("make", "error", "words"),
    [
        (lambda: masks.from_tensor(torch.ones(2, 2, dtype=torch.int64)), TypeError, "bool"),
        (lambda: masks.from_tensor([[1, 0]]), TypeError, "torch.Tensor"),
        (lambda: masks.key_padding(torch.ones(3, dtype=torch.bool)), ValueError, "(B, S)"),
        (lambda: masks.key_padding(torch.ones(2, 3)), TypeError, "bool or integer"),
        (lambda: masks.key_padding(torch.tensor([[2, 1, 0, -1]])), ValueError, "0/1 values"),  # lengths, ids
        (lambda: masks.padding([[1, 2]]), ValueError, "1-D"),
        (lambda: masks.padding([-1]), ValueError, ">= 0"),
        (lambda: masks.causal() | masks.from_tensor(torch.zeros(2, 2)), ValueError, "additive"),
        (lambda: ~masks.from_tensor(torch.zeros(2, 2)), ValueError, "additive"),
        (lambda: masks.causal() & 3, TypeError, "cannot combine"),
        (lambda: masks.from_tensor(torch.ones(2, 3, dtype=torch.bool)).materialize(2, 4), ValueError,
         "does not broadcast"),
        (lambda: masks.key_padding(torch.ones(2, 3, dtype=torch.bool)).materialize(2, 4), ValueError, "S=4"),
        (lambda: masks.padding([5]).materialize(2, 4), ValueError, "longer"),
        (lambda: masks.causal().materialize(-1, 2), ValueError, "non-negative"),
    ],
)
def test_bad_masks_say_what_is_expected(make, error, words):
    with pytest.raises(error, match=None) as info:
        make()
    assert words in str(info.value)


def test_mask_repr_is_readable():
    m = mh.masks.causal() & mh.masks.padding([2, 3])
    assert repr(m) == "(causal() & padding(lengths=[2, 3]))"
