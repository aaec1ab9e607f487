"""Fine-tune MiniLM on Rotten Tomatoes sentiment, then compare its heads before and after.

    python examples/finetune_and_compare.py OUT [--steps 300] [--texts 300]

1. MiniLM with a logistic-regression head on its frozen mean-pooled states (the sentiment task of
   ``multihead.heads.tasks``): held-out accuracy before;
2. the whole encoder and the head trained together for ``--steps`` steps (AdamW, lr 3e-5,
   batches of 32): held-out accuracy after; the model is saved (safetensors) to OUT/minilm-rt;
3. ``mh.analyze`` of both models on the same texts (the articles' sentences and Rotten Tomatoes
   sentences, with ablation and the label tests), each written as a report folder
   (OUT/base, OUT/tuned);
4. ``mh.compare`` of the two: OUT/compare/compare.html and compare.json, and the summary printed.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import itertools
import os
import time
from pathlib import Path

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", help="output folder")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--texts", type=int, default=300,
                        help="Rotten Tomatoes sentences analysed (plus the 4 articles')")
    parser.add_argument("--ablation", type=int, default=16)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import multihead as mh
    from multihead.analysis.probes.syntax import spacy_available
    from multihead.data import sample_sentences
    from multihead.heads.tasks import SentimentTask
    from multihead.io import write_compare_folder, write_report_folder
    from multihead.render import comparison_text

    out = Path(args.out)
    torch.manual_seed(0)
    base = mh.hf.load("minilm")
    tuned = dataclasses.replace(base, model=copy.deepcopy(base.model))
    task = SentimentTask(model=tuned, batch_size=32)
    before = task.evaluate()
    print(f"held-out accuracy, frozen encoder + logistic head: {before:.3f}")
    classifier = task.classifier
    classifier.requires_grad_(True)
    tuned.model.train()
    params = [*tuned.model.parameters(), *classifier.parameters()]
    opt = torch.optim.AdamW(params, lr=3e-5, weight_decay=0.01)
    batches = itertools.cycle(list(task.batches("train")))
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        batch = next(batches)
        outputs = tuned.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        loss = task.loss(outputs, batch).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0 or step == args.steps:
            print(f"step {step}: loss {loss.item():.4f} ({time.perf_counter() - start:.0f} s)")
    tuned.model.eval()
    after = task.evaluate()
    print(f"held-out accuracy after {args.steps} steps of fine-tuning: {after:.3f}")
    folder = out / "minilm-rt"
    tuned.model.save_pretrained(folder, safe_serialization=True)
    base.tokenizer.save_pretrained(folder)
    tuned = mh.hf.load(folder)  # as a user would: from the saved folder
    texts = sample_sentences(args.texts)
    parses = "spacy" if spacy_available() else None
    for name, model in (("base", base), ("tuned", tuned)):
        report = mh.analyze(model, texts, parses=parses, ablation=args.ablation)
        write_report_folder(report, out / name, force=True)
    comparison = mh.compare(out / "base", out / "tuned")
    write_compare_folder(comparison, out / "compare", force=True)
    print(comparison_text(comparison))
    print(f"\nwrote {out / 'compare' / 'compare.html'}")


if __name__ == "__main__":
    main()
