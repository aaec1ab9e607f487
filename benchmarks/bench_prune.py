"""Head importance and physical pruning on MiniLM (issue: which heads matter).

1. Cost of importance on the same sentiment data: the gradient method (one forward + backward
   per batch, per-example |∂L/∂ξ|) against leave-one-head-out ablation (72 evaluations of the
   task loss, one per head gated off). Time ratio (target ≥ 20x cheaper) and the Spearman rank
   correlation between the two rankings (ablation measured as the rise of the mean loss, the
   quantity the gradient approximates, and as the drop of accuracy).
2. Physical pruning of 50% of the heads (the 36 least important by gradient): parameters,
   forward time at batch 1 and batch 64 (paired rounds, same inputs) and sentiment accuracy
   before and after.

Usage: python benchmarks/bench_prune.py [--quick]
"""

from __future__ import annotations

import argparse
import copy
import time

import torch

import multihead as mh
from _common import compare, paired_ratio, setup_threads, table, verdict
from multihead.heads import SentimentTask, ablation_importance, head_importance, prune_heads, spearman
from multihead.hf.interventions import HeadGates


def _loss_and_accuracy(task: SentimentTask) -> tuple[float, float]:
    total, right, n = 0.0, 0, 0
    with torch.inference_mode():
        for batch in task.batches("train"):
            out = task.model.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
            total += float(task.loss(out, batch).sum())
            assert task.classifier is not None
            right += int((task.classifier(task._embed(batch, out)).argmax(-1) == batch["labels"]).sum())
            n += len(batch["labels"])
    return total / n, right / n


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller splits")
    args = parser.parse_args(argv)
    threads = setup_threads()
    hf = mh.hf.load("minilm")
    train, test = (96, 256) if args.quick else (384, 1000)
    task = SentimentTask(hf, train_size=train, test_size=test)
    model = hf.model
    print(f"## Head importance and pruning: MiniLM (6 x 12 heads), sentiment, {train} sentences for importance, "
          f"{test} held out; {threads} threads\n")

    start = time.perf_counter()
    grad = head_importance(model, task.batches("train"), task.loss)
    t_grad = time.perf_counter() - start
    accuracies: list[float] = []

    def negative_loss() -> float:  # ablation reports base - value: the rise of the loss
        loss, acc = _loss_and_accuracy(task)
        accuracies.append(acc)
        return -loss

    start = time.perf_counter()
    loss_rise, _ = ablation_importance(model, negative_loss)
    t_abl = time.perf_counter() - start
    acc_drop = accuracies[0] - torch.tensor(accuracies[1:], dtype=torch.float64).view(6, 12)
    rho_loss = spearman(grad.raw, loss_rise)
    rho_acc = spearman(grad.raw, acc_drop)
    ratio = t_abl / t_grad
    print(table(["method", "seconds", "passes over the data"], [
        ["gradient importance (one backward per batch)", f"{t_grad:.1f}", "1 forward + 1 backward"],
        ["leave-one-head-out ablation (loss)", f"{t_abl:.1f}", f"{grad.scores.numel() + 1} forwards"],
    ]))
    print(f"\nablation / gradient time: {ratio:.1f}x (target >= 20x): {verdict(ratio >= 20)}")
    print(f"Spearman(gradient, ablation loss rise) = {rho_loss:.2f}; "
          f"Spearman(gradient, ablation accuracy drop) = {rho_acc:.2f}")

    order = grad.scores.flatten().argsort()[: grad.scores.numel() // 2]
    heads: dict[int, list[int]] = {}
    for n in order.tolist():
        heads.setdefault(n // 12, []).append(n % 12)
    pruned = copy.deepcopy(model)
    prune_heads(pruned, heads)
    with HeadGates(model, values=torch.ones(6, 12).index_put_((order // 12, order % 12), torch.tensor(0.0))):
        gated_acc = task.evaluate()
    full_acc = task.evaluate()
    task.model.model = pruned
    pruned_acc = task.evaluate()
    task.model.model = model
    params = sum(p.numel() for p in model.parameters())
    params_pruned = sum(p.numel() for p in pruned.parameters())
    attn = sum(p.numel() for n, p in model.named_parameters() if ".attention." in n)
    attn_pruned = sum(p.numel() for n, p in pruned.named_parameters() if ".attention." in n)
    rows = [["parameters (all)", params, params_pruned, f"{params_pruned / params:.3f}"],
            ["parameters (attention blocks)", attn, attn_pruned, f"{attn_pruned / attn:.3f}"]]
    texts = [t for t, _ in task.splits["test"]]
    for B in (1, 64):
        batch = hf.tokenizer(texts[:B], padding=True, return_tensors="pt")
        with torch.inference_mode():
            times = compare({"full": lambda b=batch: model(**b), "pruned": lambda b=batch: pruned(**b)},
                            repeat=7 if B == 64 else 30)
        speed = 1 / paired_ratio(times, "pruned", "full")
        rows.append([f"forward time, batch {B} (ms)", f"{min(times['full']) * 1e3:.1f}",
                     f"{min(times['pruned']) * 1e3:.1f}", f"{speed:.2f}x faster"])
    rows.append(["sentiment accuracy (held out)", f"{full_acc:.4f}", f"{pruned_acc:.4f}",
                 f"{pruned_acc - full_acc:+.4f}"])
    print("\n" + table(["50% of heads pruned physically", "full", "pruned", "ratio"], rows))
    print(f"\ngated model accuracy {gated_acc:.4f} = pruned model accuracy {pruned_acc:.4f}: "
          f"{verdict(abs(gated_acc - pruned_acc) < 1e-9)}")


if __name__ == "__main__":
    main()
