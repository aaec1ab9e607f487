"""The experiments' and their tasks' names, importable without torch (the command line's choices)."""

__all__ = ["EXPERIMENTS", "TASKS"]

EXPERIMENTS = ("heads", "one-vs-many", "induction", "specialise", "prune-trained")
TASKS = ("lm-hamlet", "lm-treebank", "multi-relation", "sentiment")
