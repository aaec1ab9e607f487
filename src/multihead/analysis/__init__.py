"""Per-head diagnostics of real models: reducers, probes, interventions, pipelines, labels, reports.

Layers (each imports only those before it): :mod:`.sections` and :mod:`.stats` (the reducers),
:mod:`.probes`, :mod:`.labels`, :mod:`.interventions`, :mod:`.report` / :mod:`.compare` /
:mod:`.rollout`, :mod:`.pipelines`. See docs/architecture.md.
"""

from typing import TYPE_CHECKING

from ..lazy import lazy_names

__all__ = [
           "METRICS",
           "SCHEMA",
           "Comparison",
           "CorpusStatistics",
           "GradientMonitor",
           "HeadRecord",
           "HeadStatistics",
           "MemoryPlan",
           "PlanError",
           "RedundancyStatistics",
           "Report",
           "Rollout",
           "TokenInfo",
           "ablation_effects",
           "analyze",
           "attention_maps",
           "attribution_effects",
           "clusters",
           "collect_statistics",
           "compare",
           "direct_logit_attribution",
           "flags_for",
           "label_for",
           "most_redundant",
           "patch",
           "patch_heads",
           "plan",
           "plan_devices",
           "rollout",
           "text_views",
           "what_if",
]

if TYPE_CHECKING:  # for type checkers and IDEs; at run time the names come from __getattr__
    from ..heads.monitor import GradientMonitor
    from ..inputs import TokenInfo
    from .compare import Comparison, compare
    from .interventions import (
        ablation_effects,
        attribution_effects,
        direct_logit_attribution,
        patch,
        patch_heads,
        what_if,
    )
    from .labels import flags_for, label_for
    from .pipelines import (
        CorpusStatistics,
        MemoryPlan,
        PlanError,
        Rollout,
        analyze,
        attention_maps,
        collect_statistics,
        plan,
        plan_devices,
        rollout,
        text_views,
    )
    from .report import SCHEMA, HeadRecord, Report
    from .stats import METRICS, HeadStatistics, RedundancyStatistics, clusters, most_redundant

#: Public name -> the module that defines it: importing one light module of the package (its report, its
#: labels) loads neither torch nor the model code
_NAMES = {
    "GradientMonitor": "..heads.monitor",
    "TokenInfo": "..inputs",
    **dict.fromkeys(("Comparison", "compare"), ".compare"),
    **dict.fromkeys(("ablation_effects", "attribution_effects", "direct_logit_attribution", "patch", "patch_heads",
                     "what_if"), ".interventions"),
    **dict.fromkeys(("flags_for", "label_for"), ".labels"),
    **dict.fromkeys(("CorpusStatistics", "MemoryPlan", "PlanError", "Rollout", "analyze", "attention_maps",
                     "collect_statistics", "plan", "plan_devices", "rollout", "text_views"), ".pipelines"),
    **dict.fromkeys(("SCHEMA", "HeadRecord", "Report"), ".report"),
    **dict.fromkeys(("METRICS", "HeadStatistics", "RedundancyStatistics", "clusters", "most_redundant"), ".stats"),
}
__getattr__, __dir__ = lazy_names(__name__, _NAMES)
