"""The config sections of progressive growth: LoRA, quantization, the cache, per-stack overrides."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt, field_validator

from stackwise.config.base import Section
from stackwise.config.names import GrowthOperatorName
from stackwise.config.sections import ObjectiveConfig
from stackwise.precision import PACKED, HalfFloat, QuantType, StackPrecision

PrecisionName = StackPrecision
QUANTIZED = tuple(PACKED)  # stack precisions stored packed and frozen
RankPattern = Literal["constant", "increasing", "decreasing", "linear"]


class LoraStackSetting(Section):
    rank: PositiveInt = Field(description="This stack's adapter rank.")
    alpha: PositiveFloat | None = Field(None, description="Default: 2 x rank.")


class LoraConfig(Section):
    """LoRA through PEFT on every linear of a stack (q, k, v, o, gate, up, down)."""

    enabled: bool = Field(
        False,
        description="Add LoRA adapters: to an hf model, to each new stack of a progressive rack, "
        "or to every stack of an end-to-end rack (whose base weights then freeze).",
    )
    rank: PositiveInt = Field(
        8,
        description="The adapters' rank r; lora.strategy progressive scales it per stack by "
        "rank_pattern.",
    )
    alpha: PositiveFloat = Field(
        16.0, description="The adapters' scale: an adapter's update is multiplied by alpha / rank."
    )
    dropout: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="Dropout on the adapters' input, in training only; 0 disables it.",
    )
    strategy: Literal["simplified", "progressive", "variable"] = Field(
        "simplified",
        description="simplified: one rank; progressive: rank_pattern over stacks; variable: "
        "per_stack table.",
    )
    rank_pattern: RankPattern = Field(
        "constant",
        description="progressive: constant r, increasing r*2^k, decreasing r*2^(n-1-k), "
        "linear r*(k+1).",
    )
    alpha_pattern: RankPattern = Field(
        "constant",
        description="progressive: how alpha changes over the stacks, with rank_pattern's factors.",
    )
    per_stack: dict[int, LoraStackSetting] = Field(
        default_factory=dict,
        description="variable: {stack index: {rank, alpha}}; a stack not listed takes lora.rank "
        "and lora.alpha.",
    )
    trunk_adapters: bool = Field(
        False, description="progressive_qlora: one trainable adapter per trunk stack."
    )
    trunk_rank: PositiveInt = Field(
        4, description="trunk_adapters: the rank of each trunk stack's extra adapter."
    )
    trunk_alpha: PositiveFloat = Field(
        8.0, description="trunk_adapters: the alpha of each trunk stack's extra adapter."
    )
    target_modules: str | list[str] = Field(
        "all-linear",
        description="hf: module names to adapt; all-linear: every linear but the head.",
    )
    use_dora: bool = Field(
        False,
        description="hf: DoRA, which learns each weight's magnitude apart from its direction.",
    )
    use_rslora: bool = Field(
        False, description="hf: scale the adapters by alpha/sqrt(r) instead of alpha/r."
    )
    init_lora_weights: Literal["default", "gaussian", "pissa", "olora", "loftq"] = Field(
        "default",
        description="hf: how PEFT starts the adapters: default (B = 0), gaussian, pissa, olora, "
        "or loftq (needs load_in_4bit and a CUDA GPU).",
    )
    loraplus_lr_ratio: PositiveFloat | None = Field(
        None, description="LoRA+: the B matrices learn at this multiple of the LoRA LR."
    )
    modules_to_save: list[str] = Field(
        default_factory=list, description="hf: modules trained whole and saved with the adapter."
    )
    save_merged: bool = Field(
        False, description="hf: also write base + adapter merged into <run>/merged."
    )


class QuantConfig(Section):
    """How frozen weights are stored; adapters (LoRA) stay trainable on top."""

    enabled: bool = Field(
        False, description="Store frozen stacks quantized (the seeds' quantization_enabled)."
    )
    type: QuantType = Field(
        "nf4", description="The storage format (nf4, fp8, ...); 'nf_fp8' is read as fp8."
    )
    double_quant: bool = Field(False, description="nf4: quantize the block scales too.")
    backbone_quantized: bool = Field(
        True, description="Quantize each trunk stack to `type` once it is frozen."
    )
    adapters_full_precision: bool = Field(
        True, description="Keep LoRA weights in fp32 (false: bf16)."
    )


class CacheConfig(Section):
    """Trunk activation cache: append mode with a frozen trunk (the memory-light path)."""

    enabled: bool = Field(
        False,
        description="Cache the frozen trunk's outputs so later stages do not run it again; needs "
        "building_mode append and trunk_strategy frozen.",
    )
    storage: Literal["memory", "disk"] = Field("memory", description="disk: a memmap in dir.")
    dir: str | None = Field(None, description="disk storage folder; default <run>/cache.")
    dtype: HalfFloat = Field(
        "bf16",
        description="The float type cached activations are stored in; misses are rounded to it "
        "too.",
    )
    max_bytes: PositiveInt | None = Field(None, description="Byte budget; None = all samples.")
    on_full: Literal["evict", "error"] = Field("evict", description="evict: least recently used.")
    store_all_time_steps: bool = Field(
        False, description="diffusion with num_time_steps: one entry per sample and grid step."
    )
    time_step_cache_size: PositiveInt = Field(
        1, description="Masked variants (time steps / mask seeds) kept per sample."
    )
    mode: Literal["stack", "rack"] = Field(
        "stack", description="stack: the last trunk boundary; rack: every stack boundary."
    )


class GrowthConfig(Section):
    """How each new stack starts and when the rack grows (docs/growth.md)."""

    init: GrowthOperatorName = Field(
        "random",
        description="How a new stack's weights start: a registered growth operator (random, "
        "copy_last, copy_middle, stack_all, zero_out).",
    )
    noise: float = Field(
        0.0,
        ge=0.0,
        description="Gaussian noise added to the new stack's weight matrices after any "
        "operator, in units of model.init_std (breaks the symmetry of copies; 0: exact copies).",
    )
    schedule: Literal["fixed", "budget_share", "plateau"] = Field(
        "fixed",
        description="fixed: steps_per_stack (or max_steps split evenly); budget_share: "
        "train.max_steps split by `shares`; plateau: a stage ends when the validation loss "
        "stops improving, and its unused steps go to the next stage.",
    )
    shares: list[PositiveFloat] | None = Field(
        None,
        description="budget_share: one weight per stack (normalised); default: stack k gets "
        "a weight of k + 1, so deeper stages train longer.",
    )
    patience: PositiveInt = Field(
        2, description="plateau: evaluations without improvement before the rack grows."
    )
    min_delta: float = Field(
        0.0, ge=0.0, description="plateau: the smallest fall in val loss that counts."
    )


class StackOverride(Section):
    """Per-stack budget, LR and objective; unset fields follow the progressive defaults."""

    steps: PositiveInt | None = Field(
        None, description="This stack's stage length in optimizer steps."
    )
    epochs: PositiveFloat | None = Field(
        None,
        description="This stack's stage length in passes over the training data (instead of "
        "steps).",
    )
    lr: PositiveFloat | None = Field(
        None, description="This stack's peak learning rate, in place of train.lr."
    )
    objective: ObjectiveConfig | None = None
    masking: dict[str, Any] | None = Field(None, description="masking fields for this stack.")


class ProgressiveConfig(Section):
    strategy: Literal["end_to_end", "progressive"] = Field(
        "end_to_end", description="progressive grows the rack one stack at a time."
    )
    end_to_end_scope: Literal["rackwise", "stackwise"] = Field(
        "rackwise", description="stackwise: a detached local loss per stack via the shared head."
    )
    mode: Literal["blockwise", "layerwise", "fused"] = Field(
        "blockwise",
        description="layerwise: 1 block per stack; fused: then joint_tuning_steps on the rack.",
    )
    block_size: PositiveInt | None = Field(None, description="blockwise/fused: blocks per stack.")
    joint_tuning_steps: NonNegativeInt = Field(
        0,
        description="mode fused: optimizer steps of joint tuning of the whole rack after the last "
        "stage.",
    )
    target_stacks: PositiveInt | None = Field(
        None,
        description="The rack's final number of stacks; sets model.n_stacks (the seeds' "
        "target_stacks and max_stacks).",
    )
    building_mode: Literal["append", "prepend"] = Field(
        "append",
        description="append: each new stack goes after the trunk (next to the head); prepend: "
        "before it (next to the embeddings).",
    )
    trunk_strategy: Literal["frozen", "full", "qlora"] = Field(
        "frozen",
        description="frozen (+ cache.enabled): the memory-light path; qlora: quantized trunk "
        "adapted by LoRA, the adaptable path (no cache); full: the trunk trains too.",
    )
    head_policy: Literal["train_first", "always", "frozen"] = Field(
        "train_first",
        description="When the embeddings and head train: train_first (with stack 0, then frozen), "
        "always, or frozen.",
    )
    new_stack_precision: PrecisionName = Field(
        "full",
        description="qlora = nf4 + a LoRA adapter; nf4/fp8/nvfp4 train only LoRA. The seeds' "
        "'half' and 'bfloat16' are accepted for fp16 and bf16.",
    )
    steps_per_stack: PositiveInt | None = Field(
        None, description="Default: train.max_steps split evenly over the stacks."
    )
    epochs_per_stack: PositiveFloat | None = Field(
        None,
        description="Each stage's budget in passes over the training data, instead of "
        "steps_per_stack.",
    )
    stacks: dict[int, StackOverride] = Field(
        default_factory=dict,
        description="Overrides per stack, by growth index: {k: {steps or epochs, lr, objective, "
        "masking}}.",
    )
    time_interpretation: Literal["input", "depth"] = Field(
        "input",
        description="diffusion: input trains every stage on every noise level t; depth trains "
        "stack k on its own range of t (depth_mapping).",
    )
    depth_mapping: Literal["linear", "exponential", "custom"] = Field(
        "linear",
        description="depth: how t's range is split over the stacks: linear (equal widths), "
        "exponential (by depth_growth) or custom (depth_time_table).",
    )
    depth_growth: float = Field(2.0, gt=1.0, description="exponential: width ratio per stack.")
    time_per_stack: PositiveInt | None = Field(
        None, description="depth: grid steps per stack (needs masking.num_time_steps)."
    )
    depth_time_table: list[float | tuple[float, float]] | None = Field(
        None, description="custom: per stack a t or a [low, high] range in [0, 1]."
    )
    depth_order: Literal["low_to_high", "high_to_low"] = Field(
        "low_to_high",
        description="depth: high_to_low grows stack 0 at the highest noise and trains the stacks "
        "as one denoising chain, which sample.sampler single_pass runs in one pass.",
    )
    lr_schedule: Literal["per_stage", "global"] = Field(
        "per_stage",
        description="per_stage: each stage re-warms and decays on its own; global: one warmup "
        "and one decay (train.scheduler) over all stages' steps. With train.scheduler: wsd, "
        "global is warmup-stable-decay: a constant LR through growth, one decay at the end.",
    )
    save_stacks: bool = Field(
        True,
        description="Write stacks/stack_<k>.safetensors as each stack finishes; resuming a "
        "progressive run needs them.",
    )
    save_rack: bool = Field(
        True, description="Write the whole grown rack to model.safetensors at the end."
    )
    cache: CacheConfig = Field(default_factory=CacheConfig)
    growth: GrowthConfig = Field(default_factory=GrowthConfig)

    @field_validator("depth_time_table")
    @classmethod
    def _table(cls, v: list | None) -> list | None:
        for item in v or []:
            lo, hi = (item, item) if isinstance(item, float | int) else item
            if not 0.0 <= lo <= hi <= 1.0:
                raise ValueError("depth_time_table entries must be t or [low, high] in [0, 1]")
        return v
