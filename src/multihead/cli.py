"""The ``multihead`` command line: each command parses its arguments, makes one library call
(:mod:`multihead.jobs`) and one render call (:mod:`multihead.render.text`).

Every user error exits with status 2 and a one-line message, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import warnings
from collections.abc import Callable
from typing import NoReturn

from .collector import old_objects_frozen

__all__ = ["main"]


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


def main(argv: list[str] | None = None) -> int:
    code, command = _main(argv)
    if command == "train":  # a torchrun rank of it ends without the interpreter's teardown, whatever its status
        from .stops import end_rank

        return end_rank(code)
    return code


def _main(argv: list[str] | None) -> tuple[int, str | None]:
    """The command's exit status, and the command."""
    # transformers' own notices ("Token indices sequence length is longer than ...") are not for
    # our users: we check lengths ourselves and say so in one line.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from .stops import interrupted, stopped, stopping_on_signals

    name = ["multihead"]
    command = None
    previous = _one_line_warnings(name)
    # Ctrl-C and SIGTERM are ours from the first moment (``import multihead`` loads nothing heavy):
    # either stops the run with one line, and nothing half-written is committed.
    with stopping_on_signals():
        try:
            parser = _parser()
            args = parser.parse_args(argv)
            if not getattr(args, "command", None):
                commands = ", ".join(parser._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
                print(f"multihead: error: choose a command: {commands} (see multihead --help)", file=sys.stderr)
                return 2, None
            command = args.command
            name[0] = f"multihead {command}"
            from . import progress

            # under torchrun one rank says how the run goes (each said every line, with its own estimates)
            progress.set_enabled(not getattr(args, "quiet", False) and os.environ.get("RANK", "0") == "0")
            # the collector's full scans leave out what is alive as the job goes on (its imports, its model)
            with old_objects_frozen():
                return int(args.run(args) or 0), command
        except BrokenPipeError:
            # stdout's reader left (`multihead compare … | head`): the results are written; stdout goes
            # nowhere from here (the interpreter's last flush into the pipe would fail again), and the
            # exit status is the one a pipe's writer gets from SIGPIPE, as `cat` and `grep` end
            with contextlib.suppress(OSError, ValueError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 128 + 13, command
        except (ValueError, TypeError, OSError, ImportError, MemoryError) as err:  # MemoryError: a plan refused
            if not interrupted.is_set():
                with contextlib.suppress(OSError):  # stderr gone (a closed terminal): the status says it
                    print(f"{name[0]}: error: {_one_line(err)}", file=sys.stderr)
                return 2, command
            # else: a library turned our interrupt into another error
        except KeyboardInterrupt:
            pass
        finally:
            warnings.showwarning = previous
        words, status = stopped()
        with contextlib.suppress(OSError):  # SIGHUP: the terminal the line was for is gone
            print(f"{name[0]}: {words}", file=sys.stderr)
        return status, command


def _one_line(err: BaseException) -> str:
    """The error's message as one line (some libraries' messages span several)."""
    if isinstance(err, OSError) and err.strerror and err.filename:
        return f"{err.filename}: {err.strerror}"
    return " ".join(str(err).split()) or type(err).__name__


def _one_line_warnings(name: list[str]):
    """Show every Python warning as one line, ``NAME: warning: message`` (``name[0]``: the command,
    known once the arguments are parsed); returns the previous hook."""
    previous = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        with contextlib.suppress(OSError):  # stderr gone (a closed terminal): the run goes on
            print(f"{name[0]}: warning: {_one_line(message if isinstance(message, Warning) else Warning(message))}",
                  file=sys.stderr)

    warnings.showwarning = show
    return previous


def _parser() -> argparse.ArgumentParser:
    from . import __version__
    from .data import PATCHING_EXAMPLES as EXAMPLES
    from .experiments.names import EXPERIMENTS, TASKS

    parser = _Parser(prog="multihead", description="Multi-head attention you can trust and run "
                     "long, and a clear view into every head of a real model.")
    parser.add_argument("--version", action="version", version=f"multihead {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    common = _Parser(add_help=False)
    common.add_argument("--quiet", "-q", action="store_true",
                        help="no progress or advice on stderr (a bar on a terminal, else a line per stage with the "
                             "time left, written once a run passes its first 10 s; advice such as a slow dtype at "
                             "once); warnings about the results (weights newly initialised, unknown tokens) stay")

    def command(name: str, run: Callable, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=[common], help=help)
        p.set_defaults(run=run)
        return p

    def model_flag(p: argparse.ArgumentParser, default: str = "minilm") -> None:
        p.add_argument("--model", default=default,
                       help=f"'minilm', 'smollm2', a local Hugging Face model folder, or a model id the local "
                            f"Hugging Face cache holds, e.g. Qwen/Qwen2.5-7B (read offline; nothing is downloaded) "
                            f"(default {default})")
        where = p.add_argument_group("where the model runs")
        where.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
                           help="auto (default): the checkpoint's own dtype on a GPU, float32 on a CPU (bfloat16 "
                                "on a CPU without bf16 units is slower than float32)")
        where.add_argument("--device", default="auto", help="auto (default: a CUDA GPU, else MPS, else the CPU), cpu, "
                           "cuda, cuda:N or mps")
        where.add_argument("--device-map", choices=("auto", "balanced", "sequential"),
                           help="spread the model over the GPUs, the CPU and disk with accelerate (instead of "
                                "--device)")
        where.add_argument("--max-memory", metavar="SPEC", help="with --device-map: memory per device, e.g. "
                           "'0=20GiB,cpu=60GiB'")
        where.add_argument("--offload-folder", metavar="DIR", help="with --device-map: where weights that fit "
                           "nowhere else go (a folder of the run's own inside DIR, removed when it ends)")

    def out_flags(p: argparse.ArgumentParser, default: str, what: str = "an earlier result") -> None:
        p.add_argument("--out", default=default, help=f"output folder (default: ./{default})")
        p.add_argument("--force", action="store_true", help=f"write into a non-empty folder that is not {what}")

    demo = command("demo", _run_demo, "walk through multi-head attention step by step, then on the real model")
    demo.add_argument("--model", default="minilm", help="Hugging Face BERT-family model: 'minilm' or a local folder")
    demo.add_argument("--no-model", action="store_true", help="skip the real-model part")

    an = command("analyze", _run_analyze, "per-head diagnostics of a real model over a corpus (the main job)")
    an.add_argument("texts", nargs="*", metavar="TEXT", help="texts to analyze (default: a built-in real sample)")
    an.add_argument("--file", help="UTF-8 text file, one text per line")
    an.add_argument("--document", action="store_true",
                    help="with --file: the whole file is one text (a long document). Any text whose maps would pass "
                         "the memory budget is streamed through the model in chunks of query rows, so memory grows "
                         "with its length, not its square")
    model_flag(an)
    out_flags(an, "multihead-report", "a report")
    an.add_argument("--json", action="store_true", help="print the report as JSON instead of the head map")
    an.add_argument("--batch-size", type=_count(1), default=32, help="sentences per batch (default 32)")
    an.add_argument("--truncate", action="store_true", help="cut texts longer than the model's positions")
    an.add_argument("--sample", type=_count(0), default=300,
                    help="with no text: how many Rotten Tomatoes sentences join the articles' examples (default "
                         "300); with --images digits: how many digits (1 to 1,797)")
    an.add_argument("--syntax", choices=("auto", "spacy", "off"), default="auto",
                    help="dependency-syntax scores from spaCy parses: auto (when spaCy and en_core_web_sm are "
                         "installed), spacy (required), off")
    an.add_argument("--conllu", help="a CoNLL-U file: its sentences are the corpus and its trees the syntax gold")
    an.add_argument("--what-if", metavar="SPEC",
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
    an.add_argument("--ablation", type=_count(0), default=None, metavar="N",
                    help="measure each head's zero- and mean-ablation effect on the model's own objective over the "
                         "first N texts (default 16; 0: off; texts of at most 512 tokens): exactly for the heads whose "
                         "labels are tested, estimated by attribution patching for the others")
    an.add_argument("--exact-ablation", action="store_true",
                    help="ablate every head exactly (slower: the run prints how long it would take)")

    vw = command("view", _run_view, "an interactive, offline attention page for a few texts")
    vw.add_argument("texts", nargs="*", metavar="TEXT", help="texts to show (default: the articles' examples)")
    vw.add_argument("--file", help="UTF-8 text file, one text per line")
    model_flag(vw)
    vw.add_argument("--report", help="a report.json (or its folder) of the same model, for labels, metrics and "
                                     "similarity")
    vw.add_argument("--out", default="attention.html", help="the page to write (default: attention.html)")
    vw.add_argument("--force", action="store_true", help="replace an existing file")

    tr = command("train", _run_train, "train a model from a TOML config (resumable; torchrun for several processes)")
    tr.add_argument("config", help="the run's TOML file (see docs/training.md)")
    tr.add_argument("--force", action="store_true", help="train into a non-empty folder that holds no run (never over "
                    "the names a run writes)")
    tr.add_argument("--device", default=None, help="replaces the config's [run] device: auto (a CUDA GPU, else the "
                    "CPU), cpu, cuda or cuda:N; under torchrun each process takes the GPU of its LOCAL_RANK")
    tr.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
                    help="auto (default): the config's [run] precision (float32 unless it says bfloat16); bfloat16: "
                         "autocast mixed precision, the weights and optimiser in float32; float16 is refused (it "
                         "needs loss scaling)")

    ps = command("presets", _run_presets, "the model table: layers, heads, d_model, d_k, parameters, attention FLOPs")
    ps.add_argument("--length", type=_count(1), default=2048, help="context length for the FLOPs column (default 2048)")

    pr = command("prune", _run_prune, "rank heads by gradient importance and prune them iteratively on a task")
    model_flag(pr)
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
    out_flags(pr, "multihead-prune", "an earlier run")
    pr.add_argument("--save-model", action="store_true",
                    help="also save the model physically pruned at the reported fraction (safetensors)")

    pa = command("patch", _run_patch, "activation patching: the share of a clean-vs-corrupt answer each head restores")
    model_flag(pa, "smollm2")
    pa.add_argument("--example", choices=sorted(EXAMPLES),
                    help="a shipped example: " + "; ".join(f"{k}: {v[0]!r} -> {v[2]!r} vs {v[3]!r}"
                                                            for k, v in EXAMPLES.items()))
    pa.add_argument("--clean", help="the text on which the model should give ANSWER")
    pa.add_argument("--corrupt", help="the same number of tokens, changed where it matters")
    pa.add_argument("--answer", help="the clean answer, one token (mind its leading space: ' Paris')")
    pa.add_argument("--wrong", help="the answer the corrupt text points to, one token")
    pa.add_argument("--method", choices=("exact", "attribution"), default="exact",
                    help="exact (one patched run per head, batched) or attribution (one forward and backward for "
                         "all heads; a first-order estimate)")
    out_flags(pa, "multihead-patch", "a patching run")

    cp = command("compare", _run_compare, "two reports side by side: labels gained and lost, metric changes, "
                 "heads that died")
    cp.add_argument("a", metavar="A", help="report.json (or its folder) of the first model")
    cp.add_argument("b", metavar="B", help="report.json (or its folder) of the second model")
    out_flags(cp, "multihead-compare", "a comparison")
    cp.add_argument("--matching", choices=("auto", "index", "profile"), default="auto",
                    help="auto: by index for the same shape, else by attention profile (Hungarian)")
    cp.add_argument("--different-corpora", action="store_true",
                    help="compare reports of different texts anyway (with a warning)")

    ex = command("experiment", _run_experiment, "run an experiment that tests a claim about heads (JSON, Markdown, "
                 "PNG)")
    ex.add_argument("name", choices=(*EXPERIMENTS, "all"), help="which experiment (all: every one, in order)")
    ex.add_argument("--quick", action="store_true", help="the small setting (< 2 minutes): checks the pipeline")
    out_flags(ex, "multihead-experiments", "an earlier run")
    ex.add_argument("--tasks", nargs="+", choices=TASKS, help="tasks of the head-count sweep (default: "
                    "lm-hamlet multi-relation sentiment)")
    ex.add_argument("--seeds", type=_count(1), help="seeds per point (default 3; 2 with --quick)")
    ex.add_argument("--heads", type=_count(1), nargs="+", help="head counts of the sweep (default 1 2 4 8 16 32)")
    ex.add_argument("--device", default="auto", help="auto (CUDA when there is one), cpu or cuda[:N]")
    return parser


def _options(args: argparse.Namespace, *names: str) -> dict:
    """The named flags, and where the model runs (``placement``) for the commands that load one."""
    options = {name: getattr(args, name) for name in names}
    if "model" in names:
        from .hf.placement import Placement

        options["placement"] = Placement(args.dtype, args.device, args.device_map, args.max_memory,
                                         args.offload_folder)
    return options


# Each command imports its renderer after its job: the terminal text renderer (render.text) loads
# torch, and a job checks what the user gave before it loads anything heavy (a bad argument
# answered at once).
def _run_analyze(args: argparse.Namespace) -> int:
    from .jobs import analyze_job

    job = analyze_job(**_options(args, "model", "texts", "file", "document", "conllu", "sample", "syntax",
                                 "coreference", "no_coreference", "what_if", "images", "target", "out", "force",
                                 "batch_size", "truncate", "ablation", "exact_ablation"))
    from .render.text import analyze_text
    if job.rank == 0:  # under torchrun every rank holds the merged report; one prints it
        for note in job.notes:
            print(f"multihead analyze: {note}", file=sys.stderr)
        print(job.report.to_json() if args.json else analyze_text(job.report, model_name=job.model.name,
                                                                   files=job.files))
    return 0


def _run_view(args: argparse.Namespace) -> int:
    from .jobs import view_job
    from .progress import counted

    page, model, n = view_job(**_options(args, "model", "texts", "file", "report", "out", "force"))
    print(f"wrote {page} ({page.stat().st_size / 1024:.0f} KiB): {counted(n, 'text')}, {model.name}, "
          f"{model.num_layers} x {model.num_heads} heads")
    return 0


def _run_patch(args: argparse.Namespace) -> int:
    from .jobs import patch_job

    result, model, folder, given = patch_job(**_options(args, "model", "example", "clean", "corrupt", "answer",
                                                        "wrong", "method", "out", "force"))
    from .render.text import patching_text
    print(patching_text(result, model.name, given["answer"], given["wrong"]))
    print(f"\nwrote {folder / 'patching.json'} and {folder / 'patching.html'}")
    return 0


def _run_compare(args: argparse.Namespace) -> int:
    from .jobs import compare_job

    comparison, folder = compare_job(args.a, args.b, **_options(args, "out", "force", "matching", "different_corpora"))
    from .render.text import comparison_text
    print(comparison_text(comparison))
    print(f"\nwrote {folder / 'compare.json'} and {folder / 'compare.html'}")
    return 0


def _run_prune(args: argparse.Namespace) -> int:
    from .jobs import prune_job

    job = prune_job(**_options(args, "model", "task", "steps", "per_step", "threshold", "stop_below", "once",
                               "train_size", "test_size", "out", "force", "save_model"))
    from .render.text import prune_text

    print(prune_text(job, args.threshold))
    return 0


def _run_train(args: argparse.Namespace) -> int:
    from .jobs import train_job

    config, trained = train_job(args.config, force=args.force, device=args.device, dtype=args.dtype)
    if int(os.environ.get("RANK", "0")) == 0:  # one line for the run, not one a torchrun process
        weights = (f"weights in {config.out / 'checkpoint'}" if config.run.get("checkpoint_every", 0)
                   else "no checkpoint ([run] checkpoint_every = 0)")
        if not trained:
            what = f"nothing trained: {config.out} holds all {config.steps} steps this config asks for"
        elif trained.start:
            what = (f"trained steps {trained.start + 1}-{trained.stop} of {config.steps} (resumed at step "
                    f"{trained.start})")
        else:
            what = f"trained {config.steps} steps"
        print(f"{what}: {weights}, loss and learning rate in {config.out / 'metrics.jsonl'}")
    return 0


def _run_presets(args: argparse.Namespace) -> int:
    from .models import presets_table

    print(presets_table(args.length))
    print("\nParameters are counted on models built by our own code on the meta device (no memory used); "
          "attention FLOPs per token = layers x (8 d^2 + 4 n d).")
    return 0


def _run_experiment(args: argparse.Namespace) -> int:
    from .experiments import run_experiments

    for folder in run_experiments(args.name, args.out, quick=args.quick, tasks=args.tasks, seeds=args.seeds,
                                  heads=args.heads, device=args.device, force=args.force):
        print((folder / "result.md").read_text(encoding="utf-8"))
        print(f"wrote {folder}/result.json, result.md and plots")
    return 0


def _run_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    run_demo(model=None if args.no_model else args.model)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
