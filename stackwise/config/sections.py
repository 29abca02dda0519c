"""The config sections of what a run learns and samples: objective, masking, sample.

The data section is `sections_data`, the model section `sections_model`, train and logging
`sections_train`; all are importable from here. Field types and single-field checks live with
the sections; rules that relate fields are in `stackwise.config.rules`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveInt,
    field_validator,
    model_validator,
)

from stackwise.config.base import Section
from stackwise.config.names import ObjectiveName, SamplerName, ScheduleName
from stackwise.config.sections_data import DataConfig, MixSource
from stackwise.config.sections_model import RACK_SHAPE_FIELDS, ModelConfig
from stackwise.config.sections_train import GroupLR, LoggingConfig, SchedulerName, TrainConfig
from stackwise.registry import OBJECTIVES

__all__ = [
    "RACK_SHAPE_FIELDS",
    "DataConfig",
    "GroupLR",
    "LoggingConfig",
    "MaskingConfig",
    "MixSource",
    "ModelConfig",
    "ObjectiveConfig",
    "SampleConfig",
    "SchedulerName",
    "TrainConfig",
]


class ObjectiveConfig(Section):
    name: ObjectiveName = Field(
        "clm", description="clm, mlm, diffusion, block_diffusion, custom or a registered objective."
    )
    attention: Literal["auto", "causal", "bidirectional"] = Field(
        "auto", description="auto: causal for clm/custom, bidirectional for mlm/diffusion."
    )
    weighting: Literal["elbo", "uniform"] = Field(
        "elbo", description="diffusion: -alpha'/(1-alpha) (NELBO) or 1."
    )
    random_length_ratio: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="Share of training sequences cut to a random shorter length (the rest "
        "padded and ignored): against repetition and for variable-length sampling.",
    )
    block_size: PositiveInt | None = Field(
        None,
        description="block_diffusion: tokens per block; each block is denoised given the clean "
        "blocks before it (1: the causal LM; the sequence length: one masked-diffusion block).",
    )
    block_shift: bool = Field(
        True,
        description="block_diffusion: predict token j at position j - 1 as the causal LM does "
        "(blocks of one token are then the clm on the same weights; a block's first token does "
        "not see the rest of its block), or at j itself as BD3-LM does (false).",
    )

    @property
    def causal(self) -> bool:
        if self.attention == "auto":
            return bool(OBJECTIVES.capabilities(self.name).causal)
        return self.attention == "causal"


DEFAULT_TIME_STEPS = 10  # the grid of masking.time_step_masking: true without num_time_steps


class MaskingConfig(Section):
    mask_ratio: float | tuple[float, float] = Field(
        0.15, description="mlm: a ratio, or [low, high] drawn per example."
    )
    bert_mix: bool = Field(False, description="mlm: 80% mask, 10% random, 10% kept.")
    schedule: ScheduleName = Field(
        "linear", description="diffusion: the mask rate over t (linear, loglinear, cosine, table)."
    )
    eps: float = Field(1e-3, gt=0.0, lt=0.5, description="diffusion: t ~ U(eps, 1).")
    antithetic: bool = Field(
        True, description="diffusion: space a batch's t evenly (less variance); false: independent."
    )
    time_step_masking: bool | None = Field(
        None,
        description="diffusion: true draws t on the grid of num_time_steps (10 when unset); "
        "false: continuous t; unset: a grid when num_time_steps is set.",
    )
    num_time_steps: PositiveInt | None = Field(
        None, description="diffusion: draw t on a grid of this many steps."
    )
    time_step_bins: list[NonNegativeInt] | None = Field(
        None, description="diffusion: the grid steps training draws t from (default: all)."
    )
    time_step_mask_fractions: dict[int, float] | None = Field(
        None,
        description="schedule table: {step: mask fraction}, interpolated (giving it without "
        "masking.schedule means schedule: table).",
    )

    @model_validator(mode="before")
    @classmethod
    def _grid_defaults(cls, data: Any) -> Any:
        """time_step_masking: true without num_time_steps means the default grid; fractions
        per step without a schedule mean schedule: table."""
        if not isinstance(data, dict):
            return data
        if data.get("time_step_masking") is True and data.get("num_time_steps") is None:
            data = {**data, "num_time_steps": DEFAULT_TIME_STEPS}
        if data.get("time_step_mask_fractions") and "schedule" not in data:
            data = {**data, "schedule": "table"}
        return data

    @field_validator("mask_ratio")
    @classmethod
    def _ratio(cls, v: float | tuple[float, float]) -> float | tuple[float, float]:
        lo, hi = (v, v) if isinstance(v, float | int) else v
        if not 0.0 < lo <= hi <= 1.0:
            raise ValueError(
                "mask_ratio must be in (0, 1], or [low, high] with 0 < low <= high <= 1"
            )
        return v


class SampleConfig(Section):
    """End-of-training samples, and the defaults of `stackwise generate`."""

    num_samples: NonNegativeInt = Field(
        2, description="Samples shown after training (0: none); generate's default."
    )
    prompt: str = Field("", description="The text each sample continues.")
    max_new_tokens: PositiveInt = Field(64, description="Tokens to generate after the prompt.")
    temperature: NonNegativeFloat = Field(0.8, description="Divides the logits; 0: argmax.")
    top_k: NonNegativeInt = Field(0, description="Keep the k likeliest tokens; 0 disables.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling.")
    steps: PositiveInt = Field(32, description="mlm/diffusion: denoising steps.")
    sampler: SamplerName = Field(
        "auto",
        description="mlm/diffusion. auto: ancestral (MDLM) for diffusion, remask for mlm; "
        "confidence: reveal what the rack is sure of (sample.confidence_threshold); remdm: "
        "ancestral with remasking (sample.remask_budget); single_pass: one pass through a "
        "rack grown with depth_order high_to_low.",
    )
    remasking: Literal["low_confidence", "random", "entropy", "margin"] = Field(
        "low_confidence", description="remask: which masked positions are revealed first."
    )
    block_length: NonNegativeInt = Field(
        0, description="mlm/diffusion: fill blocks of this many tokens left to right; 0: one."
    )
    no_repeat_words: bool = Field(
        False,
        description="mlm/diffusion with a char or byte tokenizer: a word that repeats the word "
        "before it is masked again and redrawn.",
    )
    confidence_threshold: float = Field(
        0.9,
        gt=0.0,
        le=1.0,
        description="sampler confidence: each step reveals every masked position whose drawn "
        "token is at least this likely under the rack's own distribution (before temperature "
        "and top_k/top_p), and at least one per row.",
    )
    remask_budget: float = Field(
        0.05,
        ge=0.0,
        le=1.0,
        description="sampler remdm: the most a revealed token's chance of being masked again "
        "at a step (ReMDM's eta_cap); 0 is the ancestral sampler.",
    )

    def resolved_sampler(self, objective: str) -> str:
        if self.sampler != "auto":
            return self.sampler
        return str(OBJECTIVES.capabilities(objective).default_sampler)  # auto
