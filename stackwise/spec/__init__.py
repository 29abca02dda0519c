"""Frozen specs: what each part below the pipeline is built from.

The config (stackwise.config) is the user's document: loaded, aliased and validated once at the
entry points. `stackwise.plan.compile_plan` turns it into these frozen dataclasses, with every
derived value resolved (vocabulary, steps from epochs, each progressive stage's budget, noise
range, LR and seed). Nothing below the pipeline imports the config: the model is built from a
ModelSpec, the data from a DataSpec, a stage from its StageSpec.
"""

from stackwise.spec.growth import (
    AdapterSpec,
    CacheSpec,
    GrowthSpec,
    LoraSpec,
    LoraStackSpec,
    ProgressiveSpec,
    QuantSpec,
    StackOverrideSpec,
    StageSpec,
)
from stackwise.spec.model import MemorySpec, ModelSpec, MoESpec
from stackwise.spec.plan import ParallelSpec, Plan
from stackwise.spec.run import (
    DataSpec,
    GroupLRSpec,
    LoggingSpec,
    MaskingSpec,
    MixSourceSpec,
    ObjectiveSpec,
    SampleSpec,
    TrainSpec,
)

__all__ = [
    "AdapterSpec",
    "CacheSpec",
    "DataSpec",
    "GroupLRSpec",
    "GrowthSpec",
    "LoggingSpec",
    "LoraSpec",
    "LoraStackSpec",
    "MaskingSpec",
    "MemorySpec",
    "MixSourceSpec",
    "MoESpec",
    "ModelSpec",
    "ObjectiveSpec",
    "ParallelSpec",
    "Plan",
    "ProgressiveSpec",
    "QuantSpec",
    "SampleSpec",
    "StackOverrideSpec",
    "StageSpec",
    "TrainSpec",
]
