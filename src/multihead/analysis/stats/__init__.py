"""Every statistic as a reducer (:mod:`.base`): head metrics, long context, redundancy, syntax, typical
texts, cross-attention, vision patches, and the page's maps."""

from .base import Reducer, ReducerBase, dispatch, shared
from .cross import CROSS_METRICS, CrossStatistics
from .heads import METRICS, HeadStatistics, row_values
from .longcontext import LONG_METRICS, LongContextStatistics
from .maps import HeadMaps, TextView, TextViews, WholeMaps
from .patches import PATCH_METRICS, PatchStatistics
from .redundancy import RedundancyStatistics, clusters, informative_groups, most_redundant
from .syntax import SyntaxScores, SyntaxStatistics
from .typical import TypicalTexts

#: every reducer of multihead, for the protocol's own test and the docs
REDUCERS = (HeadStatistics, LongContextStatistics, RedundancyStatistics, SyntaxStatistics, TypicalTexts,
            CrossStatistics, PatchStatistics, TextViews, WholeMaps, HeadMaps)

__all__ = ["CROSS_METRICS", "LONG_METRICS", "METRICS", "PATCH_METRICS", "REDUCERS", "CrossStatistics", "HeadMaps",
           "HeadStatistics", "LongContextStatistics", "PatchStatistics", "Reducer", "ReducerBase",
           "RedundancyStatistics", "SyntaxScores", "SyntaxStatistics", "TextView", "TextViews", "TypicalTexts",
           "WholeMaps", "clusters", "dispatch", "informative_groups", "most_redundant", "row_values", "shared"]
