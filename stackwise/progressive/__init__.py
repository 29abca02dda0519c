"""Progressive (stack-by-stack) training: builder, activation cache, stages and local losses."""

from stackwise.progressive.builder import ProgressiveRackBuilder
from stackwise.progressive.cache import ActivationCache
from stackwise.progressive.local import LocalLossTrainer
from stackwise.progressive.stage import KeyedSamples, StageModel
from stackwise.progressive.timing import depth_range
from stackwise.progressive.trainer import ProgressiveResult, ProgressiveTrainer, summary_table

__all__ = [
    "ActivationCache",
    "KeyedSamples",
    "LocalLossTrainer",
    "ProgressiveRackBuilder",
    "ProgressiveResult",
    "ProgressiveTrainer",
    "StageModel",
    "depth_range",
    "summary_table",
]
