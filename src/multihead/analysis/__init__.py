"""Per-head diagnostics of real models: capture, metrics, patterns, reports."""

from .analyze import CorpusStatistics, analyze, collect_statistics
from .compare import Comparison, compare
from .direct import direct_logit_attribution
from .gradients import GradientMonitor
from .metrics import METRICS, HeadStatistics, TokenInfo
from .output import REPORT_FILES, check_report_folder, write_report_folder
from .patching import Patching, patch, patch_heads
from .patterns import flags_for, label_for
from .redundancy import RedundancyStatistics, clusters, most_redundant
from .report import SCHEMA, HeadRecord, Report

__all__ = [
           "METRICS",
           "REPORT_FILES",
           "SCHEMA",
           "Comparison",
           "CorpusStatistics",
           "GradientMonitor",
           "HeadRecord",
           "HeadStatistics",
           "Patching",
           "RedundancyStatistics",
           "Report",
           "TokenInfo",
           "analyze",
           "check_report_folder",
           "clusters",
           "collect_statistics",
           "compare",
           "direct_logit_attribution",
           "flags_for",
           "label_for",
           "most_redundant",
           "patch",
           "patch_heads",
           "write_report_folder",
]
