"""Interventions on a real model's heads: ablation effects, labels tested by ablation, activation
patching, direct logit attribution, and what a window would do (what-if)."""

from typing import TYPE_CHECKING

from ...lazy import lazy_names

__all__ = ["AblationEffects", "LabelEvidence", "Patching", "WhatIf", "ablation_effects", "attribution_effects",
           "direct_logit_attribution", "label_evidence", "parse_what_if", "patch", "patch_heads", "what_if"]

if TYPE_CHECKING:  # at run time the names come from __getattr__, each module imported on first use
    from .ablation import AblationEffects, ablation_effects, attribution_effects
    from .direct import direct_logit_attribution
    from .evidence import LabelEvidence, label_evidence
    from .patching import Patching, patch, patch_heads
    from .whatif import WhatIf, parse_what_if, what_if

#: Public name -> its module (imported on first use: a light module of the package loads no torch)
_NAMES = {
    **dict.fromkeys(("AblationEffects", "ablation_effects", "attribution_effects"), ".ablation"),
    **dict.fromkeys(("direct_logit_attribution",), ".direct"),
    **dict.fromkeys(("LabelEvidence", "label_evidence"), ".evidence"),
    **dict.fromkeys(("Patching", "patch", "patch_heads"), ".patching"),
    **dict.fromkeys(("WhatIf", "parse_what_if", "what_if"), ".whatif"),
}
__getattr__, __dir__ = lazy_names(__name__, _NAMES)
