"""Growth specs: LoRA and quantization, the activation cache, progressive growth and its stages.

A `StageSpec` is one progressive stage with everything resolved at the door: its budget in
steps, its noise range, its LR, its seed, its objective and its adapter.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from stackwise.spec.run import MaskingSpec, ObjectiveSpec


@dataclass(frozen=True)
class LoraStackSpec:
    rank: int
    alpha: float | None = None


@dataclass(frozen=True)
class LoraSpec:
    enabled: bool = False
    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    strategy: str = "simplified"
    rank_pattern: str = "constant"
    alpha_pattern: str = "constant"
    per_stack: dict[int, LoraStackSpec] = field(default_factory=dict)
    trunk_adapters: bool = False
    trunk_rank: int = 4
    trunk_alpha: float = 8.0
    target_modules: str | tuple[str, ...] = "all-linear"
    use_dora: bool = False
    use_rslora: bool = False
    init_lora_weights: str = "default"
    loraplus_lr_ratio: float | None = None
    modules_to_save: tuple[str, ...] = ()
    save_merged: bool = False


@dataclass(frozen=True)
class QuantSpec:
    enabled: bool = False
    type: str = "nf4"
    double_quant: bool = False
    backbone_quantized: bool = True
    adapters_full_precision: bool = True


@dataclass(frozen=True)
class AdapterSpec:
    """One LoRA adapter as quant.lora builds it: resolved rank and alpha, its dropout, and the
    dtype name its weights train in ("fp32" or "bf16")."""

    rank: int
    alpha: float
    dropout: float = 0.0
    dtype: str = "fp32"


@dataclass(frozen=True)
class CacheSpec:
    enabled: bool = False
    storage: str = "memory"
    dir: str | None = None
    dtype: str = "bf16"
    max_bytes: int | None = None
    on_full: str = "evict"
    store_all_time_steps: bool = False
    time_step_cache_size: int = 1
    mode: str = "stack"


@dataclass(frozen=True)
class GrowthSpec:
    init: str = "random"
    noise: float = 0.0
    schedule: str = "fixed"
    shares: tuple[float, ...] | None = None
    patience: int = 2
    min_delta: float = 0.0


@dataclass(frozen=True)
class StackOverrideSpec:
    steps: int | None = None
    epochs: float | None = None
    lr: float | None = None
    objective: ObjectiveSpec | None = None
    masking: dict[str, Any] | None = None


@dataclass(frozen=True)
class ProgressiveSpec:
    strategy: str = "end_to_end"
    end_to_end_scope: str = "rackwise"
    mode: str = "blockwise"
    block_size: int | None = None
    joint_tuning_steps: int = 0
    building_mode: str = "append"
    trunk_strategy: str = "frozen"
    head_policy: str = "train_first"
    new_stack_precision: str = "full"
    steps_per_stack: int | None = None
    epochs_per_stack: float | None = None
    stacks: dict[int, StackOverrideSpec] = field(default_factory=dict)
    time_interpretation: str = "input"
    depth_mapping: str = "linear"
    depth_growth: float = 2.0
    time_per_stack: int | None = None
    depth_time_table: tuple[float | tuple[float, float], ...] | None = None
    depth_order: str = "low_to_high"
    lr_schedule: str = "per_stage"
    save_stacks: bool = True
    save_rack: bool = True
    cache: CacheSpec = CacheSpec()
    growth: GrowthSpec = GrowthSpec()


@dataclass(frozen=True)
class StageSpec:
    """One progressive stage, resolved: stack `index` trains `steps` steps at `lr` with `seed`,
    on `objective`/`masking` (its overrides applied), over noise range `t_range` when time is
    depth; its new stack gets `adapter` (None: no stack LoRA)."""

    index: int
    steps: int
    lr: float
    seed: int
    objective: ObjectiveSpec
    masking: MaskingSpec
    t_range: tuple[float, float] | None = None
    adapter: AdapterSpec | None = None
