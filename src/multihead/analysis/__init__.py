"""Per-head diagnostics of real models: capture, metrics, patterns, reports."""

from .analyze import analyze, collect_statistics
from .metrics import METRICS, HeadStatistics, TokenInfo
from .patterns import flags_for, label_for
from .report import SCHEMA, HeadRecord, Report

__all__ = ["METRICS", "SCHEMA", "HeadRecord", "HeadStatistics", "Report", "TokenInfo", "analyze",
           "collect_statistics", "flags_for", "label_for"]
