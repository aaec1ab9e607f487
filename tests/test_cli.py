"""The command line never misleads: one line and exit 2 for bad input, 130 on Ctrl-C with earlier
results untouched, progress only where a person watches, rank 0 alone writing under torchrun."""

import json
import os
import pty
import re
import signal
import subprocess
import sys

import pytest

import multihead as mh
from conftest import run_cli
from multihead.analysis.labels import label_codes


def test_demo_without_model_prints_the_three_steps(capsys):
    code, out, _ = run_cli(["demo", "--no-model"], capsys)
    assert code == 0
    for words in ("Step 1", "Step 2", "Step 3", "(2, 8, 12, 64)", "nn.MultiheadAttention"):
        assert words in out


@pytest.mark.slow
def test_the_console_script_fails_cleanly_on_an_unknown_model(tmp_path):
    result = subprocess.run([sys.executable, "-m", "multihead.cli", "demo", "--model", str(tmp_path / "nope")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [result.stderr.strip()] and "neither a known name" in result.stderr


# Every bad input of the suite issue's table: (arguments, words the one line must contain).
BAD_INPUT = [
    ([], "choose a command"),
    (["analyse"], "invalid choice: 'analyse'"),
    (["analyze", "--batch-size", "abc", "hi"], "--batch-size: must be a positive integer; got 'abc'"),
    (["analyze", "--batch-size", "0", "hi"], "--batch-size: must be a positive integer; got 0"),
    (["analyze", "--sample", "-5"], "--sample: must be an integer >= 0; got -5"),
    (["analyze", "--frobnicate", "hi"], "unrecognized arguments: --frobnicate"),
    (["analyze", "   "], "empty"),
    (["presets", "--length", "0"], "--length: must be a positive integer"),
    (["experiment", "heads", "--seeds", "0"], "--seeds: must be a positive integer"),
]


@pytest.mark.parametrize(("args", "words"), BAD_INPUT, ids=[" ".join(a) or "(none)" for a, _ in BAD_INPUT])
def test_bad_input_is_one_line_and_exit_2(args, words, capsys):
    code, out, err = run_cli(args, capsys)
    assert code == 2 and words in err and out == "", err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and "usage:" not in err, err


def test_files_given_on_the_command_line_are_named_in_their_errors(tmp_path, capsys):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\xff\xfe\x00")
    report = tmp_path / "report.json"
    report.write_bytes(b'{"schema": "multihead.report/1", "model": "\xff"}')
    unknown = tmp_path / "unknown-model"
    unknown.mkdir()
    (unknown / "config.json").write_text('{"model_type": "frobnicator"}')
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    cases = [
        (["analyze", "--file", str(bad)], "--file"),
        (["analyze", "--file", str(bad)], "not UTF-8"),
        (["analyze", "--file", str(tmp_path / "missing.txt")], "--file"),
        (["analyze", "--file", str(tmp_path)], "is a folder"),
        (["view", "--report", str(report), "hi", "--out", str(tmp_path / "p.html")], "--report"),
        (["view", "--report", str(report), "hi", "--out", str(tmp_path / "p.html")], "not UTF-8"),
        (["analyze", "--model", str(unknown), "hi", "--out", str(tmp_path / "u")], "'frobnicator'"),
        (["analyze", "--out", str(full), "hi"], "--out"),
        (["analyze", "--out", str(full), "hi"], "not empty"),
    ]
    for args, words in cases:
        code, _, err = run_cli(args, capsys)
        assert code == 2 and words in err, (args, err)
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, (args, err)
    assert (full / "keep.txt").read_text() == "mine" and len(list(full.iterdir())) == 1
    assert not (tmp_path / "u").exists() and not (tmp_path / "p.html").exists()


@pytest.mark.slow
def test_text_the_tokenizer_cannot_read_is_refused_or_warned_about(tmp_path, capsys):
    code, _, err = run_cli(["analyze", "🙂🙃😀", "😎🤖", "--out", str(tmp_path / "a"), "--no-coreference"], capsys)
    assert code == 2 and "none of the texts' 2 tokens is known" in err and "[UNK]" in err, err
    assert not (tmp_path / "a").exists()
    code, _, err = run_cli(["analyze", "Heads look 🙂 at 🙃 words 😀 .", "--out", str(tmp_path / "b"),
                            "--no-coreference", "--syntax", "off"], capsys)
    assert code == 0
    warning = [line for line in err.splitlines() if "warning" in line]
    assert len(warning) == 1 and "unknown to the tokenizer ([UNK])" in warning[0], err
    section = json.loads((tmp_path / "b" / "report.json").read_text())["sections"]["unknown_tokens"]
    assert section["count"] == 3 and section["token"] == "[UNK]" and section["share"] == pytest.approx(3 / 8)


def test_the_head_map_abbreviates_without_changing_meaning():
    codes = label_codes(["syntactic:acomp>", "syntactic:acomp", "syntactic:nsubjpass", "syntactic:nsubjpass>",
                         "syntactic:nsubj", "previous", "induction", "mixed"])
    assert codes["syntactic:acomp>"] == "acomp>" and codes["syntactic:acomp"] == "acomp"  # direction kept
    assert codes["syntactic:nsubjpass>"].endswith(">") and not codes["syntactic:nsubjpass"].endswith(">")
    assert len(set(codes.values())) == len(codes)  # no two labels share a code
    assert all(len(c) <= 7 for c in codes.values())
    assert codes["previous"] == "PREV" and codes["induction"] == "IND"


def test_the_head_map_prints_a_legend_for_what_it_abbreviates():
    from multihead.analysis.report import HeadRecord, Report

    labels = ["syntactic:nsubjpass>", "syntactic:acomp>", "previous", "mixed"]
    report = Report(model="m", causal=False, num_layers=1, num_heads=4, sentences=1, tokens=1,
                    heads=[HeadRecord(0, h, lab, [], {}) for h, lab in enumerate(labels)])
    text = report.label_map()
    grid, legend = text.splitlines()[1], text.splitlines()[-1]
    assert "acomp>" in grid and "nsubjp>" in grid and "PREV" in grid
    assert "nsubjp>=syntactic:nsubjpass>" in legend and "PREV=previous" in legend and "·=mixed" in legend
    assert "acomp>=" not in legend  # shown whole: nothing to explain beyond the REL> rule
    assert "REL>: the governor attends to its REL dependents" in legend


#: A short run of `multihead analyze` (seconds): what the tests that let a run finish give it.
SHORT_RUN = ["--sample", "5", "--ablation", "0", "--syntax", "off", "--no-coreference"]


def _interrupt_when(tmp_path, words: str, stop: int = signal.SIGINT, ignored: bool = False,
                    short: bool = False) -> tuple[int, str]:
    """Run `multihead analyze` with stderr on a terminal (so it reports its steps) and send ``stop``
    (Ctrl-C's SIGINT, SIGTERM or SIGHUP) when a line containing ``words`` appears — started with
    ``stop`` ignored where ``ignored`` (as ``nohup`` starts it); returns (exit status, what it printed
    on stderr); ``short``: a run of seconds (:data:`SHORT_RUN`) where the test lets it finish."""
    main, follower = pty.openpty()
    flags = SHORT_RUN if short else ["--sample", "40"]
    proc = subprocess.Popen([sys.executable, "-m", "multihead.cli", "analyze", *flags, "--out",
                             str(tmp_path / "rep")], stdout=subprocess.DEVNULL, stderr=follower,
                            env=dict(os.environ, OMP_NUM_THREADS="1"),
                            preexec_fn=(lambda: signal.signal(stop, signal.SIG_IGN)) if ignored else None)
    os.close(follower)
    seen = b""
    try:
        while words.encode() not in seen:
            chunk = os.read(main, 4096)  # blocks until the next output: no clock involved
            assert chunk, f"the run ended before printing {words!r}: {seen.decode(errors='replace')}"
            seen += chunk
        proc.send_signal(stop)
        while True:
            try:
                chunk = os.read(main, 4096)
            except OSError:  # the other end closed
                break
            if not chunk:
                break
            seen += chunk
    finally:
        code = proc.wait(timeout=600)
        os.close(main)
    return code, seen.decode(errors="replace")


@pytest.mark.slow
@pytest.mark.parametrize(("moment", "stop"), [("loading minilm", signal.SIGINT), ("parsing", signal.SIGINT),
                                              ("loading minilm", signal.SIGTERM), ("parsing", signal.SIGTERM),
                                              ("parsing", signal.SIGHUP)])
def test_a_stop_at_any_step_exits_130_143_or_129_and_keeps_the_earlier_report(tmp_path, moment, stop):
    out = tmp_path / "rep"
    out.mkdir()
    earlier = '{"schema": "multihead.report/1", "note": "the earlier report"}\n'
    (out / "report.json").write_text(earlier)
    code, printed = _interrupt_when(tmp_path, moment, stop)
    words, status = {signal.SIGINT: ("interrupted", 130), signal.SIGTERM: ("terminated (SIGTERM)", 143),
                     signal.SIGHUP: ("hung up (SIGHUP)", 129)}[stop]
    assert code == status, printed
    assert f"multihead analyze: {words}" in printed and "Traceback" not in printed, printed
    assert (out / "report.json").read_text() == earlier
    assert sorted(p.name for p in out.iterdir()) == ["report.json"]  # no temporary file left behind


@pytest.mark.slow
def test_a_run_started_with_sighup_ignored_goes_on_when_its_terminal_hangs_up(tmp_path):
    """``nohup multihead analyze …``: the hang-up it was started to survive does not stop it."""
    code, printed = _interrupt_when(tmp_path, "loading minilm", signal.SIGHUP, ignored=True, short=True)
    assert code == 0, printed
    assert "hung up" not in printed and "Traceback" not in printed, printed
    assert json.loads((tmp_path / "rep" / "report.json").read_text())["num_heads"] == 12


@pytest.mark.slow
def test_a_run_whose_terminal_is_gone_writes_its_report_without_a_traceback(tmp_path):
    """The terminal closed (EIO on every write) before a hang-up is handled, or without one: a
    progress line's failed write ended the run in a traceback (exit 1), its report never written."""
    main, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "multihead.cli", "analyze", *SHORT_RUN, "--out",
                             str(tmp_path / "rep")], stdout=follower, stderr=follower,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))
    os.close(follower)
    seen = b""
    while b"loading minilm" not in seen:
        chunk = os.read(main, 4096)
        assert chunk, seen.decode(errors="replace")
        seen += chunk
    os.close(main)  # the terminal gone: every later write fails
    assert proc.wait(timeout=600) == 2  # its summary could not be printed: said by the status alone
    assert json.loads((tmp_path / "rep" / "report.json").read_text())["num_heads"] == 12


def test_progress_off_a_terminal_is_lines_with_the_time_left(monkeypatch, capsys):
    from multihead import progress

    monkeypatch.setattr(progress, "EVERY", 0.0)
    monkeypatch.setattr(progress, "HOLD", 0.0)
    progress.set_enabled(True, terminal=False)
    try:
        with progress.step("loading a model"):
            pass
        assert list(progress.bar(range(4), desc="analysis pass", unit="batch")) == [0, 1, 2, 3]
    finally:
        progress.set_enabled(False)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "multihead: loading a model …"
    assert lines[1] == "multihead: analysis pass: 4 batches …"
    assert any(line.startswith("multihead: analysis pass: 2 of 4 batches in") and "left" in line for line in lines)
    assert lines[-1].startswith("multihead: analysis pass: done in"), lines
    assert all("\r" not in line for line in lines)  # no bar


def test_the_time_left_counts_the_work_the_longer_last_batches_hold(monkeypatch, capsys):
    """Batches go shortest first: a count's estimate said "about 22 s left" of a pass that took 36 s more."""
    from multihead import progress
    from multihead.analysis.pipelines.common import Encoded, batch_work

    clock = iter(range(0, 1000, 10))  # 10 s a reading, whatever the item's weight
    monkeypatch.setattr(progress.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(progress, "EVERY", 0.0)
    monkeypatch.setattr(progress, "HOLD", 0.0)
    progress.set_enabled(True, terminal=False)
    try:  # the first two items 1 unit each, the last two 3: after two, 6 units left
        list(progress.bar(range(4), desc="pass", unit="batch", total=4, weights=[1.0, 1.0, 3.0, 3.0]))
    finally:
        progress.set_enabled(False)
    err = capsys.readouterr().err
    found = re.search(r"pass: 2 of 4 batches in (\d+) s, about (\d+\.\d) min left", err)
    assert found and float(found[2]) * 60 == 3 * int(found[1]), err  # 6 units left at the rate of the first 2
    work = batch_work(Encoded([[0] * n for n in (5, 300, 10, 200)], None), [0, 1, 2, 3], 2)
    assert work == [2 * 10 * (10 + 1024), 2 * 300 * (300 + 1024)]  # shortest first, padded to the longest


def test_progress_lines_of_a_quick_run_stay_held(monkeypatch, capsys):
    """Off a terminal, a run's first HOLD seconds are held back: a quick command (or one that fails
    on bad input at once) writes no progress; a longer one writes them once it passes HOLD."""
    from multihead import progress

    progress.set_enabled(True, terminal=False)
    try:
        progress.note("quick")
        assert capsys.readouterr().err == ""
        monkeypatch.setattr(progress, "HOLD", 0.0)
        progress.note("later")
        assert capsys.readouterr().err.splitlines() == ["multihead: quick", "multihead: later"]
    finally:
        progress.set_enabled(False)


def test_a_warning_is_written_at_once_after_the_lines_held_before_it(monkeypatch, capsys):
    """Advice that may change what the user does (a half dtype slower than float32 on this CPU) is
    not lost with a quick run's held lines in a pipe or a log: written at once, in its place after
    them; the lines after it are held again; --quiet silences it as it does the rest."""
    from multihead import progress

    progress.set_enabled(True, terminal=False)
    try:
        progress.note("loading smollm2 …")
        progress.warn("bfloat16 on a CPU without bfloat16 units: --dtype float32 is faster here")
        assert capsys.readouterr().err.splitlines() == [
            "multihead: loading smollm2 …", "multihead: bfloat16 on a CPU without bfloat16 units: --dtype float32 "
            "is faster here"]
        progress.note("analysis pass: 1 batch …")
        assert capsys.readouterr().err == ""
        assert list(progress.bar(range(1), desc="analyze", unit="batch")) == [0]
        monkeypatch.setattr(progress, "HOLD", 0.0)
        progress.note("done")
        assert capsys.readouterr().err.splitlines()[:2] == ["multihead: analysis pass: 1 batch …",
                                                             "multihead: analyze: 1 batch …"]  # not "1 batches"
        progress.set_enabled(False)
        progress.warn("not said")
        assert capsys.readouterr().err == ""
    finally:
        progress.set_enabled(False)


def test_held_progress_lines_are_written_when_the_hold_passes_not_with_the_next_line(monkeypatch, capsys):
    """A long pass says nothing between its first line and its last: the lines held back (the
    memory plan, "analyze: 1 batch …") are written once HOLD has passed, without waiting for
    the next line — a batch job's log shows them as the run goes; set_enabled drops a pending
    release."""
    import time

    from multihead import progress

    monkeypatch.setattr(progress, "HOLD", 0.3)
    progress.set_enabled(True, terminal=False)
    try:
        progress.note("memory plan: 1.40 GiB")
        progress.note("analyze: 1 batch …")
        assert capsys.readouterr().err == ""
        time.sleep(0.8)  # nothing else said
        assert capsys.readouterr().err.splitlines() == ["multihead: memory plan: 1.40 GiB",
                                                        "multihead: analyze: 1 batch …"]
        progress.note("analyze: done")
        assert capsys.readouterr().err.splitlines() == ["multihead: analyze: done"]  # nothing twice
        progress.set_enabled(True, terminal=False)
        progress.note("quick")
        progress.set_enabled(False)  # the run ended within HOLD: its line stays held
        time.sleep(0.6)
        assert capsys.readouterr().err == ""
    finally:
        progress.set_enabled(False)


@pytest.mark.slow
def test_progress_goes_to_a_terminal_only_and_quiet_silences_it(tmp_path):
    done = subprocess.run([sys.executable, "-m", "multihead.cli", "analyze", "Heads look.", "--no-coreference",
                           "--syntax", "off", "--ablation", "0", "--out", str(tmp_path / "a")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr  # not a terminal and quick: its progress lines stay held
    assert all(line.startswith("multihead: ") and "\r" not in line for line in done.stderr.splitlines()), done.stderr
    main, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "multihead.cli", "analyze", "Heads look.", "--no-coreference",
                             "--syntax", "off", "--ablation", "0", "--out", str(tmp_path / "b"), "--quiet"],
                            stdout=subprocess.DEVNULL, stderr=follower)
    os.close(follower)
    seen = b""
    while True:
        try:
            chunk = os.read(main, 4096)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    assert proc.wait(timeout=600) == 0 and seen == b"", seen
    os.close(main)


@pytest.mark.slow
def test_truncate_on_one_huge_line_parses_only_what_is_analysed(tmp_path, capsys):
    """100,000 characters on one line: only the ~510 tokens MiniLM keeps are parsed and scored (the
    whole line once went to spaCy and into a heads x words x words array of ~20,000 words)."""
    sentence = "The old man gave the young girl a small red book because she asked politely. "
    doc = tmp_path / "long.txt"
    doc.write_text(sentence * (100_000 // len(sentence) + 1), encoding="utf-8")
    assert len(doc.read_text()) > 100_000
    code, _, err = run_cli(["analyze", "--file", str(doc), "--truncate", "--no-coreference", "--syntax", "spacy",
                            "--ablation", "0", "--out", str(tmp_path / "r")], capsys)
    assert code == 0, err
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["sentences"] == 1 and report["tokens"] == 512
    words_kept = 512 - 2  # [CLS] and [SEP] aside, at most one word per token
    relations = report["sections"]["syntax"]["relations"]
    dependents = sum(d["count"] for rel, d in relations.items() if not rel.endswith(">"))
    assert 0.5 * words_kept < dependents <= words_kept  # the analysed part was parsed, and only it


def test_view_says_what_it_wrote_in_one_line(tmp_path, capsys):
    for texts, said in ((["The cat sat."], "1 text, minilm, 6 x 12 heads"),
                        (["The cat sat.", "A dog ran."], "2 texts, minilm, 6 x 12 heads")):
        page = tmp_path / f"{len(texts)}.html"
        code, out, err = run_cli(["view", *texts, "--out", str(page)], capsys)
        assert code == 0 and out.startswith(f"wrote {page} (") and out.rstrip().endswith(said), (out, err)
        # the page says what its maps are of, and where and in what precision they were made
        assert f"maps of {len(texts)} text" in page.read_text() and "; float32 on cpu</p>" in page.read_text()


@pytest.mark.slow
def test_view_with_a_report_of_another_run_says_whose_labels_the_page_shows(tmp_path, capsys):
    """A bfloat16 page over a float32 report said "float32 on cpu" and "4 texts, 60 tokens" (the
    report's run) with no word that its maps were of 1 text in bfloat16."""
    from multihead import progress

    code, _, err = run_cli(["analyze", "The cat sat on the mat.", "A dog ran home.", "--ablation", "0", "--syntax",
                            "off", "--no-coreference", "--out", str(tmp_path / "r")], capsys)
    assert code == 0, err
    page = tmp_path / "v.html"
    progress.set_enabled(True, terminal=False)
    code, _, err = run_cli(["view", "The cat sat.", "--dtype", "bfloat16", "--report", str(tmp_path / "r"),
                            "--out", str(page)], capsys)
    assert code == 0, err
    assert "--report ran in float32 on cpu, these maps in bfloat16 on cpu: the page's labels are of that run" in err
    html = page.read_text()
    assert ("maps of 1 text, 6 tokens; bfloat16 on cpu; labels, probes and the overview from the report (its own "
            "texts and run)") in html


def test_untested_flagged_heads_point_to_ablation_only_where_it_can_run(minilm):
    """A flagged head no ablation tested: "--ablation N tests them" — but of a text past ablation's length
    (a long document: ablation skipped) that advice could not be followed; it points to why instead."""
    from dataclasses import replace

    from multihead.analysis import sections as S
    from multihead.render.text import analyze_text

    report = mh.analyze(minilm, ["The cat sat on the mat because it was warm."], coreference=False, induction=False,
                        ablation=0)
    report = replace(report, heads=[replace(r, flags=["uniform"], degenerate=None) if (r.layer, r.head) == (1, 2)
                                    else r for r in report.heads])
    assert "input-independent attention, not tested by ablation (1; --ablation N tests them): L1.H2 uniform" \
        in analyze_text(report)
    report.sections.ablation = S.Ablation("masked-LM loss", float("nan"), 0, 0, [], skipped="the ablated texts reach "
                                          "799 tokens", unit="nats/token")
    text = analyze_text(report)
    assert "not tested by ablation (1; the ablation was skipped, below): L1.H2 uniform" in text, text
    assert "Ablation skipped: the ablated texts reach 799 tokens" in text, text


def test_counts_in_what_is_printed_agree_with_their_number(minilm):
    """One document is "1 text" (once "1 sentences", then "1 sentence" for thousands of tokens: the
    report's first line, its page, the ablation line), and where it ran follows: "float32 on cpu"."""
    from multihead.progress import counted
    from multihead.render.html import report_body
    from multihead.render.text import analyze_text

    assert [counted(n, "text") for n in (0, 1, 2)] == ["0 texts", "1 text", "2 texts"]
    assert counted(5170, "query token") == "5,170 query tokens"
    assert counted(1, "batch") == "1 batch" and counted(3, "batch") == "3 batches"
    report = mh.analyze(minilm, ["The cat sat on the mat because it was warm."], coreference=False, induction=False,
                        ablation=1)
    text = analyze_text(report)
    assert report.placement == "float32 on cpu"
    assert f"6 layers x 12 heads; 1 text, {report.tokens} tokens; float32 on cpu\n" in text, text
    assert re.search(r"Ablation \(.*, 1 text[);]", text), text
    assert f"<p>1 text, {report.tokens} tokens; float32 on cpu.</p>" in report_body(report)
    assert f"attention, over {report.tokens} query tokens)</h3>" in report_body(report)
    # one text has no bootstrap: every resample of it is itself, so no interval and no stability (once [x, x]
    # and "median 100%", a certainty nothing measured)
    assert all(not r.intervals and r.stability is None for r in report.heads)
    assert "Label stability and intervals over texts: not measured, the corpus is 1 text" in text, text
    assert "[+" not in text, text
    # the redundant pairs say what they average over: every real token of the sentence, for both measures
    red = report.sections.redundancy
    assert red.rows_js == red.rows_cosine == report.tokens
    assert f"alike too; over {report.tokens} query tokens):" in text, text
    two = mh.analyze(minilm, ["The cat sat on the mat because it was warm.", "A dog ran after the ball."],
                     coreference=False, induction=False)
    assert all(r.intervals and r.stability is not None for r in two.heads)
    assert "Label stability (share of" in analyze_text(two)


@pytest.mark.slow
def test_a_file_read_line_by_line_says_so_and_names_document(tmp_path, monkeypatch, capsys):
    """A long document's 97 lines ran as 72 short texts, each ablated and tested, for 11 minutes,
    without a word of --document."""
    from multihead import progress

    monkeypatch.setattr(progress, "HOLD", 0.0)
    doc = tmp_path / "doc.txt"
    doc.write_text("The cat sat on the mat and\nlooked at the dog, which ran\nhome. A bird flew by\nand sang, then\n"
                   "flew away.\n", encoding="utf-8")
    code, _, err = run_cli(["analyze", "--file", str(doc), "--ablation", "0", "--syntax", "off", "--no-coreference",
                            "--out", str(tmp_path / "r")], capsys)
    assert code == 0 and ("multihead: --file: 5 texts, one a line, most of them ending mid-sentence (--document "
                          "reads the file as one text)") in err, err
    corpus = tmp_path / "corpus.txt"  # one sentence a line: the texts the user meant, nothing said
    corpus.write_text("".join(f"Sentence number {i} ends here.\n" for i in range(6)), encoding="utf-8")
    code, _, err = run_cli(["analyze", "--file", str(corpus), "--ablation", "0", "--syntax", "off",
                            "--no-coreference", "--out", str(tmp_path / "c")], capsys)
    assert code == 0 and "one a line" not in err, err
    code, _, err = run_cli(["analyze", "--file", str(doc), "--document", "--ablation", "0", "--syntax", "off",
                            "--no-coreference", "--out", str(tmp_path / "d")], capsys)
    assert code == 0 and "one a line" not in err, err
