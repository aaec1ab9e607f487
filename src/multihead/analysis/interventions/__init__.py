"""Interventions on a real model's heads: ablation effects, labels tested by ablation, activation
patching, direct logit attribution, and what a window would do (what-if)."""

from .ablation import AblationEffects, ablation_effects, attribution_effects
from .direct import direct_logit_attribution
from .evidence import LabelEvidence, label_evidence
from .patching import Patching, patch, patch_heads
from .whatif import WhatIf, parse_what_if, what_if

__all__ = ["AblationEffects", "LabelEvidence", "Patching", "WhatIf", "ablation_effects", "attribution_effects",
           "direct_logit_attribution", "label_evidence", "parse_what_if", "patch", "patch_heads", "what_if"]
