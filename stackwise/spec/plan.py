"""The Plan: every spec of one run, frozen, plus the validated config it was compiled from."""

from __future__ import annotations

from dataclasses import asdict, dataclass, is_dataclass, replace
from typing import Any

import yaml

from stackwise.spec.growth import AdapterSpec, LoraSpec, ProgressiveSpec, QuantSpec, StageSpec
from stackwise.spec.model import MemorySpec, ModelSpec
from stackwise.spec.run import (
    DataSpec,
    LoggingSpec,
    MaskingSpec,
    ObjectiveSpec,
    SampleSpec,
    TrainSpec,
)


@dataclass(frozen=True)
class ParallelSpec:
    """How the model is placed on the run's processes: a registered parallelizer's name, and
    whether the user named it (a strategy that needs its own placement may replace `auto`'s
    choice, never the user's)."""

    name: str = "ddp"
    chosen: bool = False
    sharding: str | None = None  # fsdp: full_shard when None
    shard_group_size: int | None = None
    param_dtype: str = "auto"
    reduce_dtype: str = "fp32"
    cpu_offload: bool = False
    # the parallelizer splits parameters over ranks (its `shards` capability): saves gather,
    # checkpoints are DCP's (DeepSpeed's own under deepspeed)
    shards: bool = False
    deepspeed: dict[str, Any] | None = None  # deepspeed: the config deepspeed.initialize gets


@dataclass(frozen=True)
class Plan:
    """One run, resolved. `source` is the validated config as plain data: what config.yaml
    holds, so a saved run reloads through the same door. Changes below the pipeline are
    `with_section`, which keeps `source` in step; nothing is validated again."""

    model: ModelSpec
    data: DataSpec
    objective: ObjectiveSpec
    masking: MaskingSpec
    train: TrainSpec
    logging: LoggingSpec
    sample: SampleSpec
    lora: LoraSpec
    quant: QuantSpec
    progressive: ProgressiveSpec
    memory: MemorySpec
    memory_on: bool = False
    parallel: ParallelSpec = ParallelSpec()
    stages: tuple[StageSpec, ...] = ()
    trunk_adapter: AdapterSpec | None = None
    source: dict[str, Any] | None = None

    def with_section(self, name: str, /, **values: Any) -> Plan:
        """This plan with fields of section `name` replaced (e.g. a stage's train settings).
        The config keys among them go to `source` too; resolved-only fields (objective.causal)
        stay in the spec, so config.yaml always reloads."""
        section = replace(getattr(self, name), **values)
        return replace(self, **{name: section}, source=self.with_source(name, values))

    def with_source(self, name: str, values: dict[str, Any]) -> dict[str, Any]:
        """`source` with section `name`'s keys among `values` replaced (others are not config
        keys and are left out)."""
        source = dict(self.source or {})
        if name in source:
            known = {k: v for k, v in values.items() if k in source[name]}
            source[name] = {**source[name], **_plain(known)}
        return source

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.source or {}, sort_keys=False)


def _plain(values: dict[str, Any]) -> dict[str, Any]:
    """Spec values as the YAML the config reads back (tuples as lists, specs as mappings)."""
    return {k: _plain_value(v) for k, v in values.items()}


def _plain_value(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return _plain(asdict(value))
    if isinstance(value, dict):
        return _plain(value)
    if isinstance(value, list | tuple):
        return [_plain_value(v) for v in value]
    if value is not None and not isinstance(value, str | int | float | bool):
        raise TypeError(f"{value!r} has no place in config.yaml")
    return value
