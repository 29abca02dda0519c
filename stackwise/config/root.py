"""The root config: one section per concern, checked by every rule at once."""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import Field, ValidationInfo, model_validator

from stackwise.config.base import (
    CROSS_RULES,
    DERIVED_RULES,
    RuleProblems,
    Section,
    at_root,
    problems_of,
    section_problems,
)
from stackwise.config.growth import LoraConfig, ProgressiveConfig, QuantConfig
from stackwise.config.linked import linked_model_keys
from stackwise.config.moe import MemoryConfig
from stackwise.config.sections import (
    DataConfig,
    LoggingConfig,
    MaskingConfig,
    ModelConfig,
    ObjectiveConfig,
    SampleConfig,
    TrainConfig,
)
from stackwise.config.sections_parallel import ParallelConfig


class Config(Section):
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    objective: ObjectiveConfig = Field(default_factory=ObjectiveConfig)
    masking: MaskingConfig = Field(default_factory=MaskingConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    sample: SampleConfig = Field(default_factory=SampleConfig)
    lora: LoraConfig = Field(default_factory=LoraConfig)
    quant: QuantConfig = Field(default_factory=QuantConfig)
    progressive: ProgressiveConfig = Field(default_factory=ProgressiveConfig)
    memory: MemoryConfig = Field(default_factory=MemoryConfig)
    parallel: ParallelConfig = Field(default_factory=ParallelConfig)

    @property
    def memory_on(self) -> bool:
        """train.enabled_extensions lists memory: the memory section is built."""
        return "memory" in self.train.enabled_extensions

    @model_validator(mode="before")
    @classmethod
    def _stack_shape(cls, data: Any) -> Any:
        """progressive.mode layerwise/blockwise set model.blocks_per_stack and progressive.
        target_stacks sets model.n_stacks (one source of truth each)."""
        if not isinstance(data, dict):
            return data
        prog = data.get("progressive") or {}
        if not isinstance(prog, dict):
            return data
        data = _grid_of_depth(data, prog)
        linked = linked_model_keys(prog)
        if not linked or not isinstance(data.get("model") or {}, dict):
            return data  # nothing decided, or a model: that validation refuses
        model = dict(data.get("model") or {})
        for key, (want, source) in linked.items():
            given = model.get(key)
            if given is not None and given != want:
                raise ValueError(
                    f"{source} means {key}={want}, but model.{key} is {given}; remove one of them"
                )
            model[key] = want
        return {**data, "model": model}

    @model_validator(mode="after")
    def _cross_rules(self, info: ValidationInfo) -> Config:
        found = problems_of(self, CROSS_RULES, section_problems(self) if at_root(info) else [])
        if not found:
            found = problems_of(self, DERIVED_RULES)
        if found:
            raise RuleProblems(found)
        return self

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)

    @property
    def training(self) -> Any:
        """The seeds' `training` section as attributes (`config.training.max_length`,
        `config.training.progressive.trunk_strategy = "qlora"`), on the real keys."""
        from stackwise.config.seed_view import SeedView

        return SeedView(self, "training.")


def _grid_of_depth(data: dict[str, Any], prog: dict[str, Any]) -> dict[str, Any]:
    """Time as depth with progressive.time_per_stack grid steps per stack and no
    masking.num_time_steps: the grid is time_per_stack x the rack's stacks (the seeds' way)."""
    masking, model = data.get("masking") or {}, data.get("model") or {}
    width = prog.get("time_per_stack")
    if prog.get("time_interpretation") != "depth" or not isinstance(width, int):
        return data
    if not isinstance(masking, dict) or not isinstance(model, dict):
        return data
    if masking.get("num_time_steps") is not None:
        return data
    n = prog.get("target_stacks") or model.get("n_stacks") or ModelConfig().n_stacks
    if not isinstance(n, int):
        return data
    return {**data, "masking": {**masking, "num_time_steps": width * n}}
