"""Our layer swapped into Hugging Face BERT models, real (all-MiniLM-L6-v2) and tiny random ones."""

from pathlib import Path

import pytest
import torch

import multihead as mh
from conftest import float_tolerance

transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")

SENTENCES = [
    "The animal didn't cross the street because it was too tired.",
    "小明把蛋糕递给小红，因为她不饿了。",
    "Hi.",
    "Multi-head attention lets every head look at the sentence from its own angle, and W^O mixes them.",
]


@pytest.fixture(scope="module")
def minilm_files():
    path = mh.hf.model_path("minilm")
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    return path, tokenizer


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_minilm_with_our_layer_is_the_same_math_as_transformers(minilm_files, impl):
    """In float64 our layer and transformers' agree to rounding (1e-10): the same math. In float32 they
    agree to a tolerance derived from the magnitudes (summation order differs between CPUs and GPUs)."""
    path, tokenizer = minilm_files
    model = transformers.AutoModel.from_pretrained(path, attn_implementation=impl).eval()
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    assert len(set(batch["attention_mask"].sum(1).tolist())) == len(SENTENCES)  # all different lengths
    ours = mh.hf.swap_bert_attention(model)
    adapters = [m for m in ours.modules() if isinstance(m, mh.hf.BertAttentionAdapter)]
    assert len(adapters) == 6 and all(a.attn.num_heads == 12 for a in adapters)
    assert not any(isinstance(m, mh.hf.BertAttentionAdapter) for m in model.modules())  # original untouched
    valid = batch["attention_mask"].bool()
    for dtype in (torch.float64, torch.float32):
        model.to(dtype)
        ours.to(dtype)
        with torch.no_grad():
            want = model(**batch).last_hidden_state[valid]
        atol = 1e-10 if dtype == torch.float64 else float_tolerance(want, ops=512)
        for backend in ("auto", "math", "sdpa"):
            for a in adapters:
                a.attn.backend = backend
            with torch.no_grad():
                got = ours(**batch).last_hidden_state[valid]
            torch.testing.assert_close(got, want, atol=atol, rtol=0, msg=lambda m, d=dtype, b=backend: f"{d} {b}: {m}")


@pytest.mark.slow
def test_minilm_weights_from_our_layer_are_per_head_and_padding_free(minilm_files):
    path, tokenizer = minilm_files
    model = mh.hf.swap_bert_attention(transformers.AutoModel.from_pretrained(path).eval(), inplace=True)
    batch = tokenizer(SENTENCES[:2], padding=True, return_tensors="pt")
    first = next(m for m in model.modules() if isinstance(m, mh.hf.BertAttentionAdapter))
    first.need_weights = True
    seen = []
    first.register_forward_hook(lambda _m, _i, out: seen.append(out[1]))
    with torch.no_grad():
        model(**batch)
    (w,) = seen
    B, T = batch["input_ids"].shape
    assert w.shape == (B, 12, T, T)
    pad = ~batch["attention_mask"].bool()
    assert (w[:, :, :, :][pad[:, None, None, :].expand_as(w)] == 0).all()  # no weight on padding keys
    torch.testing.assert_close(w.sum(-1), torch.ones(B, 12, T))


def _tiny_bert(**overrides):
    config = transformers.BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=4, intermediate_size=32,
        max_position_embeddings=32, **overrides,
    )
    torch.manual_seed(0)
    return config


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_tiny_bert_decoder_with_cross_attention(impl):
    config = _tiny_bert(is_decoder=True, add_cross_attention=True)
    config._attn_implementation = impl
    model = transformers.BertModel(config).eval()
    ours = mh.hf.swap_bert_attention(model)
    kinds = [m.is_cross_attention for m in ours.modules() if isinstance(m, mh.hf.BertAttentionAdapter)]
    assert sorted(kinds) == [False, False, True, True]
    ids = torch.randint(0, 50, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, 5:] = 0
    enc = torch.randn(2, 4, 16)
    enc_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    kwargs = {"input_ids": ids, "attention_mask": mask, "encoder_hidden_states": enc,
              "encoder_attention_mask": enc_mask, "use_cache": False}
    with torch.no_grad():
        want = model(**kwargs).last_hidden_state
        got = ours(**kwargs).last_hidden_state
        # no padding: transformers may leave the causal mask implicit; the adapter must keep it causal
        want_np = model(input_ids=ids, encoder_hidden_states=enc, use_cache=False).last_hidden_state
        got_np = ours(input_ids=ids, encoder_hidden_states=enc, use_cache=False).last_hidden_state
    torch.testing.assert_close(got, want, atol=float_tolerance(want, ops=64), rtol=0)
    torch.testing.assert_close(got_np, want_np, atol=float_tolerance(want_np, ops=64), rtol=0)


def test_training_mode_is_preserved_and_gradients_flow():
    model = transformers.BertModel(_tiny_bert()).train()
    ours = mh.hf.swap_bert_attention(model)
    adapter = next(m for m in ours.modules() if isinstance(m, mh.hf.BertAttentionAdapter))
    assert adapter.training and adapter.attn.training and adapter.attn.dropout == pytest.approx(0.1)
    out = ours(input_ids=torch.randint(0, 50, (2, 5))).last_hidden_state
    out.sum().backward()
    assert adapter.attn.q_proj.weight.grad is not None


def test_swap_refuses_models_without_bert_attention():
    with pytest.raises(ValueError, match="no BERT-style attention"):
        mh.hf.swap_bert_attention(torch.nn.Sequential(torch.nn.Linear(2, 2)))
    with pytest.raises(TypeError, match="BERT-style"):
        mh.hf.attention_from_bert(torch.nn.Linear(2, 2))


def test_model_path_errors_are_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="neither a known name"):
        mh.hf.model_path(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="no config\\.json"):
        mh.hf.model_path(tmp_path)
    custom = tmp_path / "custom"  # a model that is code of its own (auto_map): never run
    custom.mkdir()
    (custom / "config.json").write_text('{"model_type": "xcustom", "auto_map": {"AutoConfig": "conf.XConfig", '
                                        '"AutoModelForCausalLM": "modeling_x.XForCausalLM"}}')
    (custom / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match=r"its model is custom code \(auto_map in config.json\), which multihead "
                                         r"never runs \(trust_remote_code stays off\)") as err:
        mh.hf.load(custom)
    assert "\n" not in str(err.value)


def _hub_cache_of(folder: Path, cache: Path, repo_id: str, revision: str, *, main: bool = True) -> Path:
    """``folder`` as ``hf download`` leaves a model in the Hugging Face cache: its files in ``blobs``
    under their hashes, a snapshot of links to them, and ``refs/main`` naming the snapshot."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir(exist_ok=True)
    for file in folder.iterdir():
        if file.is_file():
            blob = repo / "blobs" / f"{revision[:8]}-{file.name}"
            blob.symlink_to(file.resolve())
            (snapshot / file.name).symlink_to(Path("../../blobs") / blob.name)
    if main:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(revision)
    return snapshot


def test_a_model_id_in_the_local_hugging_face_cache_loads_offline_under_its_id(tmp_path, monkeypatch, minilm):
    """Researchers' models live in the Hugging Face cache (``hf download``, any from_pretrained):
    ``--model org/name`` reads it there, offline, and the report names the id, not the snapshot's
    hash; an id the cache lacks is one line saying where it looked and that nothing is downloaded."""
    from huggingface_hub import constants

    from multihead.hf.paths import model_name

    cache = tmp_path / "hub"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    repo_id, first, second = "sentence-transformers/all-MiniLM-L6-v2", "a" * 40, "b" * 40
    snapshot = _hub_cache_of(mh.hf.model_path("minilm"), cache, repo_id, first)
    assert mh.hf.model_path(repo_id) == snapshot and mh.hf.model_path(f"{repo_id}@{first}") == snapshot
    loaded = mh.hf.load(repo_id)
    assert loaded.name == repo_id and loaded.num_layers == 6
    batch = minilm.tokenizer(["The cat sat on the mat."], return_tensors="pt")
    with torch.no_grad():
        assert torch.equal(loaded.body(**batch).last_hidden_state, minilm.body(**batch).last_hidden_state)
    assert model_name(str(snapshot), snapshot) == repo_id  # the snapshot folder given as a path: its id too
    (cache / f"models--{repo_id.replace('/', '--')}" / "refs" / "main").unlink()
    assert mh.hf.model_path(repo_id) == snapshot  # `hf download --revision HASH` writes no main ref: its only one
    _hub_cache_of(mh.hf.model_path("minilm"), cache, repo_id, second, main=False)
    for held, why in ((repo_id, " and no main ref naming one"), (f"{repo_id}@{'c' * 40}", f", not '{'c' * 40}'")):
        with pytest.raises(FileNotFoundError) as err:  # two snapshots, no main: which? / a revision not there
            mh.hf.model_path(held)
        assert str(err.value) == (f"the local Hugging Face cache ({cache}) holds {repo_id} at 2 revisions "
                                  f"({'a' * 12}, {'b' * 12}){why}: give one as {repo_id}@REVISION"), err.value
    assert mh.hf.model_path(f"{repo_id}@{'a' * 12}") == snapshot  # the revision as the message shows it
    with pytest.raises(FileNotFoundError, match=f"not '{'a' * 6}'"):
        mh.hf.model_path(f"{repo_id}@{'a' * 6}")  # under 7 characters: no prefix taken
    (cache / f"models--{repo_id.replace('/', '--')}" / "refs").mkdir(exist_ok=True)
    (cache / f"models--{repo_id.replace('/', '--')}" / "refs" / "main").write_text("d" * 40)  # a stopped download's
    (cache / f"models--{repo_id.replace('/', '--')}" / "snapshots" / ("b" * 40) / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match=f"its main ref names {'d' * 12}, whose snapshot has no config.json"):
        mh.hf.model_path(repo_id)  # not the only other snapshot, passed over in silence
    for missing in ("someone/not-downloaded", "../escape/x", "a--b/c"):
        with pytest.raises(FileNotFoundError, match="downloads nothing") as err:
            mh.hf.model_path(missing)
        assert str(cache) in str(err.value) and "\n" not in str(err.value)


def test_a_conversion_another_process_finished_first_is_taken_not_refused(tmp_path, monkeypatch):
    """Two processes converting SmolLM2's GGUF at once (pytest-xdist's workers on a fresh machine):
    the one whose conversion another finished first drops its own copy and reads that one — not
    "exists but holds no model"; a folder that really holds something else is still refused."""
    import transformers

    from multihead.hf import paths

    target = tmp_path / "smollm2"

    class Saved:
        def __init__(self, other: bool) -> None:
            self.config, self.hf_quantizer, self.other = type("C", (), {"quantization_config": 1})(), None, other

        def save_pretrained(self, folder, **_) -> None:
            (Path(folder) / "model.safetensors").write_bytes(b"ours")
            if self.other:  # the other process renames its conversion into place meanwhile
                target.mkdir()
                (target / "config.json").write_text("{}")
                (target / "model.safetensors").write_bytes(b"theirs")

    known = paths.KNOWN_MODELS["smollm2"]
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: Saved(False))
    for other in (True, False):
        monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, _o=other, **k: Saved(_o))
        if other:
            paths._convert_gguf(tmp_path, known, target)
            assert (target / "model.safetensors").read_bytes() == b"theirs"
        else:  # a folder of something else, no config.json: refused, nothing of it touched
            (target / "config.json").unlink()
            with pytest.raises(FileExistsError, match="holds no model"):
                paths._convert_gguf(tmp_path, known, target)
            assert (target / "model.safetensors").read_bytes() == b"theirs"
        assert [p.name for p in tmp_path.iterdir()] == ["smollm2"]  # no staging folder left behind
