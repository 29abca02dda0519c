"""The configuration schema: one pydantic tree, loaded from YAML/JSON plus dotted overrides.

Every field is consumed somewhere. Fields that only matter for some settings (say `mask_ratio`
with a causal objective) are refused when changed from their default while irrelevant, so a key
never silently does nothing.
"""

from __future__ import annotations

import copy
import difflib
import itertools
import json
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    field_validator,
    model_validator,
)

from stackwise.errors import StackWiseError

YAML_TRUE = frozenset({"yes", "on", "true"})
YAML_FALSE = frozenset({"no", "off", "false"})
QUOTE_HINT = (
    "YAML reads yes/no/on/off/true/false as booleans; to pass the word, quote it: "
    'key=\'"word"\' on the command line, key: "word" in a file'
)


def _string_choices(annotation: Any) -> tuple[str, ...]:
    """The string choices of a Literal field (also inside `Literal[...] | None`)."""
    if get_origin(annotation) is Literal:
        return tuple(a for a in get_args(annotation) if isinstance(a, str))
    return tuple(c for arg in get_args(annotation) for c in _string_choices(arg))


def _choice_for_bool(choices: tuple[str, ...], value: bool) -> str | None:
    """The one choice whose name YAML would read as `value` (`no` for False), if any."""
    words = YAML_TRUE if value else YAML_FALSE
    matches = [c for c in choices if c.lower() in words]
    return matches[0] if len(matches) == 1 else None


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @model_validator(mode="before")
    @classmethod
    def _yaml_booleans_as_choices(cls, data: Any) -> Any:
        """`mixed_precision: no` arrives from YAML as False: read it back as the choice `no`."""
        if not isinstance(data, dict):
            return data
        for name, value in list(data.items()):
            field = cls.model_fields.get(name)
            if field is None or not isinstance(value, bool):
                continue
            choice = _choice_for_bool(_string_choices(field.annotation), value)
            if choice is not None:
                data = {**data, name: choice}
        return data

    def changed(self, name: str) -> bool:
        """True when `name` differs from its default (robust to YAML round-trips)."""
        field = type(self).model_fields[name]
        return getattr(self, name) != field.get_default(call_default_factory=True)


class ModelConfig(Section):
    vocab_size: PositiveInt | None = Field(
        None, description="Vocabulary size; None takes it from the tokenizer."
    )
    d_model: PositiveInt = 128
    n_heads: PositiveInt = 4
    n_kv_heads: PositiveInt | None = Field(None, description="Key/value heads (GQA); None = MHA.")
    n_stacks: PositiveInt = 2
    blocks_per_stack: PositiveInt = 2
    ffn_hidden: PositiveInt | None = Field(None, description="SwiGLU width; None = ~8/3 d_model.")
    max_seq_len: PositiveInt = 256
    rope_theta: PositiveFloat = 10000.0
    norm_eps: PositiveFloat = 1e-5
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    tie_embeddings: bool = True
    frozen_up_proj: bool = Field(False, description="Freeze a random SwiGLU up-projection.")
    time_conditioning: Literal["none", "sinusoidal", "learned"] = "none"
    init_std: PositiveFloat = 0.02
    gradient_checkpointing: bool = False

    @model_validator(mode="after")
    def _shapes(self) -> ModelConfig:
        if self.d_model % self.n_heads:
            raise ValueError(
                f"n_heads ({self.n_heads}) must divide d_model ({self.d_model}); "
                "pick a head count such as 2, 4 or 8 that divides it"
            )
        if (self.d_model // self.n_heads) % 2:
            raise ValueError(
                f"head size d_model/n_heads = {self.d_model // self.n_heads} must be even for RoPE"
            )
        if self.n_kv_heads is not None and self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_kv_heads ({self.n_kv_heads}) must divide n_heads ({self.n_heads}) for GQA"
            )
        return self

    @property
    def n_layers(self) -> int:
        return self.n_stacks * self.blocks_per_stack

    @property
    def ffn_width(self) -> int:
        if self.ffn_hidden is not None:
            return self.ffn_hidden
        return ((8 * self.d_model // 3) + 7) // 8 * 8


class DataConfig(Section):
    source: Literal["shakespeare", "files"] = "shakespeare"
    files: list[str] = Field(default_factory=list, description="Local .txt/.jsonl/.json/.parquet")
    format: Literal["auto", "text", "json", "parquet"] = "auto"
    text_field: str | list[str] = "text"
    mode: Literal["pretraining"] = "pretraining"
    seq_len: PositiveInt = 128
    num_samples: PositiveInt | None = Field(None, description="Cap on training sequences.")
    val_fraction: float = Field(0.05, gt=0.0, le=0.5)
    tokenizer: str | None = Field(
        None,
        description=(
            "None trains a byte-level BPE on the corpus; `char` or `byte` builds a character- or "
            "byte-level tokenizer; anything else is a local HF tokenizer dir (./char for a dir "
            "named char)."
        ),
    )
    bpe_vocab_size: int = Field(2048, ge=300, le=65536)
    cache_dir: str | None = Field(None, description="Default: $STACKWISE_CACHE or ~/.cache.")
    num_workers: NonNegativeInt = 0

    @field_validator("files", mode="before")
    @classmethod
    def _one_file(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v

    @field_validator("mode", mode="before")
    @classmethod
    def _mode(cls, v: Any) -> Any:
        if v == "instruction":
            raise ValueError("instruction (chat) data is not supported yet; use mode: pretraining")
        return v

    @model_validator(mode="after")
    def _sources(self) -> DataConfig:
        if self.source == "files" and not self.files:
            raise ValueError("source 'files' needs data.files: [path, ...]")
        if self.source == "shakespeare":
            for name in ("files", "format", "text_field"):
                if self.changed(name):
                    raise ValueError(
                        f"data.{name} only applies to source: files (the built-in corpus is "
                        "plain text); set data.source: files or remove it"
                    )
        if self.tokenizer is not None and self.changed("bpe_vocab_size"):
            raise ValueError(
                "bpe_vocab_size only applies to the BPE trained when data.tokenizer is unset; "
                "remove one of them"
            )
        return self


class ObjectiveConfig(Section):
    name: Literal["clm", "mlm", "diffusion", "custom"] = "clm"
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

    @property
    def causal(self) -> bool:
        if self.attention == "auto":
            return self.name in ("clm", "custom")
        return self.attention == "causal"


class MaskingConfig(Section):
    mask_ratio: float | tuple[float, float] = Field(
        0.15, description="mlm: a ratio, or [low, high] drawn per example."
    )
    bert_mix: bool = Field(False, description="mlm: 80% mask, 10% random, 10% kept.")
    schedule: Literal["linear", "loglinear", "cosine", "table"] = "linear"
    eps: float = Field(1e-3, gt=0.0, lt=0.5, description="diffusion: t ~ U(eps, 1).")
    antithetic: bool = True
    num_time_steps: PositiveInt | None = Field(
        None, description="diffusion: draw t on a grid of this many steps."
    )
    time_step_mask_fractions: dict[int, float] | None = Field(
        None, description="schedule table: {step: mask fraction}, interpolated."
    )

    @field_validator("mask_ratio")
    @classmethod
    def _ratio(cls, v: float | tuple[float, float]) -> float | tuple[float, float]:
        lo, hi = (v, v) if isinstance(v, float | int) else v
        if not 0.0 < lo <= hi <= 1.0:
            raise ValueError(
                "mask_ratio must be in (0, 1], or [low, high] with 0 < low <= high <= 1"
            )
        return v

    @model_validator(mode="after")
    def _table(self) -> MaskingConfig:
        table = self.time_step_mask_fractions
        if self.schedule == "table":
            if not table or self.num_time_steps is None:
                raise ValueError(
                    "schedule 'table' needs num_time_steps and time_step_mask_fractions "
                    "(e.g. {0: 0.15, 5: 0.5, 9: 0.9})"
                )
            steps = sorted(table)
            if steps[0] < 0 or steps[-1] >= self.num_time_steps:
                raise ValueError(
                    f"time_step_mask_fractions steps must lie in 0..{self.num_time_steps - 1}"
                )
            fracs = [table[s] for s in steps]
            if any(not 0.0 < f <= 1.0 for f in fracs):
                raise ValueError("time_step_mask_fractions values must be in (0, 1]")
            if any(b < a for a, b in itertools.pairwise(fracs)):
                raise ValueError("time_step_mask_fractions must not decrease with the step")
        elif table is not None:
            raise ValueError("time_step_mask_fractions needs schedule: table")
        if self.num_time_steps is not None and self.schedule != "loglinear" and self.changed("eps"):
            raise ValueError(
                "masking.eps bounds continuous t; with num_time_steps t lies on a grid, so eps "
                "has no effect (except in the loglinear schedule); remove it"
            )
        return self


SchedulerName = Literal["linear", "cosine", "constant", "constant_with_warmup", "polynomial"]


class GroupLR(Section):
    """Absolute learning rates per named parameter group; None uses train.lr."""

    embeddings: PositiveFloat | None = None
    blocks: PositiveFloat | None = None
    head: PositiveFloat | None = None
    time: PositiveFloat | None = None
    lora: PositiveFloat | None = Field(None, description="Every LoRA adapter (the lora_lr).")
    trunk: PositiveFloat | None = Field(
        None,
        description="progressive, trunk_strategy full: the stacks grown before the current "
        "stage's new one (a lower LR keeps growth from undoing them).",
    )


class TrainConfig(Section):
    seed: int = Field(
        0, ge=0, le=2**31 - 1, description="Below 2^31: stages offset it modulo 2^31."
    )
    max_steps: PositiveInt = 600
    batch_size: PositiveInt = 16
    grad_accum_steps: PositiveInt = 1
    lr: PositiveFloat = 2e-3
    group_lr: GroupLR = Field(default_factory=GroupLR)
    weight_decay: NonNegativeFloat = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    adam_eps: PositiveFloat = 1e-8
    fused_adamw: bool = False
    max_grad_norm: NonNegativeFloat = Field(1.0, description="0 disables clipping.")
    scheduler: SchedulerName = "cosine"
    warmup_steps: NonNegativeInt = 0
    warmup_ratio: float | None = Field(None, ge=0.0, lt=1.0)
    min_lr_ratio: float = Field(0.0, ge=0.0, le=1.0, description="LR floor for decaying schedules.")
    poly_power: PositiveFloat = 1.0
    mixed_precision: Literal["auto", "no", "bf16", "fp16"] = Field(
        "auto", description="auto: bf16 where the hardware runs it natively, else fp32 (no)."
    )
    compile: bool = False
    eval_every: PositiveInt = 100
    eval_batches: PositiveInt = 10
    output_dir: str | None = Field(None, description="Default: outputs/<run_name>.")
    overwrite_output_dir: bool = False
    save_steps: NonNegativeInt = Field(
        0, description="Write output_dir/checkpoint-<step> every N steps; 0: none."
    )
    save_total_limit: PositiveInt | None = Field(
        None, description="Keep the N newest checkpoints (never deleting the best)."
    )
    resume_from_checkpoint: str | None = Field(
        None, description="'latest' (output_dir's pointer) or a checkpoint-<step> folder."
    )
    save_best_model: bool = Field(
        False, description="Checkpoint at every eval that improves metric_for_best."
    )
    metric_for_best: Literal["loss", "nelbo", "ppl", "ppl_bound", "accuracy"] = "loss"
    greater_is_better: bool | None = Field(
        None, description="Default: true for accuracy, false otherwise."
    )
    early_stopping_patience: PositiveInt | None = Field(
        None, description="Stop after N evals without improvement of metric_for_best."
    )
    early_stopping_threshold: NonNegativeFloat = Field(
        0.0, description="An improvement must exceed this to count."
    )
    skip_nonfinite_steps: bool = Field(
        False, description="Skip the update of a step whose loss or gradient is NaN/inf."
    )
    enabled_extensions: list[str] = Field(
        default_factory=list, description="Registered extensions to run (by name)."
    )

    @field_validator("betas")
    @classmethod
    def _betas(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not all(0.0 <= b < 1.0 for b in v):
            raise ValueError("betas must both lie in [0, 1)")
        return v

    @model_validator(mode="after")
    def _schedule(self) -> TrainConfig:
        if self.warmup_ratio is not None and self.warmup_steps:
            raise ValueError("set warmup_steps or warmup_ratio, not both")
        if self.scheduler == "constant":
            for name in ("warmup_steps", "warmup_ratio"):
                if self.changed(name):
                    raise ValueError(
                        f"scheduler 'constant' has no warmup; use "
                        f"'constant_with_warmup' or remove {name}"
                    )
        if self.scheduler in ("constant", "constant_with_warmup") and self.changed("min_lr_ratio"):
            raise ValueError(f"min_lr_ratio has no effect with scheduler '{self.scheduler}'")
        if self.scheduler != "polynomial" and self.changed("poly_power"):
            raise ValueError("poly_power only applies to scheduler: polynomial")
        tracks = self.save_best_model or self.early_stopping_patience is not None
        for name in ("metric_for_best", "greater_is_better"):
            if self.changed(name) and not tracks:
                raise ValueError(
                    f"{name} is read by save_best_model and early stopping; turn one of them on"
                )
        if self.changed("early_stopping_threshold") and self.early_stopping_patience is None:
            raise ValueError("early_stopping_threshold needs early_stopping_patience")
        if self.save_total_limit is not None and not (self.save_steps or self.save_best_model):
            raise ValueError(
                "save_total_limit rotates checkpoints, but none are written: set save_steps "
                "(or save_best_model)"
            )
        if self.save_steps > self.max_steps:
            raise ValueError(
                f"save_steps ({self.save_steps}) exceeds max_steps ({self.max_steps}), so no "
                "checkpoint would ever be written; lower it (0 turns checkpoints off)"
            )
        builtin = {
            "best_model": "save_best_model: true",
            "early_stopping": "early_stopping_patience",
            "console": "logging.console",
            "jsonl": "logging.jsonl",
            "tensorboard": "logging.tensorboard",
            "wandb": "logging.log_to_wandb",
            "progress_bar": "logging.progress_bar",
        }
        for name in self.enabled_extensions:
            if name in builtin:
                raise ValueError(
                    f"enabled_extensions lists the built-in '{name}', which its own setting "
                    f"turns on ({builtin[name]}); remove it from the list"
                )
        if len(set(self.enabled_extensions)) != len(self.enabled_extensions):
            raise ValueError("enabled_extensions lists an extension twice")
        if tracks and self.eval_every > self.max_steps:
            raise ValueError(
                f"save_best_model / early stopping act on evaluations, but eval_every "
                f"({self.eval_every}) exceeds max_steps ({self.max_steps}); lower eval_every"
            )
        return self


class LoggingConfig(Section):
    run_name: str | None = Field(None, description="Default: <objective>-<timestamp>.")
    log_every: PositiveInt = 10
    console: bool = True
    jsonl: bool = True
    tensorboard: bool = True
    progress_bar: Literal["auto", "always", "never"] = "auto"
    log_to_wandb: bool = Field(False, description="W&B; WANDB_MODE=offline works without login.")
    wandb_project: str = "stackwise"

    @model_validator(mode="after")
    def _wandb(self) -> LoggingConfig:
        if self.changed("wandb_project") and not self.log_to_wandb:
            raise ValueError("wandb_project needs log_to_wandb: true")
        if self.log_to_wandb:
            import importlib.util

            if importlib.util.find_spec("wandb") is None:
                raise ValueError(
                    "log_to_wandb is on but wandb is not installed: pip install wandb (set "
                    "WANDB_MODE=offline to log without an account), or turn it off"
                )
        return self


class SampleConfig(Section):
    """End-of-training samples, and the defaults of `stackwise generate`."""

    num_samples: NonNegativeInt = 2
    prompt: str = ""
    max_new_tokens: PositiveInt = 64
    temperature: NonNegativeFloat = 0.8
    top_k: NonNegativeInt = Field(0, description="Keep the k likeliest tokens; 0 disables.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling.")
    steps: PositiveInt = Field(32, description="mlm/diffusion: denoising steps.")
    sampler: Literal["auto", "ancestral", "remask", "single_pass"] = Field(
        "auto",
        description="mlm/diffusion. auto: ancestral (MDLM) for diffusion, remask for mlm; "
        "single_pass: one pass through a rack grown with depth_order high_to_low.",
    )
    remasking: Literal["low_confidence", "random", "entropy", "margin"] = Field(
        "low_confidence", description="remask: which masked positions are revealed first."
    )
    block_length: NonNegativeInt = Field(
        0, description="mlm/diffusion: fill blocks of this many tokens left to right; 0: one."
    )

    def resolved_sampler(self, objective: str) -> str:
        if self.sampler != "auto":
            return self.sampler
        return "ancestral" if objective == "diffusion" else "remask"


PrecisionName = Literal["full", "bf16", "fp16", "nf4", "fp8", "nvfp4", "qlora"]
QUANTIZED = ("nf4", "fp8", "nvfp4", "qlora")
RankPattern = Literal["constant", "increasing", "decreasing", "linear"]


class LoraStackSetting(Section):
    rank: PositiveInt
    alpha: PositiveFloat | None = Field(None, description="Default: 2 x rank.")


class LoraConfig(Section):
    """LoRA through PEFT on every linear of a stack (q, k, v, o, gate, up, down)."""

    enabled: bool = False
    rank: PositiveInt = 8
    alpha: PositiveFloat = 16.0
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
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
    alpha_pattern: RankPattern = "constant"
    per_stack: dict[int, LoraStackSetting] = Field(default_factory=dict)
    trunk_adapters: bool = Field(
        False, description="progressive_qlora: one trainable adapter per trunk stack."
    )
    trunk_rank: PositiveInt = 4
    trunk_alpha: PositiveFloat = 8.0

    @model_validator(mode="after")
    def _relevance(self) -> LoraConfig:
        if not self.enabled:
            for name in type(self).model_fields:
                if name != "enabled" and self.changed(name):
                    raise ValueError(f"lora.{name} needs lora.enabled: true")
        if self.strategy != "progressive":
            for name in ("rank_pattern", "alpha_pattern"):
                if self.changed(name):
                    raise ValueError(f"lora.{name} needs lora.strategy: progressive")
        if self.strategy != "variable" and self.per_stack:
            raise ValueError("lora.per_stack needs lora.strategy: variable")
        if self.strategy == "variable" and not self.per_stack:
            raise ValueError("lora.strategy 'variable' needs lora.per_stack: {stack: {rank: r}}")
        if not self.trunk_adapters:
            for name in ("trunk_rank", "trunk_alpha"):
                if self.changed(name):
                    raise ValueError(f"lora.{name} needs lora.trunk_adapters: true")
        return self


class QuantConfig(Section):
    """How frozen weights are stored; adapters (LoRA) stay trainable on top."""

    enabled: bool = Field(False, description="quantization_enabled")
    type: Literal["nf4", "fp8", "nvfp4", "fp16", "bf16", "fp32"] = Field(
        "nf4", description="quantization_type; 'nf_fp8' is accepted as an alias of fp8."
    )
    double_quant: bool = Field(False, description="nf4: quantize the block scales too.")
    backbone_quantized: bool = Field(
        True, description="Quantize each trunk stack to `type` once it is frozen."
    )
    adapters_full_precision: bool = Field(
        True, description="Keep LoRA weights in fp32 (false: bf16)."
    )

    @field_validator("type", mode="before")
    @classmethod
    def _alias(cls, v: Any) -> Any:
        return "fp8" if v == "nf_fp8" else v

    @model_validator(mode="after")
    def _relevance(self) -> QuantConfig:
        if not self.enabled:
            for name in type(self).model_fields:
                if name != "enabled" and self.changed(name):
                    raise ValueError(f"quant.{name} needs quant.enabled: true")
        if self.type != "nf4" and self.changed("double_quant"):
            raise ValueError("quant.double_quant applies to type nf4 only")
        return self


class CacheConfig(Section):
    """Trunk activation cache: append mode with a frozen trunk (the memory-light path)."""

    enabled: bool = False
    storage: Literal["memory", "disk"] = Field("memory", description="disk: a memmap in dir.")
    dir: str | None = Field(None, description="disk storage folder; default <run>/cache.")
    dtype: Literal["bf16", "fp16"] = "bf16"
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


class StackOverride(Section):
    """Per-stack budget, LR and objective; unset fields follow the progressive defaults."""

    steps: PositiveInt | None = None
    epochs: PositiveFloat | None = None
    lr: PositiveFloat | None = None
    objective: ObjectiveConfig | None = None
    masking: dict[str, Any] | None = Field(None, description="masking fields for this stack.")

    @model_validator(mode="after")
    def _budget(self) -> StackOverride:
        if self.steps is not None and self.epochs is not None:
            raise ValueError("a stack override takes steps or epochs, not both")
        return self


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
    joint_tuning_steps: NonNegativeInt = 0
    building_mode: Literal["append", "prepend"] = "append"
    trunk_strategy: Literal["frozen", "full", "qlora"] = Field(
        "frozen",
        description="frozen (+ cache.enabled): the memory-light path; qlora: quantized trunk "
        "adapted by LoRA, the adaptable path (no cache); full: the trunk trains too.",
    )
    head_policy: Literal["train_first", "always", "frozen"] = "train_first"
    new_stack_precision: PrecisionName = Field(
        "full",
        description="qlora = nf4 + a LoRA adapter; nf4/fp8/nvfp4 train only LoRA. The seeds' "
        "'half' and 'bfloat16' are accepted for fp16 and bf16.",
    )
    steps_per_stack: PositiveInt | None = Field(
        None, description="Default: train.max_steps split evenly over the stacks."
    )
    epochs_per_stack: PositiveFloat | None = None
    stacks: dict[int, StackOverride] = Field(default_factory=dict)
    time_interpretation: Literal["input", "depth"] = "input"
    depth_mapping: Literal["linear", "exponential", "custom"] = "linear"
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
        description="per_stage: each stage warms up and decays on its own; global: one warmup "
        "and one decay over all stages' steps, so growth never re-warms the LR.",
    )
    save_stacks: bool = True
    save_rack: bool = True
    cache: CacheConfig = Field(default_factory=CacheConfig)

    @field_validator("new_stack_precision", mode="before")
    @classmethod
    def _precision_alias(cls, v: Any) -> Any:
        return {"half": "fp16", "bfloat16": "bf16", "float16": "fp16"}.get(v, v)

    @field_validator("depth_time_table")
    @classmethod
    def _table(cls, v: list | None) -> list | None:
        for item in v or []:
            lo, hi = (item, item) if isinstance(item, float | int) else item
            if not 0.0 <= lo <= hi <= 1.0:
                raise ValueError("depth_time_table entries must be t or [low, high] in [0, 1]")
        return v

    def _check_chain(self) -> None:
        """What a denoising chain (depth_order high_to_low) cannot combine with."""
        why = None
        if self.building_mode != "append":
            why = "building_mode: append (each stack continues the one grown before it)"
        elif self.mode == "fused":
            why = "no joint tuning (mode fused tunes the whole rack on every noise level)"
        elif self.cache.enabled:
            why = "no activation cache (the trunk sees its own, further-masked inputs)"
        if why:
            raise ValueError(f"progressive.depth_order: high_to_low needs {why}")
        table = self.depth_time_table
        if table is not None:
            tops = [e if isinstance(e, float | int) else e[1] for e in table]
            if any(b >= a for a, b in itertools.pairwise(tops)):
                raise ValueError(
                    "progressive.depth_order: high_to_low needs depth_time_table ranges whose "
                    f"tops decrease stack by stack (stack 0 the noisiest); got {tops}"
                )

    @model_validator(mode="after")
    def _consistent(self) -> ProgressiveConfig:
        grown = (
            "mode",
            "block_size",
            "joint_tuning_steps",
            "building_mode",
            "trunk_strategy",
            "head_policy",
            "new_stack_precision",
            "steps_per_stack",
            "epochs_per_stack",
            "stacks",
            "time_interpretation",
            "lr_schedule",
            "cache",
        )
        if self.strategy == "end_to_end":
            for name in grown:
                if self.changed(name):
                    raise ValueError(
                        f"progressive.{name} only applies to strategy: progressive; set "
                        "progressive.strategy: progressive or remove it"
                    )
        elif self.changed("end_to_end_scope"):
            raise ValueError("progressive.end_to_end_scope only applies to strategy: end_to_end")
        if (
            self.strategy == "progressive"
            and not self.save_stacks
            and (self.new_stack_precision != "full" or self.trunk_strategy == "qlora")
        ):
            raise ValueError(
                "stacks stored as bf16/fp16 or quantized are rebuilt from their stack files on "
                "load; keep save_stacks: true"
            )
        if not (self.save_rack or self.save_stacks):
            raise ValueError(
                "with save_rack and save_stacks both false nothing would be saved; keep one"
            )
        if self.steps_per_stack is not None and self.epochs_per_stack is not None:
            raise ValueError("set progressive.steps_per_stack or epochs_per_stack, not both")
        if (self.mode == "fused") != (self.joint_tuning_steps > 0):
            raise ValueError(
                "mode 'fused' means progressive growth followed by joint_tuning_steps (> 0) of "
                "whole-rack tuning; set both, or neither"
            )
        if self.mode == "layerwise" and self.changed("block_size"):
            raise ValueError("mode 'layerwise' has one block per stack; remove block_size")
        if self.time_interpretation != "depth":
            for name in (
                "depth_mapping",
                "depth_growth",
                "time_per_stack",
                "depth_time_table",
                "depth_order",
            ):
                if self.changed(name):
                    raise ValueError(f"progressive.{name} needs time_interpretation: depth")
        else:
            if self.depth_mapping != "linear" and self.time_per_stack is not None:
                raise ValueError(
                    "progressive.time_per_stack sets linear widths; use depth_mapping: linear"
                )
            if self.depth_mapping != "exponential" and self.changed("depth_growth"):
                raise ValueError("progressive.depth_growth needs depth_mapping: exponential")
            if (self.depth_mapping == "custom") != (self.depth_time_table is not None):
                raise ValueError(
                    "depth_mapping 'custom' takes its times from depth_time_table; set both "
                    "(a callable mapping is available from the Python API)"
                )
            if self.depth_order == "high_to_low":
                self._check_chain()
        c = self.cache
        if c.enabled:
            if self.building_mode != "append" or self.trunk_strategy != "frozen":
                raise ValueError(
                    "the activation cache stores a frozen trunk's output before the new stack, "
                    "so it needs building_mode: append and trunk_strategy: frozen (frozen + "
                    "cache is the memory-light path; 'qlora' and 'full' keep adapting the trunk, "
                    "so its activations cannot be cached)"
                )
            if self.head_policy == "always":
                raise ValueError(
                    "with head_policy 'always' the embeddings keep training, so cached trunk "
                    "activations would go stale; use train_first or frozen, or disable the cache"
                )
        else:
            for name in type(c).model_fields:
                if name != "enabled" and c.changed(name):
                    raise ValueError(f"progressive.cache.{name} needs progressive.cache.enabled")
        if c.storage != "disk" and c.changed("dir"):
            raise ValueError("progressive.cache.dir needs cache.storage: disk")
        if c.max_bytes is None and c.changed("on_full"):
            raise ValueError("progressive.cache.on_full needs a cache.max_bytes budget")
        if c.store_all_time_steps and c.changed("time_step_cache_size"):
            raise ValueError(
                "store_all_time_steps keeps every grid step; remove time_step_cache_size"
            )
        return self


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

    @model_validator(mode="before")
    @classmethod
    def _stack_shape(cls, data: Any) -> Any:
        """progressive.mode layerwise/blockwise set model.blocks_per_stack (one source of truth)."""
        if not isinstance(data, dict):
            return data
        prog = data.get("progressive") or {}
        if not isinstance(prog, dict):
            return data
        mode, size = prog.get("mode", "blockwise"), prog.get("block_size")
        want = 1 if mode == "layerwise" else size
        if want is None:
            return data
        model = dict(data.get("model") or {})
        given = model.get("blocks_per_stack")
        if given is not None and given != want:
            raise ValueError(
                f"progressive.mode {mode} means blocks_per_stack={want}, but model.blocks_per_stack"
                f" is {given}; remove one of them"
            )
        model["blocks_per_stack"] = want
        return {**data, "model": model}

    @model_validator(mode="after")
    def _sampling(self) -> Config:
        """Sampling settings that the rack's kind would ignore are refused."""
        sm = self.sample
        if self.objective.causal:
            for name in ("steps", "sampler", "remasking", "block_length"):
                if sm.changed(name):
                    default = type(sm).model_fields[name].get_default()
                    raise ValueError(
                        f"sample.{name} only applies to masked (mlm/diffusion) racks; this rack "
                        f"samples left to right. Remove it, or set sample.{name}={default} (its "
                        "default) when overriding a preset"
                    )
        elif sm.resolved_sampler(self.objective.name) == "ancestral" and sm.changed("remasking"):
            raise ValueError(
                "sample.remasking only applies to sampler: remask (ancestral reveals positions "
                "at random, as the reverse process says); set sample.sampler: remask or remove it"
            )
        if sm.sampler == "single_pass":
            p = self.progressive
            if p.strategy != "progressive" or p.depth_order != "high_to_low":
                raise ValueError(
                    "sample.sampler: single_pass runs a rack grown as a denoising chain, one "
                    "stack per step; it needs progressive.strategy: progressive with "
                    "time_interpretation: depth and depth_order: high_to_low"
                )
            for name in ("steps", "block_length"):
                if sm.changed(name):
                    default = type(sm).model_fields[name].get_default()
                    raise ValueError(
                        f"sample.{name} does not apply to sampler single_pass: it takes one "
                        f"step per stack over the whole generation; remove it, or set "
                        f"sample.{name}={default} (its default) when overriding a preset"
                    )
        return self

    @model_validator(mode="after")
    def _progressive(self) -> Config:
        p, c, name = self.progressive, self.progressive.cache, self.objective.name
        if p.time_interpretation == "depth" and name != "diffusion":
            raise ValueError(
                "time_interpretation 'depth' ties the diffusion time step to the stack; it "
                f"needs objective 'diffusion', not '{name}'"
            )
        lo, q = self.lora, self.quant
        budget = p.steps_per_stack or p.epochs_per_stack
        if p.strategy == "progressive" and budget and self.train.changed("max_steps"):
            raise ValueError(
                "train.max_steps has no effect when progressive.steps_per_stack or "
                "epochs_per_stack sets each stack's budget; change those (or "
                "progressive.stacks.<k>.steps) instead"
            )
        if (lo.enabled or q.enabled) and not p.save_stacks:
            raise ValueError(
                "quantized or LoRA stacks are rebuilt from their stack files on load; keep "
                "progressive.save_stacks: true"
            )
        if p.end_to_end_scope == "stackwise" and self.train.compile:
            raise ValueError(
                "train.compile does not apply to end_to_end_scope 'stackwise', which runs the "
                "stacks one by one; remove one of them"
            )
        if p.strategy == "end_to_end" and (lo.enabled or q.enabled):
            raise ValueError(
                "lora and quant apply to the stacks of a progressive run (progressive.strategy: "
                "progressive); an end-to-end rack trains all its weights"
            )
        prec = p.new_stack_precision
        if prec in ("nf4", "fp8", "nvfp4", "qlora") and not lo.enabled:
            raise ValueError(
                f"new_stack_precision '{prec}' stores the new stack's weights frozen and trains "
                "a LoRA adapter on them; set lora.enabled: true (rank, alpha) or use full/bf16"
            )
        fp16_store = prec == "fp16" or (q.enabled and q.type == "fp16")
        if fp16_store and (p.trunk_strategy == "full" or p.mode == "fused"):
            raise ValueError(
                "fp16 storage (new_stack_precision or quant.type) applies to stacks once they "
                "are trained, but trunk_strategy 'full' or mode 'fused' keeps training them, and "
                "fp16 weights diverge without loss scaling; use bf16 there"
            )
        stack_adapters = prec in QUANTIZED
        if lo.enabled and not (stack_adapters or lo.trunk_adapters):
            raise ValueError(
                f"lora.enabled adapts frozen weights, but new stacks of precision '{prec}' train "
                "all their weights and no trunk adapters are on, so LoRA would do nothing: set "
                "progressive.new_stack_precision to qlora/nf4/fp8/nvfp4 (stack adapters) or "
                "lora.trunk_adapters: true"
            )
        if lo.enabled and not stack_adapters:
            for name in ("rank", "alpha", "strategy"):
                if lo.changed(name):
                    raise ValueError(
                        f"lora.{name} sets the stack adapters, which only quantized new stacks "
                        f"(new_stack_precision qlora/nf4/fp8/nvfp4) have; with '{prec}' use "
                        "lora.trunk_rank / trunk_alpha"
                    )
        if p.trunk_strategy == "qlora" and not (lo.enabled and lo.trunk_adapters):
            raise ValueError(
                "trunk_strategy 'qlora' quantizes the frozen trunk and trains one LoRA adapter "
                "per trunk stack: set lora.enabled: true and lora.trunk_adapters: true (use "
                "'frozen' with cache.enabled for the memory-light path)"
            )
        if p.cache.enabled and self.objective.random_length_ratio > 0:
            raise ValueError(
                "objective.random_length_ratio cuts sequences at random, but the activation cache "
                "stores the trunk's output for whole sequences; disable progressive.cache or set "
                "random_length_ratio: 0"
            )
        if lo.trunk_adapters and p.cache.enabled:
            raise ValueError(
                "lora.trunk_adapters keeps adapting the trunk, so its activations cannot be "
                "cached; disable progressive.cache or the trunk adapters"
            )
        if lo.trunk_adapters and p.trunk_strategy == "full":
            raise ValueError("lora.trunk_adapters adapt a frozen trunk; trunk_strategy is 'full'")
        if q.enabled and p.trunk_strategy == "full" and q.backbone_quantized:
            raise ValueError(
                "quant.backbone_quantized stores frozen trunk stacks quantized, but "
                "trunk_strategy 'full' keeps training them; use frozen or qlora"
            )
        if (
            q.enabled
            and not q.backbone_quantized
            and p.trunk_strategy != "qlora"
            and (prec not in ("nf4", "fp8", "nvfp4"))
        ):
            raise ValueError(
                "quant.enabled with backbone_quantized: false quantizes nothing here; "
                "set backbone_quantized, trunk_strategy: qlora, or a quantized "
                "new_stack_precision"
            )
        new_storage = {"full": "fp32", "qlora": "nf4"}.get(prec, prec)
        if q.enabled and q.backbone_quantized and p.strategy == "progressive":
            if new_storage in ("nf4", "fp8", "nvfp4") and q.type != new_storage:
                raise ValueError(
                    f"new stacks are stored as {new_storage} from birth and are not "
                    f"re-quantized, so quant.type '{q.type}' would never apply; set quant.type: "
                    f"{new_storage} or another new_stack_precision"
                )
            same = q.type == new_storage and not (q.type == "nf4" and q.double_quant)
            if same and p.trunk_strategy != "qlora":  # qlora: type is the trunk's format
                raise ValueError(
                    f"new stacks are already stored as {new_storage}, so quant.type "
                    f"'{q.type}' changes nothing when they freeze; pick another quant.type or "
                    "disable quant"
                )
        if p.trunk_strategy == "qlora" and q.enabled and not q.backbone_quantized:
            raise ValueError(
                "trunk_strategy 'qlora' stores the trunk quantized by definition, so "
                "quant.backbone_quantized: false contradicts it; for an unquantized trunk "
                "adapted by LoRA use trunk_strategy: frozen with lora.trunk_adapters: true"
            )
        if p.strategy == "progressive" and self.model.n_stacks == 1:
            trunk_bits = {
                "trunk_strategy 'qlora'": p.trunk_strategy == "qlora",
                "lora.trunk_adapters": lo.trunk_adapters,
                "quant.backbone_quantized": q.enabled and q.backbone_quantized,
            }
            on = [k for k, v in trunk_bits.items() if v]
            if on:
                raise ValueError(
                    f"{on[0]} acts on the trunk, but with model.n_stacks 1 there never is one; "
                    "grow more stacks or remove it"
                )
        if self.train.group_lr.lora is not None and not lo.enabled:
            raise ValueError("train.group_lr.lora (the lora_lr) needs lora.enabled: true")
        if q.changed("adapters_full_precision") and not lo.enabled:
            raise ValueError("quant.adapters_full_precision needs lora.enabled: true")
        if lo.strategy == "variable":
            bad = [k for k in lo.per_stack if not 0 <= k < self.model.n_stacks]
            if bad:
                raise ValueError(
                    f"lora.per_stack has stack {bad[0]}; stacks are 0..{self.model.n_stacks - 1}"
                )
        if p.end_to_end_scope == "stackwise" and self.model.n_stacks < 2:
            raise ValueError(
                "end_to_end_scope 'stackwise' gives each stack its own loss; with one stack it "
                "equals rackwise. Set model.n_stacks >= 2 or remove it"
            )
        steps = self.masking.num_time_steps
        if p.time_per_stack is not None and steps is None:
            raise ValueError("progressive.time_per_stack counts grid steps: set num_time_steps")
        if p.strategy == "progressive" and p.time_interpretation == "depth":
            n = self.model.n_stacks
            if p.depth_time_table is not None and len(p.depth_time_table) < n:
                raise ValueError(
                    f"depth_time_table has {len(p.depth_time_table)} entries for {n} stacks"
                )
            if p.time_per_stack is not None and steps is not None and p.time_per_stack * n > steps:
                raise ValueError(
                    f"time_per_stack={p.time_per_stack} x {n} stacks exceeds num_time_steps={steps}"
                )
            top = 1.0
            if p.time_per_stack is not None and steps is not None:
                top = p.time_per_stack * n / steps
            elif p.depth_time_table is not None:
                ends = [e if isinstance(e, float | int) else e[1] for e in p.depth_time_table[:n]]
                top = max(ends)
            if top < 1.0 - 1e-9:
                raise ValueError(
                    f"with time as depth the stacks cover noise levels up to t={top:g} only, but "
                    "sampling starts from full noise (t=1): no stack would be trained for it. "
                    "Make the last stack's range reach 1"
                )
            if p.depth_order == "high_to_low" and self.model.time_conditioning != "none":
                raise ValueError(
                    "progressive.depth_order: high_to_low gives each stack its noise level by its "
                    "place in the chain; set model.time_conditioning: none"
                )
            if self.model.time_conditioning == "learned" and p.head_policy != "always":
                raise ValueError(
                    "a learned time embedding freezes with the anchor after stack 0 "
                    f"(head_policy {p.head_policy}), so with time as depth its rows outside "
                    "stack 0's noise range would never train. Use time_conditioning "
                    "sinusoidal or none, or head_policy always"
                )
        if c.store_all_time_steps and (name != "diffusion" or steps is None):
            raise ValueError(
                "cache.store_all_time_steps keeps one entry per grid step: it needs objective "
                "'diffusion' with masking.num_time_steps"
            )
        if c.enabled and name == "clm" and c.changed("time_step_cache_size"):
            raise ValueError("clm inputs are never masked: time_step_cache_size must stay 1")
        for idx, over in p.stacks.items():
            if not 0 <= idx < self.model.n_stacks:
                raise ValueError(
                    f"progressive.stacks has an entry for stack {idx}; stacks are numbered "
                    f"0..{self.model.n_stacks - 1}"
                )
            if over.objective is not None and over.objective.causal != self.objective.causal:
                raise ValueError(
                    f"progressive.stacks.{idx}.objective changes the attention direction; a "
                    "stack override must keep the rack's causal/bidirectional attention"
                )
            try:
                stack_config(self, idx)
            except ValidationError as err:
                raise ValueError(
                    f"progressive.stacks.{idx} makes an invalid config: "
                    + _format_validation(err, f"stack {idx}").removesuffix(
                        ". Fix the value and rerun."
                    )
                ) from None
        return self

    @model_validator(mode="after")
    def _relevance(self) -> Config:
        name = self.objective.name
        m = self.masking
        only = {
            "mlm": ("mask_ratio", "bert_mix"),
            "diffusion": (
                "schedule",
                "eps",
                "antithetic",
                "num_time_steps",
                "time_step_mask_fractions",
            ),
        }
        for owner, fields in only.items():
            for f in fields:
                if name != owner and m.changed(f):
                    raise ValueError(
                        f"masking.{f} only applies to objective '{owner}', not '{name}'; "
                        "remove it or change objective.name"
                    )
        if name != "diffusion" and self.objective.changed("weighting"):
            raise ValueError("objective.weighting only applies to objective 'diffusion'")
        tc = self.model.time_conditioning
        if tc != "none" and name != "diffusion":
            raise ValueError(
                f"model.time_conditioning '{tc}' feeds the diffusion time step; it needs "
                "objective 'diffusion'"
            )
        if tc == "learned" and m.num_time_steps is None:
            raise ValueError("time_conditioning 'learned' needs masking.num_time_steps (its table)")
        p = self.progressive
        if self.train.group_lr.trunk is not None and (
            p.strategy != "progressive" or p.trunk_strategy != "full"
        ):
            raise ValueError(
                "train.group_lr.trunk sets the LR of a trunk that trains: it needs "
                "progressive.strategy: progressive with trunk_strategy: full (a frozen trunk "
                "does not train; a qlora trunk trains its adapters, at group_lr.lora)"
            )
        if tc == "none" and self.train.group_lr.time is not None:
            raise ValueError("train.group_lr.time needs model.time_conditioning other than none")
        if self.model.tie_embeddings and self.train.group_lr.head is not None:
            raise ValueError(
                "train.group_lr.head needs an untied head; the tied head shares the embeddings' "
                "LR (set group_lr.embeddings, or model.tie_embeddings: false)"
            )
        if self.train.output_dir is not None and self.logging.run_name is not None:
            raise ValueError(
                "logging.run_name names the default output dir outputs/<run_name>; with "
                "train.output_dir set it would have no effect. Set one of them"
            )
        resume, p = self.train.resume_from_checkpoint, self.progressive
        if resume is not None and p.strategy == "progressive" and not p.save_stacks:
            raise ValueError(
                "resuming a progressive run regrows its finished stacks from their stack files; "
                "it needs progressive.save_stacks: true"
            )
        if resume is not None and p.strategy == "progressive" and resume != "latest":
            raise ValueError(
                "a progressive run resumes as a whole: set train.resume_from_checkpoint: latest "
                "with train.output_dir naming the run (each stage resumes from its own latest "
                "checkpoint)"
            )
        if resume not in (None, "latest") and self.logging.run_name is not None:
            raise ValueError(
                "resuming from a checkpoint folder continues that run in its own folder, so "
                "logging.run_name would have no effect; remove it"
            )
        if resume == "latest" and self.train.output_dir is None and self.logging.run_name is None:
            raise ValueError(
                "train.resume_from_checkpoint 'latest' looks in the run's output dir; set "
                "train.output_dir (or logging.run_name) to the run to resume"
            )
        metric = self.train.metric_for_best
        diffusion_only = metric in ("nelbo", "ppl_bound")
        if (diffusion_only and name != "diffusion") or (metric == "ppl" and name == "diffusion"):
            raise ValueError(
                f"train.metric_for_best '{metric}' is not reported for objective '{name}' "
                "(diffusion reports nelbo and ppl_bound; clm and mlm report ppl; all report loss "
                "and accuracy)"
            )
        if self.data.seq_len > self.model.max_seq_len:
            raise ValueError(
                f"data.seq_len ({self.data.seq_len}) exceeds model.max_seq_len "
                f"({self.model.max_seq_len}); raise max_seq_len or shorten seq_len"
            )
        return self

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


def stack_config(config: Config, index: int) -> Config:
    """The config stack `index` trains with: its objective/masking/LR overrides applied.

    Budgets (steps, epochs) are resolved by the progressive trainer, which knows the data size.
    """
    over = config.progressive.stacks.get(index)
    if over is None:
        return config
    data = config.model_dump(mode="json")
    data["progressive"]["stacks"] = {}
    if over.objective is not None:
        data["objective"] = over.objective.model_dump(mode="json")
    if over.masking is not None:
        data["masking"] = {**data["masking"], **over.masking}
    if over.lr is not None:
        data["train"]["lr"] = over.lr
    return Config.model_validate(data)


# ---------------------------------------------------------------------------------------------
# Loading


def _field_names(model: type[BaseModel]) -> list[str]:
    return list(model.model_fields)


def _check_keys(data: Any, model: type[BaseModel], path: str = "") -> None:
    """Reject unknown keys with a nearest-match hint before pydantic sees them."""
    if not isinstance(data, dict):
        return
    names = _field_names(model)
    for key, value in data.items():
        where = f"{path}{key}"
        if not isinstance(key, str) or key not in names:
            hint = difflib.get_close_matches(str(key), names, n=1, cutoff=0.5)
            # also search one level down, so `blocks_per_stack` at top level finds model.*
            if not hint and not path:
                for sec in names:
                    sub = model.model_fields[sec].annotation
                    if isinstance(sub, type) and issubclass(sub, BaseModel):
                        close = difflib.get_close_matches(str(key), _field_names(sub), 1, 0.7)
                        if close:
                            hint = [f"{sec}.{close[0]}"]
                            break
            suggestion = f" — did you mean '{hint[0]}'?" if hint else ""
            valid = ", ".join(names)
            raise StackWiseError(
                f"Unknown config key '{where}'{suggestion} Valid keys here: {valid}."
            )
        sub = model.model_fields[key].annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            _check_keys(value, sub, f"{where}.")


def _format_validation(err: ValidationError, origin: str) -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"] if not str(p).startswith("function-"))
        msg = e["msg"].removeprefix("Value error, ")
        given = e.get("input")
        shown = "" if isinstance(given, dict) else f" (got {given!r})"
        if isinstance(given, bool):
            shown += f" ({QUOTE_HINT})"
        parts.append(f"{loc or 'config'}: {msg}{shown}")
    return f"Invalid config in {origin}: " + "; ".join(parts) + ". Fix the value and rerun."


# The seeds' flat names, accepted at the top level or inside `progressive:` (where the seeds put
# them) and moved to their section. Giving both the alias and the real key is refused.
SEED_ALIASES: dict[str, str] = {
    "quantization_enabled": "quant.enabled",
    "quantization_type": "quant.type",
    "backbone_quantized": "quant.backbone_quantized",
    "adapters_full_precision": "quant.adapters_full_precision",
    "mixed_precision": "train.mixed_precision",
    "new_stack_precision": "progressive.new_stack_precision",
    "qlora_enabled": "lora.enabled",
    "use_lora": "lora.enabled",
    "qlora_rank": "lora.rank",
    "lora_r": "lora.rank",
    "qlora_alpha": "lora.alpha",
    "lora_alpha": "lora.alpha",
    "lora_dropout": "lora.dropout",
    "qlora_strategy": "lora.strategy",
    "qlora_rank_pattern": "lora.rank_pattern",
    "qlora_alpha_pattern": "lora.alpha_pattern",
    "qlora_configs": "lora.per_stack",
    "progressive_qlora": "lora.trunk_adapters",
    "progressive_qlora_rank": "lora.trunk_rank",
    "progressive_qlora_alpha": "lora.trunk_alpha",
    "lora_lr": "train.group_lr.lora",
    "eval_steps": "train.eval_every",
    "log_to_wandb": "logging.log_to_wandb",
}


def _apply_aliases(data: dict[str, Any]) -> dict[str, Any]:
    data = copy.deepcopy(data)  # never write into the caller's nested dicts
    for where in ("", "progressive.", "train."):
        holder = data if not where else data.get(where[:-1])
        if not isinstance(holder, dict):
            continue
        for alias in [k for k in holder if k in SEED_ALIASES]:
            target = SEED_ALIASES[alias]
            if where and target == f"{where}{alias}":
                continue  # already its real place
            value = holder.pop(alias)
            *sections, leaf = target.split(".")
            node = data
            for sec in sections:
                if not isinstance(node.get(sec), dict):
                    node[sec] = {}
                node = node[sec]
            if leaf in node:
                raise StackWiseError(
                    f"Config sets both '{where}{alias}' and '{target}' (its documented alias); "
                    "keep one of them."
                )
            node[leaf] = value
    return data


def from_dict(data: Any, origin: str = "config") -> Config:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise StackWiseError(
            f"{origin} must be a mapping of sections (model:, data:, train: ...), "
            f"but it holds a {type(data).__name__}."
        )
    data = _apply_aliases(data)
    _check_keys(data, Config)
    try:
        return Config.model_validate(data)
    except ValidationError as err:
        raise StackWiseError(_format_validation(err, origin)) from None


def read_file(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise StackWiseError(f"Config file '{path}' does not exist. Check the path.")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise StackWiseError(f"Cannot read config file '{path}': {err}.") from None
    try:
        data = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError) as err:
        where = str(err).replace("\n", " ")
        raise StackWiseError(
            f"Config file '{path}' is not valid {'JSON' if path.suffix == '.json' else 'YAML'}: "
            f"{where}. Fix the syntax and rerun."
        ) from None
    return data if data is not None else {}


def parse_override(item: str) -> tuple[list[str], Any]:
    """`train.lr=1e-3` -> (['train', 'lr'], 0.001); the value is read as YAML."""
    if "=" not in item:
        raise StackWiseError(
            f"Override '{item}' is not of the form section.key=value (e.g. train.max_steps=50)."
        )
    key, raw = item.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise StackWiseError(f"Override key '{key}' is malformed; use section.key=value.")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return parts, value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for item in overrides:
        parts, value = parse_override(item)
        node = data
        for p in parts[:-1]:
            child = node.get(p)
            if child is None:
                child = node[p] = {}
            if not isinstance(child, dict):
                raise StackWiseError(f"Override '{item}': '{p}' is a value, not a section.")
            node = child
        node[parts[-1]] = value
    return data


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    data = read_file(path) if path is not None else {}
    origin = str(path) if path is not None else "defaults"
    if overrides:
        if not isinstance(data, dict):
            return from_dict(data, origin)
        data = apply_overrides(data, overrides)
        origin += " + overrides"
    return from_dict(data, origin)


def save_config(config: Config, path: str | Path) -> None:
    Path(path).write_text(config.to_yaml(), encoding="utf-8")
