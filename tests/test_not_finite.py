"""Numerics never silently turn into NaN (issue 27, trial 15): a float16 model whose scores pass the
dtype's range stays finite under capture, as its SDPA path does (eager's product is inf there, its
softmax NaN); a model whose own numbers are not finite is refused in one line naming the heads and
the precision that would hold them — by analyze, view, patch and prune — never reported as NaN
metrics beside finite ones.
"""

from __future__ import annotations

import re

import pytest
import torch

import multihead as mh
from architectures import build, inputs
from conftest import compiled_softmax, run_cli
from multihead.analysis.interventions.direct import direct_logit_attribution
from multihead.analysis.pipelines.common import _layers_named
from multihead.attn.precision import as_half_product
from multihead.heads.tasks import LanguageModelTask
from multihead.hf.placement import NotFiniteError

TEXTS = ["The cat sat on the mat because it was tired.", "Heads look at words; some look back."]
FLOAT16_MAX = torch.finfo(torch.float16).max  # 65,504


@pytest.mark.parametrize("scale", [None, 0.125, 0.3])
@pytest.mark.parametrize("grad", [False, True])
def test_a_float16_score_past_its_range_keeps_its_float32_value_and_the_rest_are_rounded_as_eager(scale, grad):
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(2, 3, 40, generator=g) * 3e4  # (B·Hkv, G·T, S): some past 65,504
    scores[0, 0, :3] = torch.tensor([7e4, -9e5, 65519.0])  # 65,519 rounds to 65,504, not to inf
    wide = scores.clone().requires_grad_(grad)
    got = as_half_product(wide if grad else wide.detach(), torch.float16, scale)
    eager = scores.half() if scale is None else scores.half() * scale  # (q @ kᵀ) * scale, both in float16
    over = eager.isinf()
    assert over.any() and (~over).any()
    assert torch.isfinite(got).all()
    assert torch.equal(got[~over], eager.float()[~over])  # eager's own rounding, bit for bit
    assert torch.equal(got[over], (scores if scale is None else scores * scale)[over])  # unrounded, scaled
    if grad:  # the gradient reaches the scores through either branch
        got.sum().backward()
        assert torch.isfinite(wide.grad).all()
    bf16 = as_half_product(scores.clone(), torch.bfloat16, scale)  # bfloat16 has float32's range: as before
    want = scores.bfloat16() if scale is None else scores.bfloat16() * scale
    assert torch.equal(bf16, want.float())


@pytest.mark.parametrize("units", [False, True])
@pytest.mark.parametrize("compiled", [False, True])
def test_a_float16_model_whose_scores_pass_its_range_stays_finite_under_capture_as_its_sdpa_path(units, compiled,
                                                                                               monkeypatch):
    """On a CPU with float16 units (``units``, as PyTorch's oneDNN reports them) as without: its
    scores are formed in float32 there too (a float16 GEMM's output would be inf), then rounded;
    through the compiled softmax and the eager steps alike."""
    from multihead.attn import fused, precision

    monkeypatch.setattr(precision, "half_units", lambda dt: units)
    if not compiled:
        monkeypatch.setattr(fused, "available", lambda: False)
    else:
        compiled_softmax()  # a skip only on a CPU it is not built for; under CI a missing build fails
    model = build("llama (GQA)").to(torch.float16)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("layers.0.self_attn.") and name.split(".")[-2] in ("q_proj", "k_proj"):
                p.mul_(60)  # scores of ~1e5 in the first layer
    batch = inputs("llama (GQA)", model)
    rows = batch["attention_mask"].bool()
    with torch.no_grad():
        eager = model(**batch).last_hidden_state
        model.config._attn_implementation = "sdpa"
        sdpa = model(**batch).last_hidden_state
        model.config._attn_implementation = "eager"
        seen = {}
        with mh.hf.AttentionCapture(model, lambda c: seen.__setitem__(c.layer, c.weights)):
            captured = model(**batch).last_hidden_state
    assert eager[rows].isnan().any() and sdpa[rows].isfinite().all()  # the case: eager's softmax of inf
    assert captured[rows].isfinite().all()
    for weights in seen.values():
        sums = weights.sum(-1)[rows[:, None, :].expand(-1, weights.shape[1], -1)]
        torch.testing.assert_close(sums, torch.ones_like(sums), atol=1e-5, rtol=0)


def _overflowing_llama(tokenizer, *, nan_weight: bool = False, dtype=torch.float16):
    """A random 4-layer Llama whose second MLP's outputs pass float16's range (the model's own numbers,
    SDPA or not), or — ``nan_weight`` — a float32 one with a NaN in that MLP."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=len(tokenizer), max_position_embeddings=512)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layers.1.mlp" in name:
                p.normal_(0, 40.0)
        if nan_weight:
            model.model.layers[1].mlp.down_proj.weight[0, 0] = float("nan")
    return mh.hf.wrap(model.to(dtype), tokenizer, name="overflowing")


ANSWER = re.compile(r"held NaN or inf in float16: the model's numbers pass float16's range \(65,504\) — run it in "
                    r"bfloat16 or float32 \(--dtype bfloat16\)$")


def test_a_model_whose_numbers_pass_float16s_range_is_refused_naming_its_heads_not_reported_as_nan(smollm2):
    model = _overflowing_llama(smollm2.tokenizer)
    with torch.no_grad():
        logits = model.model(**model.tokenizer(TEXTS[0], return_tensors="pt")).logits
    assert not logits.isfinite().all()  # its own forward, no capture: the model's numbers, not ours
    with pytest.raises(NotFiniteError, match=r"^the attention of \d+ heads in layers? [\d, -]+ " + ANSWER.pattern):
        mh.analyze(model, TEXTS, coreference=False)
    with pytest.raises(NotFiniteError, match=r"^the attention of \d+ heads in layers? [\d, -]+ on text 1 "):
        mh.analysis.text_views(model, TEXTS[:1])
    with pytest.raises(NotFiniteError, match="^the residual stream at the final norm " + ANSWER.pattern):
        direct_logit_attribution(model, "The capital of France is", " Paris", " London")
    with pytest.raises(NotFiniteError, match="^overflowing's next-token losses " + ANSWER.pattern):
        LanguageModelTask(model, train_size=2, test_size=2).evaluate()
    # a float32 model with a NaN weight: no precision holds it, and none is suggested
    broken = _overflowing_llama(smollm2.tokenizer, nan_weight=True, dtype=torch.float32)
    with pytest.raises(NotFiniteError, match=r"in float32: the model's weights or activations hold NaN or inf$"):
        mh.analyze(broken, TEXTS, coreference=False)


def test_the_command_line_refuses_it_in_one_line_and_writes_nothing(smollm2, tmp_path, capsys):
    folder = tmp_path / "overflowing"
    model = _overflowing_llama(smollm2.tokenizer)
    model.model.save_pretrained(folder)
    model.tokenizer.save_pretrained(folder)
    for command, extra in (("analyze", ["--file", str(tmp_path / "texts.txt")]),
                           ("view", ["--file", str(tmp_path / "texts.txt")]),
                           ("patch", ["--example", "capital"])):
        (tmp_path / "texts.txt").write_text("\n".join(TEXTS) + "\n")
        out = tmp_path / (f"{command}.html" if command == "view" else f"{command}-out")
        code, _, err = run_cli([command, "--model", str(folder), "--dtype", "float16", *extra, "--out", str(out)],
                               capsys)
        last = err.strip().splitlines()[-1]
        assert code == 2 and "Traceback" not in err, err
        assert last.startswith(f"multihead {command}: error: ") and ANSWER.search(last), last
        assert not out.exists()


@pytest.mark.parametrize(("layers", "named"), [([3], "layer 3"), ([1, 2, 3], "layers 1-3"),
                                               ([0, 2, 5, 6, 7], "layers 0, 2, 5-7"), ([4, 5], "layers 4-5")])
def test_layers_are_named_in_runs(layers, named):
    assert _layers_named(layers) == named
