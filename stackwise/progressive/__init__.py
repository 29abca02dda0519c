"""Progressive (stack-by-stack) training: the builder, the growing rack, the activation cache,
the stages, and the recipe that loops over the plan's stage specs."""

from stackwise.progressive.builder import ProgressiveRackBuilder
from stackwise.progressive.cache import ActivationCache
from stackwise.progressive.growing import GrowingRack
from stackwise.progressive.recipe import ProgressiveRecipe, ProgressiveTrainer
from stackwise.progressive.records import ProgressiveResult, StackRecord, summary_table
from stackwise.progressive.stage import KeyedSamples, StageModel
from stackwise.progressive.timing import depth_range

__all__ = [
    "ActivationCache",
    "GrowingRack",
    "KeyedSamples",
    "ProgressiveRackBuilder",
    "ProgressiveRecipe",
    "ProgressiveResult",
    "ProgressiveTrainer",
    "StackRecord",
    "StageModel",
    "depth_range",
    "summary_table",
]
