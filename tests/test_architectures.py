"""Any model a researcher brings: for every architecture in tests/architectures.py, either the
captured maps are transformers' own (eager ``output_attentions``, in float64; several eager paths
soft-max in float32 even then, hence 2e-6 rather than 1e-10 — a missed soft-cap, window or sink
moves weights by 1e-2 or more) with the
model's outputs unchanged under capture, gates at 0 equal physical pruning and the report has one
finite record per head — or a one-line refusal that names the architecture."""

import copy
import json
import math

import pytest
import torch

import multihead as mh
from architectures import ARCHITECTURES, FLOAT32_ONLY, SUPPORTED_SINCE, build, inputs
from multihead.hf.sites import UnsupportedModelError

transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")

SUPPORTED = [n for n, (_, _, what) in ARCHITECTURES.items() if what == "supported"]
ENCODER_DECODER = [n for n, (_, _, what) in ARCHITECTURES.items() if what == "encoder-decoder"]
REFUSED = [n for n, (_, _, what) in ARCHITECTURES.items() if what == "refused"]
MAPS = 2e-6  # see the module docstring


def _close(got, want):
    torch.testing.assert_close(got, want, atol=1e-5 * float(want.abs().max()), rtol=0)


def _valid(batch, T):
    mask = batch.get("attention_mask")
    B = next(iter(batch.values())).shape[0]
    return torch.ones(B, T, dtype=torch.bool) if mask is None else mask.bool()


def _eager(model, batch):
    with torch.no_grad():
        return model(**batch, output_attentions=True)


def _captured(model, batch, stack=None):
    seen: dict[int, torch.Tensor] = {}
    with mh.hf.AttentionCapture(model, lambda c: seen.__setitem__(c.layer, c.weights), stack=stack), \
            torch.no_grad():
        out = model(**batch)
    return seen, out


def _assert_maps_equal(got: dict, want: tuple, valid_q, valid_k, name):
    assert sorted(got) == list(range(len(want))), (name, sorted(got), len(want))
    for layer, ref in enumerate(want):
        w = got[layer]
        assert w.shape == ref.shape, (name, layer, w.shape, ref.shape)
        keep = (valid_q[:, None, :, None] & valid_k[:, None, None, :]).expand_as(w)
        torch.testing.assert_close(w[keep], ref[keep], atol=MAPS, rtol=0,
                                   msg=lambda m, n=name, i=layer: f"{n} L{i}: {m}")


@pytest.mark.parametrize("name", SUPPORTED)
def test_captured_maps_are_transformers_own_and_outputs_unchanged(name):
    model = build(name)
    batch = inputs(name, model)
    ref = _eager(model, batch)
    seen, out = _captured(model, batch)
    T = ref.attentions[0].shape[-1]
    valid = _valid(batch, T)
    _assert_maps_equal(seen, ref.attentions, valid, valid, name)
    hidden, ref_hidden = out.last_hidden_state, ref.last_hidden_state
    rows = valid if hidden.shape[1] == T else torch.ones(hidden.shape[:2], dtype=torch.bool)
    _close(hidden[rows], ref_hidden[rows])
    assert model.config._attn_implementation == "eager"  # the capture put everything back


@pytest.mark.parametrize("name", [n for n in SUPPORTED if ARCHITECTURES[n][0] not in FLOAT32_ONLY])
def test_in_bfloat16_the_captured_maps_and_outputs_are_as_close_to_exact_as_eager_attentions(name):
    """In bfloat16 the capture computes as the model's eager path does (scores and P·V in bfloat16, the
    softmax in float32): against the same weights in float64, its maps and the model's outputs
    under capture are as far from exact as eager bfloat16's own — not farther (a missed soft-cap,
    window or sink would move the maps by far more than bfloat16's rounding)."""
    model = build(name, dtype=torch.bfloat16)
    exact = copy.deepcopy(model).to(torch.float64)
    batch = inputs(name, model)
    with torch.no_grad():
        want = exact(**{k: v.double() if v.is_floating_point() else v for k, v in batch.items()},
                     output_attentions=True)
    eager = _eager(model, batch)
    seen, out = _captured(model, batch)
    T = want.attentions[0].shape[-1]
    valid = _valid(batch, T)

    def farthest(maps) -> float:
        keep = (valid[:, None, :, None] & valid[:, None, None, :])
        return max(float((maps[i].double() - w).abs()[keep.expand_as(w)].max()) for i, w in enumerate(want.attentions))

    assert farthest(seen) <= 1.5 * farthest(eager.attentions) + 1e-3, name  # measured: 0.93x to 1.15x
    hidden = want.last_hidden_state
    rows = valid if hidden.shape[1] == T else torch.ones(hidden.shape[:2], dtype=torch.bool)
    ours = float((out.last_hidden_state.double() - hidden)[rows].abs().max())
    theirs = float((eager.last_hidden_state.double() - hidden)[rows].abs().max())
    assert ours <= 1.5 * theirs + 1e-3 * float(hidden[rows].abs().max()), name


def test_a_shared_module_is_gated_layer_by_layer():
    """ALBERT runs one attention module for every layer: its gates act call by call, each layer its own."""
    model = build("albert")
    batch = inputs("albert", model)
    (site,) = [s for s in mh.hf.sites.find_sites(model) if s.kind == "self"]
    assert site.repeats == 2 and site.names == ["encoder.0", "encoder.1"]
    gates = torch.ones(2, site.num_heads, dtype=torch.float64)
    gates[0, 1] = 0  # head 1 of layer 0 only
    seen = {}
    with torch.no_grad(), mh.hf.HeadGates(model, values=gates), \
            mh.hf.AttentionCapture(model, lambda c: seen.__setitem__(c.layer, c.outputs)):
        model(**batch)
    assert sorted(seen) == [0, 1]
    assert seen[0][:, 1].abs().max() == 0 and seen[1][:, 1].abs().max() > 0  # removed in layer 0 alone
    assert seen[0][:, 0].abs().max() > 0


@pytest.mark.parametrize("name", SUPPORTED)
def test_gates_at_zero_equal_physical_pruning(name):
    model = build(name)
    batch = inputs(name, model)
    sites = mh.hf.sites.find_sites(model)
    L, H = sum(len(s.layers) for s in sites), sites[0].num_heads
    pruned = {0: [1], L - 1: list(range(H))}  # one head, and a whole layer
    gates = torch.ones(L, H, dtype=torch.float64)
    gates[0, 1] = 0
    gates[L - 1] = 0
    with torch.no_grad(), mh.hf.HeadGates(model, values=gates):
        gated = model(**batch).last_hidden_state
    with torch.no_grad():
        full = model(**batch).last_hidden_state
    try:
        mh.prune_heads(model, pruned)
    except TypeError as err:  # documented: fused Q/K/V projections and shared layers are gated, not pruned
        assert ((sites[0].qkv is not None and "fused" in str(err)) or (sites[0].repeats > 1 and "shared" in str(err))
                or (sites[0].k is None and "no separate Linear W^Q, W^K, W^V" in str(err)))
        assert not torch.allclose(gated, full)  # the gates did act
        return
    with torch.no_grad():
        got = model(**batch).last_hidden_state
    rows = _valid(batch, got.shape[1]) if got.shape[1] == gated.shape[1] and "attention_mask" in batch \
        else torch.ones(got.shape[:2], dtype=torch.bool)
    _close(got[rows], gated[rows])  # the gated run computes in float64, the pruned one as eager does
    assert not torch.allclose(got[rows], full[rows])
    assert mh.heads.count_heads(model) == [H - 1, *([H] * (L - 2)), 0]


@pytest.mark.parametrize("name", ENCODER_DECODER)
def test_encoder_decoder_stacks_are_captured_apart(name):
    model = build(name)
    batch = inputs(name, model)
    ref = _eager(model, batch)
    enc_valid = _valid(batch, batch["input_ids"].shape[1])
    dec_valid = torch.ones_like(batch["decoder_input_ids"], dtype=torch.bool)
    for stack, want, vq, vk in (("encoder", ref.encoder_attentions, enc_valid, enc_valid),
                                ("decoder", ref.decoder_attentions, dec_valid, dec_valid),
                                ("cross", ref.cross_attentions, dec_valid, enc_valid)):
        seen, out = _captured(model, batch, stack=stack)
        _assert_maps_equal(seen, want, vq, vk, f"{name} {stack}")
        _close(out.last_hidden_state, ref.last_hidden_state)
    with pytest.raises(UnsupportedModelError, match=r"3 self-attention stacks|2 self-attention stacks"):
        mh.hf.AttentionCapture(model, lambda *a: None)
    # gates and pruning take a stack too: gates at 0 equal pruning in each (T5: gates only, documented)
    for stack in ("encoder", "decoder", "cross"):
        model = build(name)
        gates = torch.ones(2, 4, dtype=torch.float64)
        gates[0, 1] = 0
        gates[1] = 0
        with torch.no_grad(), mh.hf.HeadGates(model, values=gates, stack=stack):
            gated = model(**batch).last_hidden_state
        try:
            mh.prune_heads(model, {0: [1], 1: [0, 1, 2, 3]}, stack=stack)
        except TypeError as err:
            assert ARCHITECTURES[name][0] == "t5" and "relative position bias" in str(err)
            continue
        with torch.no_grad():
            _close(model(**batch).last_hidden_state, gated)


@pytest.mark.parametrize("name", REFUSED)
def test_architectures_outside_the_attention_interface_are_refused_in_one_line(name):
    model = build(name)
    with pytest.raises(UnsupportedModelError) as err:
        mh.hf.find_sites(model)
    message = str(err.value)
    assert type(model).__name__ in message and "\n" not in message and "supported are" in message
    with pytest.raises(UnsupportedModelError):
        mh.hf.HeadGates(model)


def _word_tokenizer(vocab_size: int):
    """A whitespace tokenizer over the words w3 .. w{vocab_size-1}, with [PAD] 0, [BOS] 1, [EOS] 2."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"[PAD]": 0, "[BOS]": 1, "[EOS]": 2, **{f"w{i}": i for i in range(3, vocab_size)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[PAD]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="[BOS] $A [EOS]", special_tokens=[("[BOS]", 1),
                                                                                             ("[EOS]", 2)])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", bos_token="[BOS]",
                                                eos_token="[EOS]")


@pytest.mark.parametrize("name", [n for n in SUPPORTED if ARCHITECTURES[n][0] != "vit"])
def test_the_report_has_one_finite_record_per_head(name, tmp_path):
    model = build(name, dtype=torch.float32)
    sites = mh.hf.sites.find_sites(model)
    tok = _word_tokenizer(model.config.vocab_size)
    L = sum(len(s.layers) for s in sites)
    hf = mh.hf.HFModel(model, tok, name, tmp_path, all(s.causal for s in sites), L, sites[0].num_heads,
                       sites[0].num_kv_heads, model.config.max_position_embeddings)
    g = torch.Generator().manual_seed(2)
    texts = [" ".join(f"w{int(i)}" for i in torch.randint(3, model.config.vocab_size, (n,), generator=g))
             for n in (5, 9, 12)]
    report = mh.analyze(hf, texts, coreference=False, batch_size=2)
    assert len(report.heads) == L * sites[0].num_heads
    assert [(r.layer, r.head) for r in report.heads] == [(la, h) for la in range(L) for h in range(sites[0].num_heads)]
    for r in report.heads:
        for key in ("entropy", "entropy_norm", "self", "local", "max_weight"):
            assert math.isfinite(r.metrics[key]), (name, r.layer, r.head, key)
    assert report.causal == hf.is_causal and (("induction" in report.heads[0].metrics) == hf.is_causal)
    assert report.stack == ("decoder" if hf.is_causal else "encoder") == sites[0].stack
    assert all(h["stack"] == report.stack for h in json.loads(report.to_json())["heads"])


def test_the_docs_table_lists_every_architecture_of_the_matrix_with_its_status():
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "analysis.md").read_text(encoding="utf-8")
    table = text[text.index("| architecture | model class | status |"):].split("\n\n")[0].splitlines()[2:]
    rows = {line.split("|")[1].strip(): line.split("|")[3].strip() for line in table}
    assert set(rows) == set(ARCHITECTURES)
    for name, (_, _, what) in ARCHITECTURES.items():
        status = rows[name]
        if name in SUPPORTED_SINCE:  # the row says from which transformers on, whichever is installed
            major, minor = SUPPORTED_SINCE[name]
            assert status.startswith(f"supported with transformers ≥ {major}.{minor}") and "refused" in status
            continue
        assert status.startswith({"supported": "supported", "refused": "refused",
                                  "encoder-decoder": "supported: three stacks"}[what]), (name, status)


def _save(name: str, folder, lm: bool = False):
    """A tiny model of ``name`` saved as a local Hugging Face folder with a word tokenizer."""
    from transformers import AutoModelForCausalLM

    model = build(name, dtype=torch.float32)
    if lm:
        config = model.config
        config.architectures = [f"{type(model).__name__.removesuffix('Model')}LMHeadModel"]
        head = AutoModelForCausalLM.from_config(config)
        head.base_model.load_state_dict(model.state_dict())
        model = head
    model.save_pretrained(folder)
    _word_tokenizer(model.config.vocab_size).save_pretrained(folder)
    return folder


@pytest.mark.slow
def test_the_cli_on_local_folders_of_other_architectures(tmp_path, capsys):
    from conftest import run_cli

    gpt2 = _save("gpt2", tmp_path / "gpt2", lm=True)
    code, out, err = run_cli(["analyze", "w5 w6 w7 w8 w9 w10", "w11 w12 w13", "--model", str(gpt2), "--out",
                              str(tmp_path / "r"), "--no-coreference", "--syntax", "off"], capsys)
    assert code == 0, err
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["causal"] is True and "induction" in report["heads"][0]["metrics"]  # a GPT2LMHeadModel is causal
    assert report["sections"]["ablation"]["objective"].startswith("next-token")
    assert "zero_ablation" in report["heads"][0]["metrics"]
    code, out, err = run_cli(["analyze", "w5 w6 w7 w8 w9 w10 w11 w12", "--model", str(gpt2), "--out",
                              str(tmp_path / "w"), "--no-coreference", "--syntax", "off", "--what-if",
                              "window=2,sinks=1"], capsys)
    assert code == 0 and "What if the model attended with window 2 + 1 sinks?" in out, err
    change = json.loads((tmp_path / "w" / "report.json").read_text())["sections"]["what_if"]
    assert len(change["delta_per_layer"]) == 2 and change["delta_all_layers"] != 0
    albert = _save("albert", tmp_path / "albert")  # one attention module for both layers: gated call by call
    code, out, err = run_cli(["analyze", "w5 w6 w7 w8 w9 w10", "w11 w12 w13", "--model", str(albert), "--out",
                              str(tmp_path / "a"), "--no-coreference", "--syntax", "off"], capsys)
    assert code == 0, err  # the default run, ablation included
    report = json.loads((tmp_path / "a" / "report.json").read_text())
    assert report["num_layers"] == 2 and "zero_ablation" in report["heads"][0]["metrics"]
    effects = [h["metrics"]["zero_ablation"] for h in report["heads"]]
    assert len(set(effects[:4])) > 1 and effects[:4] != effects[4:]  # each layer's heads removed alone
    folder = _save("deberta-v2", tmp_path / "deberta")
    code, _, err = run_cli(["analyze", "w5 w6", "--model", str(folder), "--out", str(tmp_path / "deberta" / "r")],
                           capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert not (tmp_path / "deberta" / "r").exists() and "DisentangledSelfAttention" in err
    t5 = _save("t5", tmp_path / "t5")
    target = tmp_path / "target.txt"
    target.write_text("w20 w21 w22\nw30 w31\n")
    code, out, err = run_cli(["analyze", "w5 w6 w7 w8", "w9 w10", "--model", str(t5), "--target", str(target),
                              "--out", str(tmp_path / "t5r"), "--syntax", "off"], capsys)
    assert code == 0, err
    assert "encoder stack:" in out and "decoder stack:" in out and "cross stack:" in out
    assert "Degenerate heads (input-independent attention whose removal changes nothing): not tested" in out
    page = (tmp_path / "t5r" / "report.html").read_text()
    assert all(f"t5 — {stack} stack: 2 layers × 4 heads" in page for stack in ("encoder", "decoder", "cross"))
    code, out, err = run_cli(["compare", str(tmp_path / "t5r"), str(tmp_path / "t5r"), "--out",
                              str(tmp_path / "t5c")], capsys)
    assert code == 0 and "only the encoder stacks are compared: the reports' cross and decoder stacks are left out" \
        in out + err, out + err
    code, _, err = run_cli(["analyze", "w5 w6 w7 w8", "w9 w10", "--model", str(t5), "--target", str(target),
                            "--ablation", "2", "--out", str(tmp_path / "t5a"), "--syntax", "off"], capsys)
    assert code == 2 and err.strip().splitlines() == [
        "multihead analyze: error: --ablation measures each head against a one-stack text model's own objective; "
        "t5 is an encoder-decoder model (its heads are gated in Python: mh.hf.HeadGates)"], err
    report = json.loads((tmp_path / "t5r" / "report.json").read_text())
    assert report["stack"] == "encoder" and set(report["stacks"]) == {"decoder", "cross"}
    assert report["stacks"]["cross"]["heads"][0]["stack"] == "cross"
    code, _, err = run_cli(["analyze", "w5", "w6", "w7", "--model", str(t5), "--target", str(target), "--out",
                            str(tmp_path / "bad")], capsys)
    assert code == 2 and "--target has 2 non-empty lines for 3 texts" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_cli(["analyze", "w5", "--model", str(gpt2), "--target", str(target), "--out",
                            str(tmp_path / "bad2")], capsys)
    assert code == 2 and "--target" in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_a_decoders_base_model_checkpoint_is_read_with_its_tied_head_or_refused_where_a_head_is_needed(
        tmp_path, capsys):
    """A folder saved from a decoder's base model (``"architectures": ["LlamaModel"]``: an embedding
    model, or ``model.model.save_pretrained``) crashed every command that reads logits
    (``'BaseModelOutputWithPast' object has no attribute 'logits'``). With its output embedding tied
    to the input one its head is in the checkpoint: it loads as the language model it is; untied,
    it is read without one, and what needs a head says so in one line."""
    from transformers import AutoModelForCausalLM

    from conftest import run_cli

    tied = _save("gpt2", tmp_path / "gpt2-base")  # GPT2Model; GPT-2 ties its embeddings
    assert json.loads((tied / "config.json").read_text())["architectures"] == ["GPT2Model"]
    loaded = mh.hf.load(tied)
    assert loaded.has_lm_head and loaded.is_causal
    whole = AutoModelForCausalLM.from_pretrained(tied).eval()  # the head the checkpoint's embedding makes
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        assert torch.equal(loaded.model(input_ids=ids).logits, whole(input_ids=ids).logits)
    untied = _save("llama (GQA)", tmp_path / "llama-base")
    assert json.loads((untied / "config.json").read_text())["architectures"] == ["LlamaModel"]
    headless_model = mh.hf.load(untied)
    assert not headless_model.has_lm_head
    from multihead.analysis.interventions.ablation import ablation_effects, attribution_effects

    for measure in (ablation_effects, attribution_effects):  # the Python API as the commands
        with pytest.raises(ValueError, match="is a decoder loaded without a language-model head"):
            measure(headless_model, ["w5 w6 w7"])
    texts = ["w5 w6 w7 w8 w9 w10", "w11 w12 w13"]
    code, out, err = run_cli(["analyze", *texts, "--model", str(untied), "--out", str(tmp_path / "r"),
                              "--no-coreference", "--syntax", "off"], capsys)
    assert code == 0 and "not tested" in out, err  # the default run: the probes and labels, no ablation
    headless = "llama-base is a decoder loaded without a language-model head"
    for command, args in (("analyze", [*texts, "--ablation", "2"]), ("analyze", [*texts, "--what-if", "window=2"]),
                          ("patch", ["--example", "capital"]), ("prune", [])):
        code, _, err = run_cli([command, *args, "--model", str(untied), "--out", str(tmp_path / "no")], capsys)
        assert code == 2 and headless in err and len(err.strip().splitlines()) == 1, (command, err)
        assert not (tmp_path / "no").exists()


@pytest.mark.parametrize("name", ENCODER_DECODER)
def test_an_encoder_decoder_report_has_three_stacks_equal_to_a_direct_computation(name, tmp_path):
    model = build(name)
    tok = _word_tokenizer(model.config.vocab_size)
    sites = mh.hf.sites.find_sites(model)
    hf = mh.hf.HFModel(model, tok, name, tmp_path, False, 2, 4, 4, 128)
    text, target = "w5 w6 w7 w8 w9 w10", "w20 w21 w22 w23"
    report = mh.analyze(hf, [text], targets=[target])
    assert {s.stack for s in sites} == {"encoder", "decoder", "cross"}
    assert report.stack == "encoder" and list(report.stacks) == ["decoder", "cross"]
    assert report.stacks["decoder"].causal and len(report.stacks["cross"].heads) == 8
    # the same forward pass by hand, with transformers' own maps
    src = tok(text, return_tensors="pt")["input_ids"]
    ids = tok(target)["input_ids"]
    start = model.config.decoder_start_token_id
    dec = torch.tensor([[start if start is not None else tok.pad_token_id, *ids[:-1]]])
    with torch.no_grad():
        ref = model(input_ids=src, decoder_input_ids=dec, output_attentions=True)
    for layer in range(2):
        cross = ref.cross_attentions[layer][0].float()  # (H, T, S)
        entropy = -(cross * cross.clamp_min(1e-30).log()).sum(-1).mean(-1)  # (H,)
        special = cross[..., [0, src.shape[1] - 1]].sum(-1).mean(-1)  # [BOS] first, [EOS] last
        enc = ref.encoder_attentions[layer][0].float()
        enc_self = enc.diagonal(dim1=-2, dim2=-1).mean(-1)
        for h in range(4):
            got = report.stacks["cross"].head(layer, h).metrics
            assert got["entropy"] == pytest.approx(float(entropy[h]), abs=1e-5)
            assert got["source_special"] == pytest.approx(float(special[h]), abs=1e-5)
            assert report.head(layer, h).metrics["self"] == pytest.approx(float(enc_self[h]), abs=1e-5)


def test_every_site_has_a_name_people_can_guess_for_our_layers_and_transformers_alike():
    from multihead.models import build as build_ours

    assert mh.hf.site_names(build("llama (GQA)")) == ["decoder.0", "decoder.1"]
    assert mh.hf.site_names(build("bert")) == ["encoder.0", "encoder.1"]
    assert sorted(set(n.split(".")[0] for n in mh.hf.site_names(build("t5")))) == ["cross", "decoder", "encoder"]
    ours = build_ours("transformer-base", device="meta")  # our encoder-decoder: the same three stacks
    names = mh.hf.site_names(ours)
    assert names[:2] == ["encoder.0", "encoder.1"] and "decoder.5" in names and "cross.5" in names
    assert {s.stack: s.causal for s in mh.hf.find_sites(ours)} == {"encoder": False, "decoder": True, "cross": False}
    assert mh.hf.site_names(build_ours("gpt2-small", device="meta"))[-1] == "decoder.11"
    model = build("llama (GQA)")
    ((site, layer),) = mh.hf.select(model, "decoder.1")
    assert layer == 1 and site.layer == 1
    with pytest.raises(ValueError, match=r"no attention site 'decoder\.7'.*decoder\.0\.\.decoder\.1"):
        mh.hf.select(model, "decoder.7")
    seen = []
    with torch.no_grad(), mh.hf.AttentionCapture(model, lambda c: seen.append(c.name), at="decoder.1"):
        model(**inputs("llama (GQA)", model))
    assert seen == ["decoder.1"]  # a reader attached at one name reads that layer only


def test_heads_left_are_counted_per_stack_of_an_encoder_decoder():
    """count_heads gave [] for a pruned BART (its two stacks' error swallowed as 'every layer pruned')."""
    model = build("bart")
    mh.prune_heads(model, {0: [1]}, stack="encoder")
    mh.prune_heads(model, {1: [0, 1, 2, 3]}, stack="decoder")
    assert mh.heads.count_heads(model, stack="encoder") == [3, 4]
    assert mh.heads.count_heads(model, stack="decoder") == [4, 0]
    with pytest.raises(ValueError, match=r"the model has 2 self-attention stacks \(encoder, decoder\)"):
        mh.heads.count_heads(model)
    llama = build("llama (GQA)")  # its stack 'decoder', its layers model.layers.N: a layer pruned away still counts
    mh.prune_heads(llama, {1: [0, 1, 2, 3]})
    assert mh.heads.count_heads(llama, stack="decoder") == mh.heads.count_heads(llama) == [4, 0]
