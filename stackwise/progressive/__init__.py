"""Progressive (stack-by-stack) training: the builder, the growing rack, the activation cache,
the stages, and the recipe that loops over the plan's stage specs.

Names load on first use, so a plain run that reads one module of this package (the plan reads
the stage budget) does not import the builder, the growth operators and quantization."""

from __future__ import annotations

from typing import TYPE_CHECKING

from stackwise.lazy_exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    globals(),
    {
        "stackwise.progressive.builder": ("ProgressiveRackBuilder",),
        "stackwise.progressive.cache": ("ActivationCache",),
        "stackwise.progressive.growing": ("GrowingRack",),
        "stackwise.progressive.recipe": ("ProgressiveRecipe", "ProgressiveTrainer"),
        "stackwise.progressive.records": ("ProgressiveResult", "StackRecord", "summary_table"),
        "stackwise.progressive.stage": ("KeyedSamples", "StageModel"),
        "stackwise.progressive.timing": ("depth_range",),
    },
)

if TYPE_CHECKING:  # static tools see the real names
    from stackwise.progressive.builder import ProgressiveRackBuilder  # noqa: F401
    from stackwise.progressive.cache import ActivationCache  # noqa: F401
    from stackwise.progressive.growing import GrowingRack  # noqa: F401
    from stackwise.progressive.recipe import ProgressiveRecipe, ProgressiveTrainer  # noqa: F401
    from stackwise.progressive.records import (  # noqa: F401
        ProgressiveResult,
        StackRecord,
        summary_table,
    )
    from stackwise.progressive.stage import KeyedSamples, StageModel  # noqa: F401
    from stackwise.progressive.timing import depth_range  # noqa: F401
