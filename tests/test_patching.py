"""Activation patching and direct logit attribution: identical runs restore nothing, every head
restores everything, attribution patching is exact where the model is linear in the patched head,
DLA decomposes the logit difference, and the shipped examples point the expected way on SmolLM2."""

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from conftest import run_cli
from multihead.analysis.interventions.direct import direct_logit_attribution
from multihead.analysis.interventions.final import final_norm, frozen_norm
from multihead.analysis.interventions.patching import EXAMPLES, patch, patch_heads
from multihead.hf.model import HFModel

pytestmark = pytest.mark.slow

CLEAN, CORRUPT, ANSWER, WRONG = EXAMPLES["capital"]


def _tiny_llama(tokenizer, layers: int, *, linear: bool) -> HFModel:
    """A small random Llama over SmolLM2's tokenizer. ``linear``: MLPs write nothing and the final
    norm is the identity, so the logits are linear in the last layer's head outputs."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=96, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for block in model.model.layers:
            block.mlp.down_proj.weight.zero_()  # MLPs write nothing into the residual stream
        model.model.norm.weight.uniform_(0.5, 1.5)
    if linear:
        model.model.norm = nn.Identity()
    return HFModel(model, tokenizer, "tiny-llama", Path("."), True, layers, 4, 2, 64)


def test_patching_an_identical_run_restores_nothing(smollm2):
    same = patch(smollm2, CLEAN, CLEAN, ANSWER, WRONG)
    assert same.change.abs().max() < 1e-4
    with pytest.raises(ValueError, match="nothing to restore"):
        same.restored  # noqa: B018


def test_patching_every_head_restores_the_clean_run(smollm2):
    L, H = smollm2.num_layers, smollm2.num_heads
    result = patch(smollm2, CLEAN, CORRUPT, ANSWER, WRONG, heads_per_pass=135)
    assert result.clean_diff > 0 > result.corrupt_diff  # the capital example's answer flips
    every = patch_heads(smollm2, CLEAN, CORRUPT, ANSWER, WRONG, [(layer, h) for layer in range(L) for h in range(H)])
    assert every == pytest.approx(result.clean_diff, abs=2e-3)
    assert patch_heads(smollm2, CLEAN, CORRUPT, ANSWER, WRONG, []) == pytest.approx(result.corrupt_diff, abs=2e-3)
    # each head alone, batched, equals that head patched in a pass of its own
    (layer, h), share = result.top(1)[0]
    alone = patch_heads(smollm2, CLEAN, CORRUPT, ANSWER, WRONG, [(layer, h)])
    assert (alone - result.corrupt_diff) / result.gap == pytest.approx(share, abs=2e-3)
    assert share > 0.3  # one head carries much of the country → capital recall


def test_attribution_patching_is_exact_where_the_model_is_linear_in_the_head(smollm2):
    tiny = _tiny_llama(smollm2.tokenizer, 2, linear=True)
    exact = patch(tiny, CLEAN, CORRUPT, ANSWER, WRONG)
    estimate = patch(tiny, CLEAN, CORRUPT, ANSWER, WRONG, method="attribution")
    # the last layer's heads write straight into linear logits: first order is exact
    torch.testing.assert_close(estimate.change[1], exact.change[1], atol=1e-4, rtol=1e-4)
    # the first layer's heads also feed the second layer's softmax: there it is only an estimate
    assert (estimate.change[0] - exact.change[0]).abs().max() > 1e-6


def _logit_diff(model: HFModel, text: str) -> float:
    tok = model.tokenizer
    ids = tok(text, return_tensors="pt")["input_ids"]
    a, b = tok(ANSWER, add_special_tokens=False)["input_ids"][0], tok(WRONG, add_special_tokens=False)["input_ids"][0]
    with torch.no_grad():
        logits = model.model(input_ids=ids).logits[0, -1]
    return float(logits[a] - logits[b])


def test_direct_logit_attribution_is_the_heads_share_of_a_linear_readout(smollm2):
    from multihead.hf import HeadGates

    tiny = _tiny_llama(smollm2.tokenizer, 2, linear=True)
    direct = direct_logit_attribution(tiny, CLEAN, ANSWER, WRONG)
    intact = _logit_diff(tiny, CLEAN)
    for h in range(4):  # removing a last-layer head removes exactly its direct contribution
        gates = torch.ones(2, 4)
        gates[1, h] = 0
        with HeadGates(tiny.model, gates):
            removed = _logit_diff(tiny, CLEAN)
        assert direct[1, h].item() == pytest.approx(intact - removed, abs=1e-4)
    assert direct[1].abs().max() > 1e-3


def test_direct_logit_attribution_decomposes_the_logit_difference_through_a_real_norm(smollm2):
    tiny = _tiny_llama(smollm2.tokenizer, 2, linear=False)
    direct = direct_logit_attribution(tiny, CLEAN, ANSWER, WRONG)
    tok = smollm2.tokenizer
    ids = tok(CLEAN, return_tensors="pt")["input_ids"]
    a, b = tok(ANSWER, add_special_tokens=False)["input_ids"][0], tok(WRONG, add_special_tokens=False)["input_ids"][0]
    seen = []
    hook = tiny.model.model.norm.register_forward_pre_hook(lambda _m, args: seen.append(args[0][0, -1]))
    with torch.no_grad():
        logits = tiny.model(input_ids=ids).logits[0, -1]
    hook.remove()
    x = seen[0]
    scale = torch.sqrt((x * x).mean() + tiny.model.model.norm.variance_epsilon)
    d = tiny.model.lm_head.weight[a] - tiny.model.lm_head.weight[b]
    embedding = tiny.model.model.embed_tokens.weight[ids[0, -1]]  # the rest of the residual stream
    with torch.no_grad():
        rest = float(d @ (tiny.model.model.norm.weight * embedding / scale))
    assert float(direct.sum()) + rest == pytest.approx(float(logits[a] - logits[b]), abs=1e-3)


@pytest.mark.parametrize("norm", [nn.LayerNorm(16), nn.Identity()])
def test_frozen_final_norm_reproduces_the_norm(norm):
    torch.manual_seed(1)
    if isinstance(norm, nn.LayerNorm):
        with torch.no_grad():
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-1, 1)
    x = torch.randn(16) * 3 + 1
    gain, centred, scale = frozen_norm(norm, x)
    v = x - x.mean() if centred else x
    bias = norm.bias.detach() if isinstance(norm, nn.LayerNorm) else 0
    torch.testing.assert_close(gain * v / scale + bias, norm(x[None])[0].detach(), atol=1e-5, rtol=1e-5)
    assert centred == isinstance(norm, nn.LayerNorm)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kind", ["layernorm", "llama", "gemma"])
def test_frozen_final_norm_reads_a_half_precision_norm(kind, dtype):
    """A model loaded in bfloat16 runs its final norm in bfloat16: the frozen map must match it within
    the dtype's rounding (a float32 tolerance refused every such model), and still tell a LayerNorm
    from an RMSNorm when the stream's mean is small enough to hide in that rounding."""
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    torch.manual_seed(2)
    D = 576
    norm = {"layernorm": lambda: nn.LayerNorm(D), "llama": lambda: LlamaRMSNorm(D, eps=1e-5),
            "gemma": lambda: GemmaRMSNorm(D, eps=1e-6)}[kind]()
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        if kind == "layernorm":
            norm.bias.uniform_(-1, 1)
    norm = norm.to(dtype)
    for seed in range(5):
        noise = torch.randn(D, generator=torch.Generator().manual_seed(seed)) * 4
        x = noise - noise.mean() + 0.02  # mean/scale 0.005: centring moves the output less than bf16 rounds
        gain, centred, scale = frozen_norm(norm, x)
        assert centred == (kind == "layernorm"), seed
        rounded = x.to(dtype).float()
        v = rounded - rounded.mean() if centred else rounded
        bias = norm.bias.detach().float() if kind == "layernorm" else 0
        want = norm(rounded[None].to(dtype))[0].float().detach()
        torch.testing.assert_close(gain * v / scale + bias, want, atol=0.05, rtol=0.02)
        if kind == "gemma":
            torch.testing.assert_close(gain, 1 + norm.weight.detach().float())


def test_final_norm_of_smollm2_is_its_rmsnorm(smollm2):
    assert final_norm(smollm2) is smollm2.model.model.norm


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_shipped_examples_point_the_expected_way_on_smollm2(smollm2, name):
    clean, corrupt, answer, wrong = EXAMPLES[name]
    clean_diff = patch_heads(smollm2, clean, corrupt, answer, wrong, [(0, 0)])  # one early head: near the corrupt run
    assert patch_heads(smollm2, clean, clean, answer, wrong, []) > 0  # the clean answer wins the clean run
    corrupt_diff = patch_heads(smollm2, clean, corrupt, answer, wrong, [])
    whole = patch_heads(smollm2, clean, corrupt, answer, wrong,
                        [(layer, h) for layer in range(smollm2.num_layers) for h in range(smollm2.num_heads)])
    assert whole > corrupt_diff  # the clean run prefers the answer more than the corrupt one
    assert abs(clean_diff - corrupt_diff) < abs(whole - corrupt_diff)


def test_patching_refuses_what_it_cannot_patch(smollm2, minilm):
    with pytest.raises(ValueError, match="same number of tokens"):
        patch(smollm2, "The capital of France is", "The capital of the United Kingdom is", ANSWER, WRONG)
    with pytest.raises(ValueError, match="2 tokens"):
        patch(smollm2, CLEAN, CORRUPT, " suitcase", WRONG)
    with pytest.raises(ValueError, match="same token"):
        patch(smollm2, CLEAN, CORRUPT, ANSWER, ANSWER)
    with pytest.raises(ValueError, match="no language-model head"):
        patch(minilm, "The cat sat.", "The dog sat.", " cat", " dog")


def test_cli_patch_writes_the_map_and_its_page(tmp_path, capsys):
    out = tmp_path / "patch"
    code, stdout, stderr = run_cli(["patch", "--example", "capital", "--method", "attribution", "--out", str(out)],
                                   capsys)
    assert code == 0, stderr
    assert "share of the clean-vs-corrupt logit difference restored" in stdout and "restore most: L" in stdout
    assert "direct logit attribution" in stdout
    saved = json.loads((out / "patching.json").read_text())
    assert saved["model"] == "smollm2" and saved["placement"] == "float32 on cpu"
    assert len(saved["restored"]) == 30 and len(saved["restored"][0]) == 9
    page = (out / "patching.html").read_text()
    assert "Content-Security-Policy" in page and "France" in page and "<script" not in page
    code, _, stderr = run_cli(["patch", "--clean", "<b>x</b> is", "--corrupt", "y is", "--answer", " a",
                               "--wrong", " b", "--out", str(tmp_path / "bad")], capsys)
    assert code == 2 and "same number of tokens" in stderr and "Traceback" not in stderr
    code, _, stderr = run_cli(["patch", "--clean", "The cat is", "--out", str(tmp_path / "bad")], capsys)
    assert code == 2 and "--corrupt" in stderr


@pytest.mark.parametrize(("kind", "where"), [("gpt2", "transformer.ln_f"), ("opt", "model.decoder.final_layer_norm"),
                                             ("phi", "model.final_layernorm")])
def test_final_norm_is_found_wherever_the_architecture_keeps_it(smollm2, kind, where):
    from transformers import AutoConfig, AutoModelForCausalLM

    sizes = {"gpt2": dict(n_embd=32, n_layer=2, n_head=4, n_positions=32),
             "opt": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, ffn_dim=64,
                         word_embed_proj_dim=32, max_position_embeddings=32),
             "phi": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                         max_position_embeddings=32)}
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(kind, vocab_size=len(smollm2.tokenizer),
                                                                  **sizes[kind])).eval()
    tiny = HFModel(model, smollm2.tokenizer, kind, Path("."), True, 2, 4, 4, 32)
    assert final_norm(tiny) is model.get_submodule(where)
    result = patch(tiny, CLEAN, CORRUPT, ANSWER, WRONG, method="attribution")
    assert result.direct is not None and torch.isfinite(result.direct).all()


def test_a_gap_within_the_dtypes_rounding_is_not_shared_out(smollm2):
    """A random model in bfloat16 prefers neither answer: its clean and corrupt logit differences sit
    within a few bfloat16 steps of each other, and a share of that gap was rounding noise (a random
    GPT-2 shape's IOI printed shares of +2.26 in bfloat16 where float32's were +5.58). In float32 the
    same model's gap is its preference, and is shared out."""
    tiny = _tiny_llama(smollm2.tokenizer, 2, linear=False)
    clean, corrupt, answer, wrong = EXAMPLES["ioi"]
    wide = patch(tiny, clean, corrupt, answer, wrong, method="attribution")
    assert wide.dtype == "float32" and wide.resolution == pytest.approx(1e-4) and wide.no_share() is None
    assert wide.restored.shape == (2, 4)
    tiny.model.to(torch.bfloat16)
    half = patch(tiny, clean, corrupt, answer, wrong, method="attribution")
    assert half.dtype == "bfloat16" and abs(half.gap) < half.resolution  # the model's logits are small and alike
    assert half.resolution > 0.01  # 4 bfloat16 steps at its largest logit
    why = half.no_share()
    assert why is not None and "within bfloat16's rounding" in why
    with pytest.raises(ValueError, match="rounding noise"):
        half.restored  # noqa: B018
    saved = half.to_dict()
    assert "restored" not in saved and saved["no_share"] == why and saved["dtype"] == "bfloat16"
    assert saved["resolution"] == pytest.approx(half.resolution, abs=1e-6)
    from multihead.render.patching import patching_page
    from multihead.render.text import patching_table

    assert "no shares: the clean and corrupt logit differences" in patching_table(half)
    assert "<p>No shares: the clean and corrupt logit differences" in patching_page(half, "tiny")


def test_changes_within_the_logits_rounding_are_drawn_as_nothing():
    """SmolLM2 in bfloat16 (logits near 7, steps of 1/32) printed shares of ±0.005 all over its map —
    one or two steps of its rounding, not a head's doing: under the resolution a cell is "." (the
    text) or "·" (the page), a line saying how much that hides; in float32 the same numbers show."""
    from multihead.analysis.interventions.patching import Patching
    from multihead.render.patching import patching_page
    from multihead.render.text import patching_table, patching_text

    change = torch.tensor([[0.0625, -0.0625, 12.5], [0.0, 0.3, -0.7]])  # (L, H) logits; the gap 13.375
    given = dict(tokens=["a"], corrupt_tokens=["b"], answer=" Paris", wrong=" Rome", position=0, clean_diff=7.3125,
                 corrupt_diff=-6.0625, change=change, method="exact")
    half = Patching(**given, resolution=0.62, dtype="bfloat16")
    assert half.within_rounding().tolist() == [[True, True, False], [True, True, False]]
    table = patching_table(half)
    assert "(\".\": a change under ±0.62 logits, within bfloat16's rounding of logits this size; a share under " \
        "±0.046)" in table, table
    rows = [line.split("|")[1].split() for line in table.splitlines() if line[:5].strip().isdigit()]
    assert rows == [[".", ".", "+0.935"], [".", ".", "-0.052"]], table
    page = patching_page(half, "smollm2")
    assert page.count(">·</td>") == 4 and ">+0.935</td>" in page and ">-0.052</td>" in page
    assert "(within rounding)" in page and "·: a change under ±0.62 logits, within bfloat16" in page
    # the heads listed as restoring most: those the map shows, restoring (L1.H1's +0.022 is rounding,
    # L1.H2 moves the other way); they were ranked over every cell, the hidden ones too
    assert half.top() == [((0, 2), pytest.approx(12.5 / 13.375))]
    assert "restore most: L0.H2 +0.935" in patching_table(half) or "restore most: L0.H2 +0.935" in \
        patching_text(half, "smollm2", " Paris", " Rome")
    assert "<p>Restore most: L0.H2 +0.935</p>" in page
    against = torch.tensor([[0.0625, -0.0625, -12.5], [0.0, 0.3, -0.7]])  # beyond the rounding: away only
    assert Patching(**{**given, "change": against}, resolution=0.62, dtype="bfloat16").top_words() == \
        "restore most: no head restores a share beyond the logits' rounding"
    wide = Patching(**given)  # float32: its resolution 1e-4, every number its own
    rows = [line.split("|")[1].split() for line in patching_table(wide).splitlines() if line[:5].strip().isdigit()]
    assert rows == [["+0.005", "-0.005", "+0.935"], [".", "+0.022", "-0.052"]]
    assert "rounding" not in patching_table(wide) and "·" not in patching_page(wide, "smollm2")
    assert '(".": under ±0.0005)' in patching_table(wide)  # what its one "." hides, said too
    # an estimate says it is one, in the text and on the page (it read as exact patching)
    assert patching_table(wide).startswith("share of the clean-vs-corrupt logit difference restored by patching each")
    estimated = Patching(**{**given, "method": "attribution"})
    for shown in (patching_table(estimated), patching_page(estimated, "smollm2")):
        assert "restored as estimated by attribution patching (first order: one forward and one backward)" in shown
    # a clean run that prefers the answer less than the corrupt one (gap < 0): a positive share moves
    # toward the wrong answer, so the legend says what a share's colour means; shares of 4.5 over a gap
    # of 0.03 are said to be hard to read (a Chinese example gave +4.46 with no word), the gap printed
    tiny = Patching(**{**given, "clean_diff": 1.6705, "corrupt_diff": 1.7028,
                       "change": torch.tensor([[-0.144, 0.01, 0.0], [0.0, 0.0, 0.002]])})
    page, text = patching_page(tiny, "smollm2"), patching_text(tiny, "smollm2", ",", ".")
    assert "red: toward the clean run&#x27;s logit difference (restored); blue: away from it" in page
    assert "toward the clean answer" not in page and "(gap -0.0323)" in text
    for shown in (page, text):
        assert "only 0.0323 apart (gap -0.0323) while single heads move it by up to 0.1440" in shown
    assert wide.small_gap() is None and "note:" not in patching_text(wide, "smollm2", " Paris", " Rome")
    # the direct logit attribution's heads by size, either sign (L29.H0 at -1.67 was left out of SmolLM2's)
    wide.direct = torch.tensor([[0.1, -3.0, 2.0], [0.5, 0.0, -0.2]])
    assert "direct logit attribution (clean run), largest in size: L0.H1 -3.000, L0.H2 +2.000, L1.H0 +0.500, " \
        "L1.H2 -0.200, L0.H0 +0.100" in patching_text(wide, "smollm2", " Paris", " Rome")


def test_the_maps_cells_keep_their_numbers_readable():
    """Full blue under black text was 2.4 : 1 (the strongest heads were the hardest to read); the
    text is white where that reads better."""
    from multihead.render.patching import _cell_style

    assert _cell_style(-1.0, 1.0) == "background:rgb(0,0,255);color:#fff"
    assert _cell_style(1.0, 1.0) == "background:rgb(255,0,0);color:#000"  # black on red: 5.3 : 1
    assert _cell_style(0.0, 1.0).endswith("color:#000") and _cell_style(-0.2, 1.0).endswith("color:#000")
    assert _cell_style(float("nan"), 1.0) == "background:rgb(255,255,255);color:#000"
