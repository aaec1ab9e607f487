"""Nothing lost, whatever comes in: a corpus of bad input through the real console script.

Every case runs ``multihead …`` as a user would and must end with exit status 2, exactly one line
on stderr naming the problem (no traceback), and — byte for byte — nothing the user had changed
(no file written, moved, appended to or removed). Hostile content that is *valid* (a report whose
labels are script payloads) must be shown as text. The commit of a multi-file result is killed at
each of its steps by SIGINT, SIGTERM and SIGKILL: the folder ends all old or all new. The report
reader is fuzzed: any JSON value is a report or one line, never a traceback.
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import shlex
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STORED = Path(__file__).parent / "data" / "reports"
SCRIPT = Path(sys.executable).parent / "multihead"
ENV = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")

pytestmark = pytest.mark.slow


def console(args: list[str], cwd: Path, env: dict | None = None, timeout: int = 300,
            as_user: bool = False) -> subprocess.CompletedProcess:
    """``multihead ARGS`` through the installed console script, in ``cwd``; ``as_user``: with file
    permissions enforced even when the suite runs as root (its capabilities to bypass them dropped)."""
    command = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "multihead.cli"]
    command = [*command, *args]
    if as_user and os.geteuid() == 0:
        command = ["capsh", "--drop=cap_dac_override,cap_dac_read_search", "--", "-c", shlex.join(command)]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, env=env or ENV, timeout=timeout)


def snapshot(root: Path) -> dict[str, bytes | tuple | None]:
    """Every path below ``root`` with its bytes (None: a folder; a socket or an unreadable file: its
    mode, size and modification time): what the user had."""
    found: dict[str, bytes | tuple | None] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_dir():
            found[rel] = None
        elif path.is_file() and os.access(path, os.R_OK):
            found[rel] = path.read_bytes()
        else:
            st = path.stat()
            found[rel] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return found


def _report(**change) -> dict:
    """A real report (schema 1, written before the redesign), as a dict, with ``change`` applied."""
    data = json.loads(gzip.decompress((STORED / "minilm-demo.schema1.json.gz").read_bytes()))
    data.update(change)
    return data


def _model(folder: Path, *, weights: str = "safetensors", tokenizer: bool = True) -> Path:
    """A tiny BERT folder as transformers saves it (its tokenizer a word tokenizer)."""
    from architectures import build
    from test_architectures import _word_tokenizer

    model = build("bert")
    model.save_pretrained(folder)
    if weights == "bin":  # transformers 5 always saves safetensors: keep only a pickle, as old folders have
        (folder / "model.safetensors").unlink()
        (folder / "pytorch_model.bin").write_bytes(b"")
    if tokenizer:
        _word_tokenizer(model.config.vocab_size).save_pretrained(folder)
    return folder


class Payload:
    """A pickle that would create a file if it were ever unpickled with code allowed."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _setup(tmp: Path) -> dict[str, Path]:
    """The files and folders the cases read, made once: what the user has."""
    (tmp / "folder").mkdir()
    socket.socket(socket.AF_UNIX).bind(str(tmp / "a-socket"))  # a path that exists and cannot be read as a file
    (tmp / "empty.txt").write_text("\n \n")
    (tmp / "latin1.txt").write_bytes("caf\xe9 na\xefve\n".encode("latin-1"))
    (tmp / "huge.txt").write_text("word " * 300_000 + "\n")  # 1.5 MB on one line: far past 512 tokens
    (tmp / "a-file").write_text("a file, not a folder\n")
    foreign = tmp / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("my notes\n")
    bombed = tmp / "bombed"
    bombed.mkdir()
    (bombed / "report.json").write_text("[" * 100_000 + "]" * 100_000)
    (tmp / "bomb.json").write_text("[" * 100_000 + "]" * 100_000)
    (tmp / "notjson.json").write_text("{not json")
    (tmp / "nokeys.json").write_text(json.dumps({"schema": "multihead.report/2", "model": "m"}))
    (tmp / "badnumber.json").write_text(json.dumps(_report(heads=[
        {"layer": 0, "head": 0, "label": "x", "flags": [], "metrics": {"entropy": "abc"}}])))
    (tmp / "otherschema.json").write_text(json.dumps({"schema": "someone.else/3", "heads": []}))
    (tmp / "good.json").write_text(json.dumps(_report()))
    (tmp / "decoder.json").write_text(json.dumps(_report(causal=True)))  # MiniLM's shape, a decoder's heads
    (tmp / "latin1.conllu").write_bytes("1\tcaf\xe9\t_\t_\t_\t_\t0\troot\t_\t_\n\n".encode("latin-1"))
    _model(tmp / "notokenizer", tokenizer=False)
    novocab = _model(tmp / "novocab", tokenizer=False)  # its tokenizer's config alone: BERT's gives 5 tokens
    (novocab / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
                                                  *(f"w{i}" for i in range(5, 120))]) + "\n")
    import transformers

    transformers.BertTokenizerFast(str(novocab / "vocab.txt")).save_pretrained(novocab)
    (novocab / "tokenizer.json").unlink()
    (novocab / "vocab.txt").unlink()
    truncated = _model(tmp / "truncated")
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:5000])
    unsafe = _model(tmp / "unsafe", weights="bin")
    (unsafe / "pytorch_model.bin").write_bytes(pickle.dumps({"weight": Payload(str(tmp / "PWNED"))}))
    (tmp / "noconfig").mkdir()
    (tmp / "noconfig" / "model.safetensors").write_bytes(b"")
    (tmp / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")  # binary, not text
    (tmp / "empty.json").write_text("")
    (tmp / "exp" / "heads").mkdir(parents=True)  # `experiment heads --out exp` writes exp/heads: the user's
    (tmp / "exp" / "heads" / "notes.txt").write_text("mine\n")
    configs = {"steps-text": 'steps = "ten"\n', "steps-zero": "steps = 0\n", "lr-negative": "[optim]\nlr = -1.0\n",
               "heads-dim": "[model]\nheads = 3\ndim = 16\n", "source": '[data]\nsource = "wiki"\n',
               "abbrev": "[optim]\nlearning_rate = 1.0\n", "top-typo": "stesp = 4\n",
               "precision": '[run]\nprecision = "float16"\n', "device": '[run]\ndevice = "cuda:9"\n'}
    for name, body in configs.items():
        (tmp / f"{name}.toml").write_text(f'out = "{tmp / "never"}"\n{body}')
    (tmp / "not-toml.toml").write_text("out = [1\n")
    (tmp / "out-file.toml").write_text(f'out = "{tmp / "a-file"}"\n')
    (tmp / "out-proc.toml").write_text('out = "/proc/multihead-run"\n')
    (tmp / "latin1.toml").write_bytes('out = "caf\xe9"\n'.encode("latin-1"))
    user = tmp / "U"  # the repro: a folder the user keeps notes and metrics in
    (user / "checkpoint").mkdir(parents=True)
    (user / "checkpoint" / "notes.txt").write_text("notes\n")
    (user / "metrics.jsonl").write_text('{"mine":true}\n')
    for name, out, extra in (("typo-optim", "T1", "[optim]\nlearning_rate = 1e9\n"),
                             ("typo-model", "T2", "[model]\nlayres = 1\n"),
                             ("user-folder", "U", "[run]\ncheckpoint_every = 2\n")):
        (tmp / f"{name}.toml").write_text(f'out = "{tmp / out}"\nsteps = 4\n{extra}')
    return {"tmp": tmp}


#: (name, arguments, words the one stderr line must hold); {tmp} is the folder of _setup.
CASES = [
    ("no command", [], "choose a command"),
    ("unknown command", ["frobnicate"], "invalid choice"),
    ("empty text", ["analyze", "   "], "empty or only whitespace"),
    ("missing --file", ["analyze", "--file", "{tmp}/missing.txt"], "--file {tmp}/missing.txt: no such file"),
    ("--file a folder", ["analyze", "--file", "{tmp}/folder"], "is a folder, expected a file"),
    ("--file a socket", ["analyze", "--file", "{tmp}/a-socket"], "is not a regular file, expected a text file"),
    ("--file not UTF-8", ["analyze", "--file", "{tmp}/latin1.txt"], "is not UTF-8 text"),
    ("--file empty", ["analyze", "--file", "{tmp}/empty.txt"], "has no non-empty line"),
    ("--file huge", ["analyze", "--file", "{tmp}/huge.txt", "--out", "{tmp}/new"],
     "the model takes at most 512 (shorten it or pass --truncate to cut it there)"),
    ("view --file huge", ["view", "--file", "{tmp}/huge.txt", "--out", "{tmp}/h.html"],
     "the model takes at most 512 (view draws whole texts: shorten it)"),
    ("--out a file", ["analyze", "hi", "--out", "{tmp}/a-file"], "exists and is not a folder"),
    ("--out a foreign folder", ["analyze", "hi", "--out", "{tmp}/foreign"], "holds no earlier multihead report.json"),
    ("--out in /proc", ["analyze", "hi", "--out", "/proc/multihead-report"], "cannot be written"),
    ("view --out in /proc", ["view", "hi", "--out", "/proc/multihead.html", "--force"],
     "--out /proc/multihead.html: /proc cannot be written: it is on /proc, the kernel's proc file system"),
    ("--out holds a JSON bomb", ["analyze", "hi", "--out", "{tmp}/bombed"], "holds no earlier multihead report.json"),
    ("--batch-size 0", ["analyze", "hi", "--batch-size", "0"], "must be a positive integer; got 0"),
    ("--batch-size abc", ["analyze", "hi", "--batch-size", "abc"], "must be a positive integer; got 'abc'"),
    ("--sample -1", ["analyze", "--sample", "-1"], "must be an integer >= 0"),
    ("--what-if nonsense", ["analyze", "hi", "--what-if", "window=big"], "--what-if"),
    ("--document without --file", ["analyze", "--document", "x"], "--document reads one --file"),
    ("--images a file", ["analyze", "--images", "{tmp}/a-file"], "is a file, expected a folder of images"),
    ("--conllu not UTF-8", ["analyze", "--conllu", "{tmp}/latin1.conllu"], "latin1.conllu is not UTF-8 text"),
    ("--model nowhere", ["analyze", "hi", "--model", "{tmp}/nowhere"], "neither a known name"),
    ("--model without config", ["analyze", "hi", "--model", "{tmp}/noconfig", "--out", "{tmp}/new"],
     "has no config.json"),
    ("--model without tokenizer", ["analyze", "w5 w6", "--model", "{tmp}/notokenizer", "--out", "{tmp}/new"],
     "no tokenizer in {tmp}/notokenizer"),
    ("--model without a vocabulary", ["prune", "--model", "{tmp}/novocab", "--out", "{tmp}/new"],
     "the tokenizer in {tmp}/novocab knows 5 tokens of the model's 120: its vocabulary file is missing"),
    ("--model truncated weights", ["analyze", "w5 w6", "--model", "{tmp}/truncated", "--out", "{tmp}/new"],
     "model.safetensors cannot be read"),
    ("--model unsafe pickle", ["analyze", "w5 w6", "--model", "{tmp}/unsafe", "--out", "{tmp}/new"],
     "does not load with weights_only=True"),
    ("view --report missing keys", ["view", "hi", "--report", "{tmp}/nokeys.json", "--out", "{tmp}/p.html"],
     "lacks 'heads'"),
    ("view --report JSON bomb", ["view", "hi", "--report", "{tmp}/bomb.json", "--out", "{tmp}/p.html"],
     "nests deeper than 32 levels"),
    ("view --report not JSON", ["view", "hi", "--report", "{tmp}/notjson.json", "--out", "{tmp}/p.html"],
     "not JSON"),
    ("view --report of a decoder", ["view", "hi", "--report", "{tmp}/decoder.json", "--out", "{tmp}/p.html"],
     "--report holds a decoder's (causal) heads ('minilm'); minilm is an encoder: give a report of minilm"),
    ("view --out exists", ["view", "hi", "--out", "{tmp}/a-file"], "should end in .html"),
    ("view --out in a missing folder", ["view", "hi", "--out", "{tmp}/nowhere/p.html"], "does not exist"),
    ("compare a missing report", ["compare", "{tmp}/missing.json", "{tmp}/good.json", "--out", "{tmp}/c"],
     "no such file"),
    ("compare a JSON bomb", ["compare", "{tmp}/bomb.json", "{tmp}/good.json", "--out", "{tmp}/c"],
     "nests deeper than 32 levels"),
    ("compare a report without heads", ["compare", "{tmp}/nokeys.json", "{tmp}/good.json", "--out", "{tmp}/c"],
     "lacks 'heads'"),
    ("compare a metric that is text", ["compare", "{tmp}/badnumber.json", "{tmp}/good.json", "--out", "{tmp}/c"],
     "heads[0].metrics.entropy is 'abc', expected a number or null"),
    ("compare another schema", ["compare", "{tmp}/otherschema.json", "{tmp}/good.json", "--out", "{tmp}/c"],
     "is not a multihead report (schema 'someone.else/3'"),
    ("compare --matching nonsense", ["compare", "{tmp}/good.json", "{tmp}/good.json", "--matching", "x"],
     "invalid choice"),
    ("compare --out a file", ["compare", "{tmp}/good.json", "{tmp}/good.json", "--out", "{tmp}/a-file"],
     "exists and is not a folder"),
    ("train a missing config", ["train", "{tmp}/missing.toml"], "no such config file"),
    ("train a typo in [optim]", ["train", "{tmp}/typo-optim.toml"], "unknown key [optim] 'learning_rate'"),
    ("train a typo in [model]", ["train", "{tmp}/typo-model.toml"], "'layres'; did you mean 'layers'?"),
    ("train into the user's folder", ["train", "{tmp}/user-folder.toml"], "holds no multihead run"),
    ("train --force into the user's folder", ["train", "{tmp}/user-folder.toml", "--force"],
     "U/checkpoint exists and is not this run's"),
    ("prune --per-step 2", ["prune", "--per-step", "2"], "must be in (0, 1]"),
    ("prune --out a foreign folder", ["prune", "--out", "{tmp}/foreign"], "holds no earlier multihead curve.json"),
    ("patch without its texts", ["patch", "--clean", "a"], "give --corrupt, --answer, --wrong"),
    ("patch --example nonsense", ["patch", "--example", "x"], "invalid choice"),
    ("experiment --out a file", ["experiment", "heads", "--out", "{tmp}/a-file"], "exists and is not a folder"),
    ("presets --length 0", ["presets", "--length", "0"], "must be a positive integer"),
    ("--file binary", ["analyze", "--file", "{tmp}/image.png"], "image.png is not UTF-8 text (byte 0)"),
    ("--ablation -1", ["analyze", "--ablation", "-1"], "must be an integer >= 0; got -1"),
    ("--syntax nonsense", ["analyze", "--syntax", "maybe"], "invalid choice: 'maybe'"),
    ("--images a missing folder", ["analyze", "--images", "{tmp}/nowhere"], "no such folder"),
    ("--conllu missing", ["analyze", "--conllu", "{tmp}/nowhere.conllu"],
     "--conllu {tmp}/nowhere.conllu: no such file"),
    ("--coreference missing", ["analyze", "--coreference", "{tmp}/nowhere.jsonl"], "no such file"),
    ("--target missing", ["analyze", "--target", "{tmp}/nowhere.txt"], "--target {tmp}/nowhere.txt: no such file"),
    ("--what-if window=0", ["analyze", "hi", "--what-if", "window=0"], "--what-if: a what-if spec needs window=W"),
    ("--out on /sys", ["analyze", "hi", "--out", "/sys/multihead-report"], "the kernel's sysfs file system"),
    ("view --report missing", ["view", "hi", "--report", "{tmp}/nowhere.json"], "--report {tmp}/nowhere.json: no such"),
    ("view --report another schema", ["view", "hi", "--report", "{tmp}/otherschema.json", "--out", "{tmp}/p.html"],
     "is not a multihead report (schema 'someone.else/3'"),
    ("compare an empty file", ["compare", "{tmp}/empty.json", "{tmp}/good.json", "--out", "{tmp}/c"],
     "the file is empty"),
    ("compare --out a foreign folder", ["compare", "{tmp}/good.json", "{tmp}/good.json", "--out", "{tmp}/foreign"],
     "holds no earlier multihead compare.json"),
    ("train steps as text", ["train", "{tmp}/steps-text.toml"], "steps must be an integer; got 'ten'"),
    ("train steps 0", ["train", "{tmp}/steps-zero.toml"], "steps must be positive; got 0"),
    ("train a negative lr", ["train", "{tmp}/lr-negative.toml"], "[optim] lr must be positive; got -1.0"),
    ("train heads not dividing dim", ["train", "{tmp}/heads-dim.toml"], "model.heads (3) must divide model.dim (16)"),
    ("train an unknown source", ["train", "{tmp}/source.toml"], "data.source must be 'hamlet' or 'treebank'"),
    ("train an abbreviation", ["train", "{tmp}/abbrev.toml"], "'learning_rate'; did you mean 'lr'?"),
    ("train a top-level typo", ["train", "{tmp}/top-typo.toml"], "unknown key 'stesp'; did you mean 'steps'?"),
    ("train not TOML", ["train", "{tmp}/not-toml.toml"], "not valid TOML"),
    ("train in float16", ["train", "{tmp}/precision.toml"], "[run] precision must be one of float32, bfloat16"),
    ("train on a device that is not there", ["train", "{tmp}/device.toml"], "[run] device 'cuda:9' is not available"),
    ("train config not UTF-8", ["train", "{tmp}/latin1.toml"], "latin1.toml is not UTF-8 text"),
    ("train out a file", ["train", "{tmp}/out-file.toml"], "a-file exists and is not a folder"),
    ("train out on /proc", ["train", "{tmp}/out-proc.toml"], "the kernel's proc file system"),
    ("prune --out a file", ["prune", "--out", "{tmp}/a-file"], "exists and is not a folder"),
    ("patch --out a file", ["patch", "--example", "ioi", "--out", "{tmp}/a-file"], "exists and is not a folder"),
    ("patch --out a foreign folder", ["patch", "--example", "ioi", "--out", "{tmp}/foreign"],
     "holds no earlier multihead patching.json"),
    ("--device that is not there", ["analyze", "hi", "--device", "cuda:9"], "--device 'cuda:9' is not available"),
    ("--device not a device", ["analyze", "hi", "--device", "tpu"], "expected auto, cpu, cuda, cuda:N or mps"),
    ("--dtype not a dtype", ["analyze", "hi", "--dtype", "float8"], "invalid choice: 'float8'"),
    ("--device and --device-map", ["analyze", "hi", "--device", "cpu", "--device-map", "auto"],
     "both place the model: give one of them"),
    ("--max-memory without a map", ["analyze", "hi", "--max-memory", "cpu=1GiB"], "give device_map='auto'"),
    ("--max-memory naming a device twice", ["analyze", "hi", "--device-map", "auto", "--max-memory",
                                            "cpu=30MiB,cpu=40MiB"], "--max-memory gives 'cpu' a size twice"),
    ("--max-memory in a wrong unit", ["analyze", "hi", "--device-map", "auto", "--max-memory", "cpu=20furlongs"],
     "expected a size such as 20GiB or 500MB"),
    ("--max-memory too small for one block", ["analyze", "hi", "--device-map", "auto", "--max-memory", "cpu=1MiB"],
     "gives no device room for the largest block of minilm"),
    ("--offload-folder in /proc", ["analyze", "hi", "--device-map", "auto", "--max-memory", "cpu=10MiB",
                                   "--offload-folder", "/proc/multihead-offload"], "the kernel's proc file system"),
    ("--offload-folder inside --out", ["analyze", "hi", "--device-map", "auto", "--offload-folder", "{tmp}/rep/off",
                                       "--out", "{tmp}/rep"],
     "--offload-folder {tmp}/rep/off is inside --out {tmp}/rep"),
    ("--offload-folder as patch's --out", ["patch", "--example", "ioi", "--device-map", "auto", "--offload-folder",
                                           "{tmp}/p", "--out", "{tmp}/p"], "choose an offload folder outside it"),
    ("view on a device that is not there", ["view", "hi", "--device", "cuda:9", "--out", "{tmp}/v.html"],
     "--device 'cuda:9' is not available"),
    ("patch on a device that is not there", ["patch", "--example", "ioi", "--device", "cuda:9"],
     "--device 'cuda:9' is not available"),
    ("prune an offloaded model", ["prune", "--device-map", "auto", "--offload-folder", "{tmp}/offload"],
     "accelerate keeps part of this model offloaded"),
    ("experiment nonsense", ["experiment", "nonsense"], "invalid choice: 'nonsense'"),
    ("experiment into a foreign folder", ["experiment", "heads", "--out", "{tmp}/exp"],
     "{tmp}/exp/heads is not empty and holds no earlier multihead result.json"),
]


@pytest.fixture(scope="module")
def user_files(tmp_path_factory):
    return _setup(tmp_path_factory.mktemp("bad"))["tmp"]


@pytest.mark.parametrize(("name", "args", "words"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2_and_nothing_of_the_users_changes(name, args, words, user_files):
    tmp = user_files
    before = snapshot(tmp)
    done = console([a.format(tmp=tmp) for a in args], cwd=tmp)
    # a run past its first 10 s (a loaded machine: MiniLM's load took 6.2 s, then 300,000 tokens) has said
    # its progress first ("multihead: loading minilm …"): the error is still the one line of its own
    progress = ("…", " left")  # "multihead: loading minilm …", "… 1 of 2 batches in 37 s, about 37 s left"
    lines = [line for line in done.stderr.strip().splitlines() if not (
        line.startswith("multihead: ") and (line.endswith(progress) or ": done in " in line))]
    assert done.returncode == 2, (name, done.returncode, done.stderr[-2000:])
    assert len(lines) == 1 and "Traceback" not in done.stderr, (name, done.stderr[-2000:])
    assert words.format(tmp=tmp) in lines[0], (name, lines[0])
    assert snapshot(tmp) == before, name  # byte for byte: nothing written, moved, appended or removed
    assert not (tmp / "PWNED").exists()  # the unsafe pickle was never unpickled


def test_hostile_reports_are_shown_as_text(tmp_path):
    """A valid report whose every string is a script payload: view and compare show it as text."""
    hostile = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    data = _report(model=hostile)
    for h in data["heads"]:
        h["label"] = hostile
    (tmp_path / "hostile.json").write_text(json.dumps(data))
    (tmp_path / "folder").mkdir()  # a report folder, as analyze --out writes it: view takes it as compare does
    (tmp_path / "folder" / "report.json").write_text(json.dumps(data))
    done = console(["view", "Heads look.", "--report", str(tmp_path / "folder"), "--out",
                    str(tmp_path / "page.html")], cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    # another model's report is said to be one (its name as a literal: no control character reaches a terminal)
    assert "--report was made for '<script>" in done.stderr and "not minilm: its labels are drawn over" in done.stderr
    page = (tmp_path / "page.html").read_text(encoding="utf-8")
    assert hostile not in page and "<img src=x" not in page and "\\u003cscript\\u003e" in page
    (tmp_path / "good.json").write_text(json.dumps(_report()))
    done = console(["compare", str(tmp_path / "hostile.json"), str(tmp_path / "good.json"), "--out",
                    str(tmp_path / "c")], cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    page = (tmp_path / "c" / "compare.html").read_text(encoding="utf-8")
    assert hostile not in page and "&lt;script&gt;" in page and "<script" not in page



def test_unreadable_and_read_only_paths_are_one_line(tmp_path):
    """A file the user cannot read, and an output folder on which they cannot write: refused at the
    door (before any model is loaded), naming the path."""
    if os.geteuid() == 0 and shutil.which("capsh") is None:  # root reads and writes through any permission
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("CI=true but capsh is missing: make permissions installs it (libcap2-bin)")
        pytest.skip("as root, permissions are enforced only through capsh (make permissions)")
    secret = tmp_path / "secret.txt"
    secret.write_text("hi\n")
    secret.chmod(0)
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        before = snapshot(tmp_path)
        for args, words in ((["analyze", "--file", str(secret)], f"cannot read --file {secret}: permission denied"),
                            (["analyze", "hi", "--out", str(locked / "r")], f"{locked / 'r'} cannot be written"),
                            # the page too: its folder named with a way out, not the temporary file it failed on
                            (["view", "hi", "--out", str(locked / "p.html")],
                             f"--out {locked / 'p.html'}: {locked} cannot be written (Permission denied): choose a "
                             "folder on a writable file system")):
            done = console(args, cwd=tmp_path, as_user=True)
            lines = done.stderr.strip().splitlines()
            assert done.returncode == 2 and len(lines) == 1 and words in lines[0], done.stderr[-2000:]
        assert snapshot(tmp_path) == before
    finally:
        secret.chmod(0o644)
        locked.chmod(0o755)

def test_train_owns_only_what_it_made(tmp_path):
    """A resumed run keeps one log (never appended across runs, no step twice); another run's
    folder, and a truncated or empty checkpoint, are one line each and change nothing."""
    config = tmp_path / "run.toml"
    base = ('out = "{out}"\nseed = 1\nsteps = {steps}\n[model]\nlayers = 1\nheads = 2\ndim = 16\nhidden = 32\n'
            '[data]\nseq_len = 16\nbatch_size = 4\n[run]\ncheckpoint_every = 2\nlog_every = 1\n')
    config.write_text(base.format(out=tmp_path / "run", steps=4))
    assert console(["train", str(config)], cwd=tmp_path).returncode == 0
    log = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in log] == [0, 1, 2, 3]
    config.write_text(base.format(out=tmp_path / "run", steps=6))  # the same run, further: resumed at step 4
    assert console(["train", str(config)], cwd=tmp_path).returncode == 0
    log = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in log] == [0, 1, 2, 3, 4, 5]
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["checkpoint", "metrics.jsonl", "run.json"]
    other = tmp_path / "other.toml"
    other.write_text(base.format(out=tmp_path / "run", steps=6).replace("dim = 16", "dim = 32"))
    before = snapshot(tmp_path)
    done = console(["train", str(other)], cwd=tmp_path)
    assert done.returncode == 2 and "holds another run (its model.dim is 16, this config's 32)" in done.stderr
    assert snapshot(tmp_path) == before
    state = tmp_path / "run" / "checkpoint" / "state.pt"
    weights = tmp_path / "run" / "checkpoint" / "model.safetensors"
    config.write_text(base.format(out=tmp_path / "run", steps=8))
    for path, cut in ((state, 100), (state, 0), (weights, 5000), (weights, -1000)):
        whole = path.read_bytes()
        path.write_bytes(whole[:cut])  # the header whole, tensors cut (-1000); the header cut (5000)
        before = snapshot(tmp_path)
        done = console(["train", str(config)], cwd=tmp_path)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
        assert f"{path} cannot be resumed from" in lines[0], lines[0]
        assert snapshot(tmp_path) == before
        path.write_bytes(whole)
    # a state that pickles objects: refused unread, its reason ours (torch's was ANSI-coloured advice on
    # how to load it unsafely, cut mid-sentence)
    import torch

    whole = state.read_bytes()
    torch.save({"step": Payload(str(tmp_path / "PWNED"))}, state)
    before = snapshot(tmp_path)
    done = console(["train", str(config)], cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        f"multihead train: error: {state} cannot be resumed from: it is truncated or not a multihead checkpoint (it "
        "pickles objects beyond tensors and numbers, which a safe load (weights_only) refuses); move the checkpoint "
        "away or start a new folder"], done.stderr
    assert snapshot(tmp_path) == before and not (tmp_path / "PWNED").exists()
    state.write_bytes(whole)


# --- the commit of a result folder, stopped at each of its steps ---------------------------------


def _compare_folder(tmp: Path, a: str, b: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return console(["compare", str(tmp / a), str(tmp / b), "--out", str(tmp / "c"), "--different-corpora"],
                   cwd=tmp, env=env)


def _generation(folder: Path) -> set[str]:
    """Which comparison each file of the folder holds (by the name of its report A)."""
    found = set()
    for name in ("compare.json", "compare.html"):
        text = (folder / name).read_text(encoding="utf-8")
        found.add("old" if "old-a.json" in text else "new" if "new-a.json" in text else "?")
    return found


@pytest.mark.parametrize("stop", ["SIGINT", "SIGTERM", "SIGHUP", "SIGKILL"])
def test_a_result_folder_ends_all_old_or_all_new_whatever_stops_its_commit(stop, tmp_path):
    for name in ("old-a.json", "new-a.json", "b.json"):
        (tmp_path / name).write_text(json.dumps(_report()))
    assert _compare_folder(tmp_path, "old-a.json", "b.json").returncode == 0
    old = {path.name: path.read_bytes() for path in (tmp_path / "c").iterdir()}
    # steps: 1 every file staged, 2 the manifest written (the commit point), 3-4 each rename, 5 done
    for step in range(1, 6):
        shutil.rmtree(tmp_path / "c")  # the old folder again, as the first run wrote it
        (tmp_path / "c").mkdir()
        for name, content in old.items():
            (tmp_path / "c" / name).write_bytes(content)
        env = dict(ENV, MULTIHEAD_FAULT_AT_COMMIT=f"{step}:{stop}")
        done = _compare_folder(tmp_path, "new-a.json", "b.json", env=env)
        if stop == "SIGKILL":
            assert done.returncode == -signal.SIGKILL
            from multihead.files import recover

            recover(tmp_path / "c")  # what the next writer or reader of the folder does first
        else:
            assert done.returncode == {"SIGINT": 130, "SIGTERM": 143, "SIGHUP": 129}[stop], (step, done.stderr)
            words = {"SIGINT": "interrupted", "SIGTERM": "terminated (SIGTERM)", "SIGHUP": "hung up (SIGHUP)"}[stop]
            assert done.stderr.strip().splitlines() == ["multihead compare: " + words]
        want = {"old"} if step == 1 else {"new"}  # before the commit point: the old; after: the new, whole
        assert _generation(tmp_path / "c") == want, (stop, step)
        assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["compare.html", "compare.json"], step


def test_a_report_folder_killed_mid_commit_is_repaired_by_the_next_run(tmp_path):
    """SIGKILL between the renames of report.json, report.csv and report.html: the next analyze
    into the folder finds the manifest, finishes the commit, and writes over a whole report."""
    out = tmp_path / "r"
    args = ["analyze", "Heads look at words.", "--out", str(out), "--ablation", "0", "--syntax", "off",
            "--no-coreference"]
    assert console(args, cwd=tmp_path).returncode == 0
    old = snapshot(out)
    done = console([*args[:1], "Other words, other heads.", *args[2:]], cwd=tmp_path,
                   env=dict(ENV, MULTIHEAD_FAULT_AT_COMMIT="4:SIGKILL"))  # after the first two renames
    assert done.returncode == -signal.SIGKILL
    assert (out / ".multihead-commit.json").is_file()  # recognisable: the commit's manifest
    from multihead.files import recover

    recover(out)
    new = snapshot(out)
    assert set(new) == set(old) and all(new[k] != old[k] for k in ("report.json", "report.html"))
    assert json.loads(new["report.json"])["sentences"] == 1 and b"Other words" in new["report.html"]


def _check_many(out: str, times: int) -> str:
    from multihead.files import check_output_folder

    for _ in range(times):
        check_output_folder(out, schema="multihead.report/2", marker="report.json")
    return "ok"


def test_ranks_checking_one_new_folder_at_once_do_not_remove_it_under_each_other(tmp_path):
    """torchrun's ranks check the same new --out at once (each before its model loads): no rank's
    probe may take the folder from under another's (it once failed "File exists" one run in ten),
    and nothing is left behind — not the folder, not a probe."""
    from concurrent.futures import ProcessPoolExecutor

    out = tmp_path / "a" / "b" / "report"
    with ProcessPoolExecutor(4) as pool:
        assert list(pool.map(_check_many, [str(out)] * 4, [200] * 4)) == ["ok"] * 4
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "b").write_text("a file where a folder is wanted")
    from multihead.files import OutputFolderError, check_writable

    with pytest.raises(OutputFolderError, match="cannot be written"):
        check_writable(out)
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["b"]


def test_a_full_disk_leaves_no_partial_or_empty_folder(tmp_path, capsys, monkeypatch):
    """The disk fills while the report is written: one line naming the file, the earlier report (or
    no folder at all) left as it was."""
    import errno

    from conftest import run_cli
    from multihead import files

    written = []
    real = files._write

    def full(tmp, content, newline=True):
        if written:  # the first file fits, the second does not
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        written.append(tmp)
        real(tmp, content, newline)

    monkeypatch.setattr(files, "_write", full)
    args = ["analyze", "Heads look.", "--ablation", "0", "--syntax", "off", "--no-coreference", "--out"]
    code, _, err = run_cli([*args, str(tmp_path / "new")], capsys)
    assert code == 2 and "No space left on device" in err and str(tmp_path / "new" / "report.") in err, err
    assert not (tmp_path / "new").exists()  # made for the report, removed again
    monkeypatch.setattr(files, "_write", real)
    assert run_cli([*args, str(tmp_path / "old")], capsys)[0] == 0
    before = snapshot(tmp_path / "old")
    written.clear()
    monkeypatch.setattr(files, "_write", full)
    code, _, err = run_cli([*args, str(tmp_path / "old")], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert snapshot(tmp_path / "old") == before  # the earlier report, whole; no temporary file left


# --- the report reader, fuzzed -------------------------------------------------------------------


def test_the_report_reader_answers_any_json_with_a_report_or_one_line(tmp_path):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from multihead.analysis.compare import compare
    from multihead.analysis.report import Report
    from multihead.render import analyze_text, report_html

    keys = st.sampled_from(["schema", "model", "causal", "num_layers", "num_heads", "sentences", "tokens",
                            "heads", "sections", "layer", "head", "label", "flags", "metrics", "stacks",
                            "redundancy", "evidence", "syntax", "typical", "corpus", "x"])
    scalars = st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=False) | st.text(max_size=8)
    values = st.recursive(scalars | st.sampled_from(["multihead.report/1", "multihead.report/2"]),
                          lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=6),
                          max_leaves=30)
    real = json.loads(gzip.decompress((STORED / "minilm-demo.schema1.json.gz").read_bytes()))
    real_keys = sorted(real)
    seen, parsed = [], []

    @settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(st.one_of(values, st.tuples(st.sampled_from(real_keys), values)))
    def check(value):
        if isinstance(value, tuple):  # a real report with one of its parts replaced by anything
            key, part = value
            value = {**real, key: part}
        seen.append(1)
        path = tmp_path / "r.json"
        path.write_text(json.dumps(value), encoding="utf-8")
        try:
            report = Report.from_json(path)
        except ValueError as err:
            assert "\n" not in str(err) and str(path) in str(err), str(err)
            return
        parsed.append(1)  # a report: every reader of one takes it (the terminal, the page, compare)
        analyze_text(report)
        report_html(report)
        compare(report, report)

    check()
    assert len(seen) >= 400 and parsed  # some of the generated inputs were reports, and went all the way
    print(f"{len(seen)} inputs generated, {len(parsed)} of them reports")


def test_a_warning_is_one_line_named_by_the_command(tmp_path):
    """Python warnings reach the user as ``multihead COMMAND: warning: ...``, one line each (the
    issue's repro printed the list ``['multihead analyze']``)."""
    done = console(["analyze", "研究注意力机制的多头结构。", "The heads.", "--out", str(tmp_path / "r"),
                    "--ablation", "0", "--syntax", "off", "--no-coreference"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    warned = [line for line in done.stderr.splitlines() if "warning:" in line]
    assert len(warned) == 1 and warned[0].startswith("multihead analyze: warning: ") and "unknown to the tokenizer" \
        in warned[0], done.stderr


def test_view_warns_on_unknown_tokens_as_analyze_does(tmp_path):
    """MiniLM's WordPiece knows few Chinese characters: the page is drawn, and stderr says, in one
    line, how much of the text is [UNK] (issue 28)."""
    done = console(["view", "研究注意力机制的人越来越多了", "--out", str(tmp_path / "page.html")], cwd=tmp_path)
    assert done.returncode == 0 and (tmp_path / "page.html").is_file(), done.stderr[-2000:]
    warned = [line for line in done.stderr.splitlines() if "warning:" in line]
    assert len(warned) == 1 and warned[0].startswith("multihead view: warning: 79% of the 14 tokens are unknown")
    assert "above 5% the page's maps show how the model treats [UNK]" in warned[0]  # view computes no statistics


def test_a_transformers_older_than_the_tested_floor_is_one_line(monkeypatch, cli_rejects):
    """transformers 4.x lacks what the routing registers with (hf/version.py): said in one line where a
    model of theirs comes in — loading one, wrapping one, routing one — not as failures further on."""
    import transformers

    import multihead as mh
    from multihead.hf import version

    monkeypatch.setattr(transformers, "__version__", "4.57.6")
    with pytest.raises(ImportError, match=r"needs transformers >= 5\.17 .* has 4\.57\.6: pip install -U"):
        mh.hf.load("minilm")
    with pytest.raises(ImportError, match=r"4\.57\.6"):
        version.require_transformers()
    cli_rejects("analyze", [(["--model", "minilm"], "needs transformers >= 5.17")])
    monkeypatch.setattr(transformers, "__version__", "5.17.0.dev0")
    version.require_transformers()  # the floor itself, a development build of it too


def test_files_a_library_writes_get_the_mode_every_other_output_gets(tmp_path):
    """safetensors writes its files 0600: a pruned model's weights (and a checkpoint's) were unreadable
    to anyone but their owner beside their 0644 JSON. Staged or atomic, a file ends with the mode a new
    file gets here (0666 less the umask)."""
    from multihead.files import StagedFiles, atomic_path

    old = os.umask(0o027)
    try:
        with StagedFiles() as staged:
            tmp = staged.stage(tmp_path / "weights.bin")
            tmp.write_bytes(b"x")
            os.chmod(tmp, 0o600)  # as safetensors leaves it
            staged.stage(tmp_path / "record.json", "{}")
            staged.commit()
        with atomic_path(tmp_path / "alone.bin") as tmp:
            tmp.write_bytes(b"y")
            os.chmod(tmp, 0o600)
    finally:
        os.umask(old)
    for name in ("weights.bin", "record.json", "alone.bin"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o640, name


def test_a_text_too_long_is_refused_with_the_remedy_the_caller_has(minilm):
    """analyze can cut a text (truncate=True); text_views cannot, and once offered it anyway."""
    import multihead as mh
    from multihead.analysis.pipelines.common import TooLongError

    long = "word " * 600
    with pytest.raises(TooLongError, match=r"^text 1 has 602 tokens; the model takes at most 512 \(shorten it or "
                                           r"pass truncate=True to cut it there\)$"):
        mh.analyze(minilm, [long], coreference=False)
    with pytest.raises(TooLongError, match=r"^text 1 has 602 tokens; the model takes at most 512 \(shorten it\)$"):
        mh.analysis.text_views(minilm, [long])


def test_a_reader_that_leaves_the_pipe_is_not_an_error(tmp_path):
    """`multihead compare A B | head`: 'error: [Errno 32] Broken pipe', exit 2, its results written."""
    for name in ("a.json", "b.json"):
        (tmp_path / name).write_text(json.dumps(_report()))
    proc = subprocess.Popen([sys.executable, "-m", "multihead.cli", "compare", str(tmp_path / "a.json"),
                             str(tmp_path / "b.json"), "--out", str(tmp_path / "c")], cwd=tmp_path, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader gone before a line is printed
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 141 and err == "", err  # a pipe writer's SIGPIPE status, and not a word
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["compare.html", "compare.json"]
