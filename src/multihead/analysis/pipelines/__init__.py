"""Pipelines: each chooses its reducers, runs one pass, and builds a Report by keyword — text models
(:mod:`.analyze`), encoder–decoder models (:mod:`.encdec`), vision models (:mod:`.vision`), our
keyword spotter (:mod:`.speech`) — and the views of a few texts (:mod:`.views`)."""

from .analyze import CorpusStatistics, analyze, collect_statistics
from .common import corpus_fingerprint, process_group, run_pass
from .encdec import analyze_encoder_decoder
from .memory_plan import MemoryPlan, PlanError, check_plan, plan, plan_devices
from .views import Rollout, attention_maps, rollout, text_views
from .vision import analyze_images, digit_images, image_maps, load_images

__all__ = ["CorpusStatistics", "MemoryPlan", "PlanError", "Rollout", "analyze", "analyze_encoder_decoder",
           "analyze_images", "attention_maps", "check_plan", "collect_statistics", "corpus_fingerprint", "digit_images",
           "image_maps", "load_images", "plan", "plan_devices", "process_group", "rollout", "run_pass", "text_views"]
