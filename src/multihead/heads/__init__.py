"""Which heads matter: gradient and ablation importance, tasks on real data, iterative and physical pruning."""

from .curve import PruningCurve, PruningStep, pruning_curve
from .importance import HeadImportance, ablation_importance, head_importance, spearman
from .prune import count_heads, load_pruned, prune_heads, save_pruned
from .tasks import LanguageModelTask, SentimentTask, Task

__all__ = [
           "HeadImportance",
           "LanguageModelTask",
           "PruningCurve",
           "PruningStep",
           "SentimentTask",
           "Task",
           "ablation_importance",
           "count_heads",
           "head_importance",
           "load_pruned",
           "prune_heads",
           "pruning_curve",
           "save_pruned",
           "spearman",
]
