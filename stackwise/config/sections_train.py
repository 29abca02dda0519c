"""The train and logging sections: optimizer, schedule, checkpoints, best-model tracking,
and where a run reports."""

from __future__ import annotations

import difflib
from typing import Any, Literal

from pydantic import (
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    field_validator,
)

from stackwise.config.base import Section
from stackwise.precision import MixedPrecision
from stackwise.spec.run import DEFAULT_PATIENCE, stopping_patience

SchedulerName = Literal["linear", "cosine", "constant", "constant_with_warmup", "polynomial", "wsd"]


class GroupLR(Section):
    """Absolute learning rates per named parameter group; None uses train.lr."""

    embeddings: PositiveFloat | None = Field(
        None, description="The token embeddings (the head too when model.tie_embeddings)."
    )
    blocks: PositiveFloat | None = Field(
        None, description="Every stack's blocks: attention, MLP and their norms."
    )
    head: PositiveFloat | None = Field(
        None, description="The final norm and an untied output head."
    )
    time: PositiveFloat | None = Field(
        None, description="The time embedding (model.time_conditioning)."
    )
    lora: PositiveFloat | None = Field(None, description="Every LoRA adapter (the lora_lr).")
    base: PositiveFloat | None = Field(
        None, description="hf: the base model's trained weights (modules_to_save, full tuning)."
    )
    trunk: PositiveFloat | None = Field(
        None,
        description="progressive, trunk_strategy full: the stacks grown before the current "
        "stage's new one (a lower LR keeps growth from undoing them).",
    )
    memory: PositiveFloat | None = Field(
        None, description="The memory layers (the memory_lr), routers included."
    )


class TrainConfig(Section):
    seed: int = Field(
        0, ge=0, le=2**31 - 1, description="Below 2^31: stages offset it modulo 2^31."
    )
    max_steps: PositiveInt = Field(
        600,
        description="Optimizer steps to train; progressive stages share them unless given budgets "
        "of their own.",
    )
    num_train_epochs: PositiveFloat | None = Field(
        None, description="Set max_steps from the data: epochs x batches per epoch."
    )
    batch_size: PositiveInt = Field(
        16,
        description="Sequences per micro-batch on each process; a step takes batch_size x "
        "grad_accum_steps x processes.",
    )
    grad_accum_steps: PositiveInt = Field(
        1,
        description="Micro-batches whose gradients add up before each optimizer step: a larger "
        "batch in the same memory.",
    )
    lr: PositiveFloat = Field(
        2e-3,
        description="Peak learning rate, reached after warmup; train.group_lr gives parameter "
        "groups their own.",
    )
    group_lr: GroupLR = Field(default_factory=GroupLR)
    weight_decay: NonNegativeFloat = Field(
        0.1,
        description="Weight decay on weight matrices only, not on norms, biases or other "
        "1-d parameters.",
    )
    betas: tuple[float, float] = Field(
        (0.9, 0.95),
        description="Adam's decay rates for the gradient's first and second moments, "
        "each in [0, 1).",
    )
    adam_eps: PositiveFloat = Field(
        1e-8, description="Adam's epsilon, added to the denominator for numerical stability."
    )
    fused_adamw: bool | None = Field(
        None,
        description="torch's fused Adam(W) kernel. None (auto): on wherever it takes every "
        "parameter (plain CPU/GPU tensors; off for FSDP2 and DeepSpeed); true/false force it.",
    )
    optimizer: Literal["adamw", "adam"] = Field(
        "adamw",
        description="adamw: decoupled weight decay; adam: weight decay as L2 in the gradient.",
    )
    max_grad_norm: NonNegativeFloat = Field(
        1.0, description="Clip the gradients' global norm to this; 0 disables clipping."
    )
    scheduler: SchedulerName = Field(
        "cosine",
        description="The LR's shape: linear, cosine or polynomial decay to min_lr_ratio x lr "
        "after warmup; wsd (see decay_ratio); constant_with_warmup; constant (no warmup).",
    )
    warmup_steps: NonNegativeInt = Field(
        0,
        description="Optimizer steps over which the LR rises linearly from 0 to its peak; 0: no "
        "warmup.",
    )
    warmup_ratio: float | None = Field(
        None,
        ge=0.0,
        lt=1.0,
        description="Warmup as a share of max_steps (rounded up); give it or warmup_steps, not "
        "both.",
    )
    min_lr_ratio: float = Field(0.0, ge=0.0, le=1.0, description="LR floor for decaying schedules.")
    poly_power: PositiveFloat = Field(
        1.0, description="polynomial: the decay's exponent; 1.0 decays linearly."
    )
    decay_ratio: float = Field(
        0.2,
        gt=0.0,
        le=1.0,
        description="wsd (warmup-stable-decay): the share of the steps, at the end, over which "
        "the LR falls linearly to its floor; it is constant before.",
    )
    mixed_precision: MixedPrecision = Field(
        "auto",
        description="auto: bf16 where the hardware runs it natively, else fp32 (no). fp16 is "
        "for CUDA GPUs; on a CPU it runs as auto, with a note.",
    )
    save_precision: Literal["fp32", "fp16", "bf16"] | None = Field(
        None,
        description="The dtype of the weights a finished run writes (and each checkpoint's "
        "model.pt); None: as trained. Checkpoints keep full weights for resuming.",
    )
    consolidated_weights: bool = Field(
        False,
        description="Also write model.pt into each checkpoint: the whole model's state dict, "
        "for torch.load(weights_only=True) (seed 001's layout; it doubles a checkpoint's size).",
    )
    compile: bool | None = Field(
        None,
        description="torch.compile the rack's blocks (regionally). None (auto): on for a "
        "single-process run of a plain rack with at least 1000 steps where a compiler is "
        "available, else off with the reason in the run's header; true/false force it.",
    )
    eval_every: PositiveInt = Field(
        100, description="Evaluate on the validation data every N optimizer steps."
    )
    eval_batches: PositiveInt = Field(
        10,
        description="Validation batches (of batch_size) each evaluation scores: the same fixed "
        "batches every time.",
    )
    output_dir: str | None = Field(None, description="Default: outputs/<run_name>.")
    overwrite_output_dir: bool = Field(
        False,
        description="Let the run replace an earlier StackWise run in output_dir; a folder of "
        "other files is never written into.",
    )
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
    metric_for_best: Literal["loss", "nelbo", "ppl", "ppl_bound", "accuracy"] = Field(
        "loss",
        description="The validation metric save_best_model and early stopping follow: loss (nats "
        "per token), ppl or accuracy; nelbo and ppl_bound for the diffusion objectives.",
    )
    greater_is_better: bool | None = Field(
        None, description="Default: true for accuracy, false otherwise."
    )
    early_stopping: bool | None = Field(
        None,
        description=f"Stop when metric_for_best stalls. None: on when early_stopping_patience "
        f"is set; false: off whatever the patience; true: on, patience default {DEFAULT_PATIENCE}.",
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
    num_processes: PositiveInt | None = Field(
        None,
        description="The process count the run expects; a launch with another count is refused "
        "(None: any).",
    )

    strategy_options: dict[str, Any] = Field(
        default_factory=dict,
        description="Settings of a training strategy of your own (register_training_strategy); "
        "it reads each as an attribute of its config (strategy_options: {curriculum_stages: "
        "[...]} is config.curriculum_stages). StackWise's strategies read none: refused there.",
    )

    def __getattr__(self, name: str) -> Any:
        """A strategy option, read as an attribute; any other unknown name is an error."""
        options = self.__dict__.get("strategy_options") or {}
        if name in options:
            return options[name]
        if name.startswith("_"):
            return super().__getattr__(name)  # type: ignore[misc]
        raise AttributeError(
            f"train has no key '{name}', and train.strategy_options does not set it (it sets: "
            f"{', '.join(sorted(options)) or 'nothing'})"
        )

    def __setattr__(self, name: str, value: Any) -> None:
        if name in type(self).model_fields or name.startswith("_"):
            super().__setattr__(name, value)
            return
        near = difflib.get_close_matches(name, list(type(self).model_fields), n=1)
        raise AttributeError(
            f"train has no key '{name}'"
            + (f" (did you mean '{near[0]}'?)" if near else "")
            + f"; a setting of your own strategy goes in train.strategy_options "
            f"(training_config.strategy_options['{name}'] = ...)"
        )

    def stopping_patience(self) -> int | None:
        """Evals without improvement before early stopping; None: it is off."""
        return stopping_patience(self.early_stopping, self.early_stopping_patience)

    def best_is_greater(self) -> bool:
        """Whether a larger metric_for_best is better (greater_is_better, or its default)."""
        if self.greater_is_better is not None:
            return self.greater_is_better
        return self.metric_for_best == "accuracy"

    @field_validator("betas")
    @classmethod
    def _betas(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not all(0.0 <= b < 1.0 for b in v):
            raise ValueError("betas must both lie in [0, 1)")
        return v


class LoggingConfig(Section):
    run_name: str | None = Field(
        None,
        description="Names the default output dir outputs/<run_name> and the W&B run. Default: "
        "<objective>-<timestamp>.",
    )
    log_every: PositiveInt = Field(
        10, description="Log the training metrics every N optimizer steps (and at the last one)."
    )
    console: bool = Field(True, description="Print each logged row as a line on the console.")
    jsonl: bool = Field(
        True,
        description="Append each logged row to <output_dir>/metrics.jsonl (which stackwise report "
        "reads).",
    )
    tensorboard: bool = Field(
        True, description="Write TensorBoard event files to <output_dir>/tensorboard."
    )
    progress_bar: Literal["auto", "always", "never"] = Field(
        "auto",
        description="A tqdm bar with loss, LR and tokens/s; auto shows it only when stdout is a "
        "terminal.",
    )
    log_to_wandb: bool = Field(False, description="W&B; WANDB_MODE=offline works without login.")
    wandb_project: str = Field(
        "stackwise", description="The W&B project the run logs to (with log_to_wandb)."
    )
