"""The output layer on chosen rows, a part at a time (mh.hf.logits), against the model's own logits."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import multihead as mh
from architectures import build
from multihead.attn.memory import LiveBytes
from multihead.hf.logits import on_rows, token_losses


def _padded(model, texts):
    with mh.hf.model.right_padding(model.tokenizer):
        batch = model.tokenizer(texts, return_tensors="pt", padding=True)
    return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"], "use_cache": False}


TEXTS = ["The committee met on Tuesday and agreed to postpone the vote until the spring.",
         "Rain fell all night."]


@pytest.mark.parametrize("part_rows", [1, 3, 1000])
def test_the_rows_logits_equal_the_models_own_at_those_rows_in_any_parts(smollm2, part_rows):
    batch = _padded(smollm2, TEXTS)
    rows = batch["attention_mask"].bool().clone()  # (B, T): every real position
    rows[0, 2] = False  # and not every one of them
    V = smollm2.model.get_output_embeddings().weight.shape[0]
    parts = []

    def read(logits, part):
        parts.append(part)
        return logits.clone()

    with torch.inference_mode():
        want = smollm2.model(**batch).logits[rows]  # (N, V)
        got = on_rows(smollm2, batch, rows, read, part_bytes=part_rows * V * 4)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)
    N = int(rows.sum())
    assert [p.start for p in parts] == list(range(0, N, min(part_rows, N)))  # row-major, parts of that size
    assert parts[-1].stop == N


def test_what_a_model_does_to_its_logits_after_the_head_is_done_on_every_part():
    from transformers import AutoModelForCausalLM

    body = build("gemma2 (window 4, softcap 1)")
    config = body.config
    config.final_logit_softcapping = 0.5  # a tight cap: the logits are all near ±0.5, not the head's raw ones
    lm = AutoModelForCausalLM.from_config(config).to(torch.float64).eval()
    lm.base_model.load_state_dict(body.state_dict())
    model = mh.hf.HFModel(lm, None, "tiny-gemma2", None, True, config.num_hidden_layers, config.num_attention_heads,
                          config.num_key_value_heads, 64)
    ids = torch.randint(3, config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "use_cache": False}
    rows = torch.rand(2, 12, generator=torch.Generator().manual_seed(1)) < 0.6
    with torch.no_grad():
        want = lm(**batch).logits[rows]  # (N, V)
        got = on_rows(model, batch, rows, lambda logits, _part: logits.clone(), part_bytes=5 * config.vocab_size * 4)
    assert want.abs().max() <= 0.5 and got.abs().max() <= 0.5
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)


def test_a_loss_through_the_parts_has_the_whole_forwards_gradient(smollm2):
    batch = _padded(smollm2, TEXTS)
    rows = batch["attention_mask"].bool().clone()
    rows[:, -1] = False
    targets = torch.roll(batch["input_ids"], -1, 1)[rows]  # (N,)
    L, H = smollm2.num_layers, smollm2.num_heads
    grads = []
    for parted in (False, True):
        gates = torch.ones(L, H, requires_grad=True)
        with mh.hf.HeadGates(smollm2.model, gates):
            if parted:
                loss = on_rows(smollm2, batch, rows, lambda logits, part: token_losses(logits, targets[part]),
                               part_bytes=4 * 49152 * 4).sum()
            else:
                logits = smollm2.model(**batch).logits[rows]
                loss = torch.nn.functional.cross_entropy(logits, targets, reduction="sum")
        loss.backward()
        grads.append(gates.grad)
    assert grads[0].abs().max() > 0
    torch.testing.assert_close(grads[1], grads[0], atol=1e-4 * float(grads[0].abs().max()), rtol=1e-4)


def test_the_parts_hold_a_part_of_the_logits_not_all_of_them(smollm2):
    text = " ".join(["The committee met on Tuesday and agreed to postpone the vote."] * 30)
    batch = _padded(smollm2, [text])
    rows = batch["attention_mask"].bool()
    N, V = int(rows.sum()), 49152
    assert N > 300
    targets = torch.roll(batch["input_ids"], -1, 1)[rows]
    with torch.inference_mode():
        with LiveBytes("cpu") as whole:
            logits = smollm2.model(**batch).logits[rows]
            want = token_losses(logits, targets)
            del logits
        with LiveBytes("cpu") as parted:
            got = on_rows(smollm2, batch, rows, lambda logits, part: token_losses(logits, targets[part]),
                          part_bytes=32 * V * 4)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)
    assert whole.peak >= 2 * N * V * 4  # the model's logits and their selection, at least
    assert parted.peak < whole.peak / 4


class _Stack(nn.Module):
    """A base model the language model does not call as a module (it runs the layers itself)."""

    def __init__(self, vocab: int, width: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.mix = nn.Linear(width, width)

    def forward(self, input_ids, **_):
        return (self.mix(self.embed(input_ids)).tanh(),)


class _LM(nn.Module):
    base_model_prefix = "stack"

    def __init__(self) -> None:
        super().__init__()
        self.stack = _Stack(50, 8)
        self.head = nn.Linear(8, 50)

    @property
    def base_model(self):
        return self.stack

    def get_output_embeddings(self):
        return self.head

    def forward(self, input_ids, **_):
        hidden = self.stack.mix(self.stack.embed(input_ids)).tanh()  # the layers, not the stack's call
        return type("Out", (), {"logits": self.head(hidden)})()


def test_a_model_that_does_not_call_its_base_model_gets_its_own_logits_at_the_rows():
    lm = _LM().eval()
    model = mh.hf.HFModel(lm, None, "toy", None, True, 1, 1, 1, 64)
    ids = torch.randint(0, 50, (3, 7), generator=torch.Generator().manual_seed(0))
    rows = torch.rand(3, 7, generator=torch.Generator().manual_seed(2)) < 0.5
    with torch.no_grad():
        want = lm(ids).logits[rows]
        got = on_rows(model, {"input_ids": ids}, rows, lambda logits, _part: logits.clone(), part_bytes=2 * 50 * 4)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    assert on_rows(model, {"input_ids": ids}, torch.zeros(3, 7, dtype=torch.bool), lambda x, _p: x).numel() == 0


def test_nothing_marked_still_runs_the_model_and_a_loss_keeps_its_graph(smollm2):
    batch = _padded(smollm2, TEXTS)
    L, H = smollm2.num_layers, smollm2.num_heads
    gates = torch.ones(L, H, requires_grad=True)
    seen = []
    with mh.hf.HeadGates(smollm2.model, gates), mh.hf.AttentionCapture(smollm2.model, lambda c: seen.append(c.layer)):
        loss = on_rows(smollm2, batch, torch.zeros(batch["input_ids"].shape, dtype=torch.bool),
                       lambda logits, part: token_losses(logits, torch.zeros(0, dtype=torch.long)))
    assert loss.shape == (0,) and sorted(set(seen)) == list(range(L))  # every layer ran, once
    loss.sum().backward()  # no gradient to take, and no error for it
    assert gates.grad is None or gates.grad.abs().max() == 0


def test_a_causal_lm_that_calls_its_decoder_itself_is_cut_there():
    from transformers import AutoModelForCausalLM

    body = build("opt", dtype=torch.float32)
    lm = AutoModelForCausalLM.from_config(body.config).eval()
    lm.base_model.load_state_dict(body.state_dict())
    config = lm.config
    model = mh.hf.HFModel(lm, None, "tiny-opt", None, True, config.num_hidden_layers, config.num_attention_heads,
                          config.num_attention_heads, 64)
    ids = torch.randint(3, config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "use_cache": False}
    rows = torch.rand(2, 9, generator=torch.Generator().manual_seed(3)) < 0.5
    shapes = []
    handle = lm.get_output_embeddings().register_forward_hook(lambda _m, _a, out: shapes.append(tuple(out.shape)))
    with torch.no_grad():
        want = lm(**batch).logits[rows]
        shapes.clear()
        got = on_rows(model, batch, rows, lambda logits, _part: logits.clone(), part_bytes=4 * config.vocab_size * 4)
    handle.remove()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    N = int(rows.sum())
    assert shapes == [(1, min(4, N - s), config.vocab_size) for s in range(0, N, 4)]  # the parts' rows only


class _Reshaping(_LM):
    """A head that reshapes the logits by the batch's own (B, T): it cannot take cut states."""

    def forward(self, input_ids, **_):
        hidden = self.stack(input_ids)[0]
        return type("Out", (), {"logits": self.head(hidden).view(*input_ids.shape, -1)})()


def test_a_head_that_cannot_take_the_cut_states_gets_them_whole_without_the_layers_again():
    lm = _Reshaping().eval()
    model = mh.hf.HFModel(lm, None, "toy", None, True, 1, 1, 1, 64)
    ids = torch.randint(0, 50, (3, 7), generator=torch.Generator().manual_seed(0))
    rows = torch.rand(3, 7, generator=torch.Generator().manual_seed(2)) < 0.5
    stack_calls = []
    lm.stack.mix.register_forward_hook(lambda *_: stack_calls.append(1))
    with torch.no_grad():
        want = lm(ids).logits[rows]
        stack_calls.clear()
        got = on_rows(model, {"input_ids": ids}, rows, lambda logits, _part: logits.clone(), part_bytes=2 * 50 * 4)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    assert len(stack_calls) == 1  # the layers ran once; the retry answered from their states


def test_an_offloaded_head_takes_parts_of_its_weights_bytes_not_one_copy_a_few_rows(smollm2, monkeypatch):
    """accelerate brings an offloaded module's weights in for each call: 108 MiB for SmolLM2's head,
    a copy for every part of four rows would cost more than the logits it saves."""
    from types import SimpleNamespace

    batch = _padded(smollm2, TEXTS)
    rows = batch["attention_mask"].bool()
    head = smollm2.model.get_output_embeddings()
    calls = []
    handle = head.register_forward_hook(lambda _m, _a, out: calls.append(out.shape[1]))
    try:
        with torch.inference_mode():
            on_rows(smollm2, batch, rows, lambda logits, _part: logits[:, 0], part_bytes=4 * 49152 * 4)
            assert calls == [4] * (int(rows.sum()) // 4) + ([int(rows.sum()) % 4] if int(rows.sum()) % 4 else [])
            calls.clear()
            monkeypatch.setattr(head, "_hf_hook", SimpleNamespace(offload=True), raising=False)  # as accelerate's
            on_rows(smollm2, batch, rows, lambda logits, _part: logits[:, 0], part_bytes=4 * 49152 * 4)
    finally:
        handle.remove()
    assert calls == [int(rows.sum())]  # one part: the head's weights' bytes hold every row's logits
