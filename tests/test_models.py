"""Blocks, models and the model table's presets (issue: transformer models)."""


import pytest
import torch

from conftest import float_tolerance, run_cli
from multihead.models import PRESETS, DecoderLM, EncoderBlock, EncoderDecoder, ModelConfig, build, count_parameters


@pytest.mark.parametrize("name", list(PRESETS))
def test_presets_reproduce_the_published_parameter_counts(name):
    model = build(name, device="meta")
    n = count_parameters(model)
    assert abs(n - PRESETS[name].published) / PRESETS[name].published < 0.035, (name, n)
    assert all(p.device.type == "meta" for p in model.parameters())


def test_exact_counts_of_known_architectures():
    assert count_parameters(build("bert-base", device="meta")) == 109_482_240  # bert-base-uncased
    assert count_parameters(build("gpt2-small", device="meta")) == 124_439_808  # GPT-2 "124M"


def test_gpt3_175b_is_built_without_memory():
    model = build("gpt3-175b", device="meta")
    assert count_parameters(model) > 174e9
    # every parameter and buffer lives on the meta device: shapes only, no storage was allocated
    assert all(t.is_meta for t in (*model.parameters(), *model.buffers()))


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_encoder_block_equals_torch_transformer_encoder_layer(norm_first, activation):
    torch.manual_seed(0)
    theirs = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, activation=activation, batch_first=True,
                                              norm_first=norm_first).eval()
    ours = EncoderBlock(32, 4, 64, dropout=0.0, activation=activation, norm_first=norm_first).eval()
    with torch.no_grad():
        import multihead as mh

        ours.attn.load_state_dict(mh.MultiHeadAttention.from_torch(theirs.self_attn).state_dict())
        ours.ffn.up.load_state_dict(theirs.linear1.state_dict())
        ours.ffn.down.load_state_dict(theirs.linear2.state_dict())
        ours.norm1.load_state_dict(theirs.norm1.state_dict())
        ours.norm2.load_state_dict(theirs.norm2.state_dict())
    x = torch.randn(2, 7, 32)
    pad = torch.tensor([[False] * 7, [False] * 5 + [True] * 2])  # torch: True = padding
    want = theirs(x, src_key_padding_mask=pad)
    got = ours(x, mh.masks.key_padding(~pad))
    keep = ~pad
    torch.testing.assert_close(got[keep], want[keep], atol=float_tolerance(want[keep], ops=512), rtol=1e-5)


def test_small_models_run_forward_and_backward_and_checkpointing_keeps_gradients():
    torch.manual_seed(0)
    config = ModelConfig("decoder", 2, 4, 32, 64, vocab=50, max_len=16, norm_first=True, dropout=0.0)
    lm = DecoderLM(config)
    ids = torch.randint(0, 50, (2, 9))
    logits = lm(ids)
    assert logits.shape == (2, 9, 50)
    torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:]).backward()
    plain = {n: p.grad.clone() for n, p in lm.named_parameters()}
    lm.zero_grad()
    for block in lm.layers:
        block.checkpoint = True
    lm.train()
    torch.nn.functional.cross_entropy(lm(ids)[:, :-1].transpose(1, 2), ids[:, 1:]).backward()
    for n, p in lm.named_parameters():
        torch.testing.assert_close(p.grad, plain[n], atol=1e-6, rtol=1e-5, msg=n)
    # causal: a later token does not change earlier logits
    changed = ids.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 50
    lm.eval()
    torch.testing.assert_close(lm(changed)[:, :-1], lm(ids)[:, :-1])
    ed = EncoderDecoder(ModelConfig("encoder-decoder", 2, 4, 32, 64, vocab=50, positions="sinusoidal", dropout=0.0))
    assert ed(torch.randint(0, 50, (2, 6)), ids).shape == (2, 9, 50)
    with pytest.raises(ValueError, match="at most 16"):
        lm(torch.randint(0, 50, (1, 17)))


def test_cli_presets_prints_the_table(capsys):
    code, out, err = run_cli(["presets", "--length", "512"], capsys)
    assert code == 0, err
    assert "| gpt3-175b | 96 | 96 | 12288 | 128 | 174.60B | 175.00B |" in out
    assert "| bert-base | 12 | 12 | 768 | 64 | 109.5M | 110.0M |" in out


@pytest.mark.slow
def test_minilm_weights_in_our_encoder_give_the_same_hidden_states():
    import multihead as mh
    from multihead.models import encoder_from_bert

    hf = mh.hf.load("minilm")
    ours = encoder_from_bert(hf.model).eval()
    batch = hf.tokenizer(["The animal didn't cross the street because it was too tired.", "Heads specialise."],
                         padding=True, return_tensors="pt")
    with torch.no_grad():
        want = hf.model(**batch).last_hidden_state
        got = ours(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    keep = batch["attention_mask"].bool()
    torch.testing.assert_close(got[keep], want[keep], atol=float_tolerance(want[keep], ops=512), rtol=1e-4)
    assert count_parameters(ours) == sum(p.numel() for p in hf.model.parameters())
    # and the analysis sees our encoder's heads like the original's
    ours_model = mh.hf.HFModel(ours, hf.tokenizer, "minilm-ours", hf.path, False, 6, 12, 12, 512)
    texts = ["The animal didn't cross the street because it was too tired.", "Heads specialise."]
    a = mh.analyze(ours_model, texts, coreference=False, redundancy=False)
    b = mh.analyze(hf, texts, coreference=False, redundancy=False)
    for x, y in zip(a.heads, b.heads, strict=True):
        assert x.label == y.label and x.metrics["entropy"] == pytest.approx(y.metrics["entropy"], abs=1e-4)


@pytest.mark.slow
def test_vision_transformer_learns_digits():
    from multihead.models.examples import VisionTransformer, train_vit_digits

    vit = VisionTransformer()
    img = torch.arange(64.0).view(1, 8, 8)
    patches = vit.patches(img)
    assert patches.shape == (1, 16, 4) and patches[0, 1].tolist() == [2.0, 3.0, 10.0, 11.0]
    result = train_vit_digits(epochs=12)
    assert result["test_accuracy"] > 0.85, result  # chance is 0.10


def test_graph_transformer_separates_the_karate_club_from_two_labels():
    from multihead.models.examples import train_graph_karate

    result = train_graph_karate()
    assert result["accuracy"] > 0.75, result  # 32 unlabelled members; chance 0.5


def test_sequential_recommender_beats_most_popular():
    from multihead.models.examples import behaviour_log, train_recommender

    log = behaviour_log(users=4, length=6)
    assert log.shape == (4, 6) and int(log.max()) < 60
    result = train_recommender()
    assert result["hit_rate_at_10"] > 0.7 and result["hit_rate_at_10"] > result["popular_baseline"] + 0.3, result


def test_kv_cache_generation_equals_recomputing_the_whole_sequence():
    torch.manual_seed(0)
    lm = DecoderLM(ModelConfig("decoder", 2, 4, 32, 64, vocab=40, max_len=32, norm_first=True, dropout=0.0)).eval()
    prompt = torch.randint(0, 40, (3, 5))
    with_cache = lm.generate(prompt, 10)
    without = lm.generate(prompt, 10, use_cache=False)
    assert with_cache.shape == (3, 15) and torch.equal(with_cache, without)
    from multihead.attn import KVCache

    cache = [KVCache() for _ in lm.layers]
    with torch.no_grad():
        lm(with_cache[:, :14], cache=cache)
        step = lm(with_cache[:, 14:15], cache=cache)[:, -1]
        full = lm(with_cache)[:, -1]
    torch.testing.assert_close(step, full, atol=float_tolerance(full, ops=512), rtol=1e-5)
    assert len(cache[0]) == 15
    with pytest.raises(ValueError, match="KV cache is for self-attention"):
        lm.layers[0].attn(torch.randn(1, 2, 32), torch.randn(1, 3, 32), cache=KVCache())


def test_rotary_scores_depend_only_on_relative_position_and_cache_agrees():
    from multihead.attn.layer import rotate

    torch.manual_seed(0)
    q, k = torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    scores = rotate(q) @ rotate(k).transpose(-1, -2)
    shifted = rotate(q, 17) @ rotate(k, 17).transpose(-1, -2)
    torch.testing.assert_close(scores, shifted, atol=float_tolerance(shifted, ops=512), rtol=1e-5)
    assert not torch.allclose(scores, q @ k.transpose(-1, -2))
    torch.testing.assert_close(rotate(q).norm(dim=-1), q.norm(dim=-1))  # a rotation
    lm = DecoderLM(ModelConfig("decoder", 2, 4, 32, 64, vocab=40, max_len=32, positions="rotary", norm_first=True,
                               dropout=0.0)).eval()
    assert lm.embeddings.positions is None and all(block.attn.rotary for block in lm.layers)
    prompt = torch.randint(0, 40, (2, 4))
    assert torch.equal(lm.generate(prompt, 8), lm.generate(prompt, 8, use_cache=False))
    with pytest.raises(ValueError, match="positions must be"):
        DecoderLM(ModelConfig("decoder", 1, 2, 8, 16, vocab=5, positions="alibi"))


@pytest.mark.slow
def test_keyword_spotter_hears_a_voice_it_never_heard():
    import os
    import shutil

    from multihead.models import speech

    if shutil.which("espeak-ng") is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("CI=true but espeak-ng is missing: make speech installs it")
        pytest.skip("espeak-ng not installed (make speech)")
    wave, rate = speech.synthesize("stop", "en", 160)
    assert rate > 8000 and len(wave) > rate // 10 and abs(wave).max() > 0.05
    features = speech.log_mel(wave, rate)
    assert features.shape[1] == speech.N_MELS and 10 < features.shape[0] < 200 and torch.isfinite(features).all()
    data = speech.spoken_keywords(speeds=(130, 190), pitches=(50,))
    assert len(data.features) == 7 * len(speech.KEYWORDS) * 2
    result = speech.train_keyword_spotter(data=data, epochs=12)
    assert result["test_accuracy"] > 4 * result["chance"]  # a held-out voice, 10 words
    from multihead.analysis.pipelines.speech import speech_report

    report = speech_report(result)
    assert (report.num_layers, report.num_heads) == (2, 4) and report.sentences == len(speech.KEYWORDS) * 2
    assert all(0 <= r.metrics["cls"] <= 1 and r.metrics["entropy_norm"] <= 1 + 1e-6 for r in report.heads)
