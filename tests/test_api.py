"""The public API as documented: every name reachable from `import multihead as mh`, no function
shadowing a module, and one meaning for a model argument everywhere."""

import importlib
import subprocess
import sys

import pytest
import torch

import multihead as mh

transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")


def test_every_documented_name_is_reachable_from_the_package():
    for name in mh.__all__:
        assert getattr(mh, name) is not None, name
    assert callable(mh.models.build) and callable(mh.viz.head_heatmap) and callable(mh.train.train)
    assert mh.hf.HeadGates is mh.hf.interventions.HeadGates and mh.KVCache is mh.attn.layer.KVCache
    assert mh.models.examples.train_vit_digits and mh.io.write_report_folder
    assert mh.models.build("bert-base", device="meta") is not None


def test_modules_and_functions_do_not_shadow_each_other():
    import multihead.masks

    assert multihead.masks is mh.masks and callable(mh.masks.causal)
    attn = importlib.import_module("multihead.attn")
    assert attn.MultiHeadAttention is mh.MultiHeadAttention
    assert callable(mh.attention) and not isinstance(mh.attention, type(mh))  # the function
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("multihead.attention")  # no module hides behind the function's name


def test_importing_multihead_loads_nothing_heavy():
    code = "import sys, multihead; print(any(m == 'torch' or m.startswith('torch.') for m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "False", done.stderr


def test_a_public_name_stays_the_function_when_its_module_is_imported_first():
    """Packages import their names on first use (multihead.lazy): a function named as its module
    (analysis.compare, analysis.rollout, hf.load) must not turn into the module when the module is
    imported before it is asked for — in a fresh interpreter, where nothing is imported yet."""
    code = ("import sys, types, multihead as mh; import multihead.analysis.compare, multihead.hf.load, "
            "multihead.analysis.rollout; "
            "print([isinstance(f, types.FunctionType) for f in (mh.analysis.compare, mh.compare, mh.hf.load, "
            "mh.analysis.rollout)], isinstance(mh.analysis.report, types.ModuleType), "
            "sorted(set(mh.analysis.__all__) - set(dir(mh.analysis))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "[True, True, True, True] True []", done.stdout + done.stderr
    with pytest.raises(AttributeError, match="has no attribute 'nonsense'"):
        mh.analysis.nonsense  # noqa: B018


#: Bad input the command line answers before torch loads: files, flags, folders, reports, configs.
ANSWERED_LIGHT = [
    ["analyze", "--file", "missing.txt"],
    ["analyze", "--document", "x"],
    ["analyze", "hi", "--what-if", "window=0"],
    ["analyze", "hi", "--out", "/proc/multihead-report"],
    ["analyze", "--conllu", "missing.conllu"],
    ["analyze", "--images", "missing"],
    ["view", "hi", "--report", "missing.json"],
    ["view", "hi", "--out", "page.txt"],
    ["compare", "missing.json", "other.json"],
    ["compare", "empty.json", "empty.json"],
    ["train", "missing.toml"],
    ["train", "typo.toml"],
    ["patch", "--clean", "a"],
    ["analyze", "hi", "--device", "tpu"],
    ["view", "hi", "--max-memory", "cpu=1GiB"],
    ["analyze", "hi", "--device-map", "auto", "--max-memory", "cpu=20furlongs"],
    ["patch", "--example", "ioi", "--device", "cpu", "--device-map", "auto"],
    ["analyze", "--images", "digits", "--out", "foreign"],
    ["analyze", "hi", "--coreference", "refs.jsonl", "--out", "foreign"],
]


@pytest.mark.parametrize("args", ANSWERED_LIGHT, ids=[" ".join(a) for a in ANSWERED_LIGHT])
def test_bad_input_is_answered_before_torch_loads(args, tmp_path):
    (tmp_path / "empty.json").write_text("")
    (tmp_path / "typo.toml").write_text('out = "run"\nstesp = 4\n')
    (tmp_path / "refs.jsonl").write_text("not examples\n")
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("mine\n")  # a folder that holds no report
    code = ("import sys; from multihead.cli import main; status = main(sys.argv[1:]); "
            "print(status, any(m == 'torch' or m.startswith('torch.') for m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.split() == ["2", "False"], done.stdout + done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


ABSENT_DEVICE = [["analyze", "hi", "--device", "cuda:7"], ["view", "hi", "--device", "cuda:7", "--out", "page.html"],
                 ["patch", "--example", "ioi", "--device", "cuda:7"], ["prune", "--device", "cuda:7"]]


@pytest.mark.parametrize("args", ABSENT_DEVICE, ids=[" ".join(a) for a in ABSENT_DEVICE])
def test_a_device_that_is_not_here_is_told_before_the_model_code_loads(args, tmp_path):
    """torch alone says whether a GPU is there: the line comes before transformers (and the model's
    code) is imported — 3.5 → 1.7 s on a CPU machine."""
    if torch.cuda.device_count() > 7:
        pytest.skip("this machine has a cuda:7")
    code = ("import sys; from multihead.cli import main; status = main(sys.argv[1:]); "
            "print(status, 'transformers' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.split() == ["2", "False"], done.stdout + done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "--device 'cuda:7' is not available" in done.stderr, \
        done.stderr


def _tiny_bert():
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=32, max_position_embeddings=32)
    return transformers.BertModel(config).eval()


def test_a_loaded_model_and_its_module_mean_the_same_everywhere(tmp_path):
    module = _tiny_bert()
    loaded = mh.hf.HFModel(module, None, "tiny", tmp_path, False, 2, 4, 4, 32)
    ids = torch.randint(0, 50, (2, 6))
    gates = torch.ones(2, 4)
    gates[1, 2] = 0
    outputs = []
    for model in (loaded, module):
        with torch.no_grad(), mh.hf.HeadGates(model, values=gates):
            outputs.append(module(input_ids=ids).last_hidden_state)
    torch.testing.assert_close(outputs[0], outputs[1])

    def loss_fn(out, batch):
        return out.last_hidden_state.pow(2).mean((1, 2))

    batches = [{"input_ids": ids}]
    a = mh.head_importance(loaded, batches, loss_fn).raw
    b = mh.head_importance(module, batches, loss_fn).raw
    torch.testing.assert_close(a, b)
    assert mh.heads.count_heads(loaded) == mh.heads.count_heads(module) == [4, 4]
    assert mh.prune_heads(loaded, {0: [1]}) is module and mh.heads.count_heads(module) == [3, 4]
    with pytest.raises(TypeError, match=r"mh\.hf\.load\(\.\.\.\) or a torch\.nn\.Module; got str"):
        mh.prune_heads("minilm", {0: [0]})
    with pytest.raises(TypeError, match="analyze needs the model with its tokenizer"):
        mh.analyze(module, ["text"])
