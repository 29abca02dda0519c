"""The run's specs: data, objective and masking, optimisation and loop, logging, sampling."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class MixSourceSpec:
    files: tuple[str, ...] = ()
    dataset_dir: str | None = None
    dataset_name: str | None = None
    dataset_subset: str | None = None
    dataset_split: str = "train"
    weight: float = 1.0


@dataclass(frozen=True)
class DataSpec:
    source: str = "shakespeare"
    files: tuple[str, ...] = ()
    format: str = "auto"
    text_field: str | tuple[str, ...] = "text"
    mix: tuple[MixSourceSpec, ...] = ()
    mode: str = "pretraining"
    chat_format: str = "auto"
    chat_template: str | None = None
    train_on: str = "assistant"
    train_on_eos: str = "turn"
    drop_unsupervised: bool = False
    packing: bool = False
    padding_free: str | bool = "auto"
    eval_files: tuple[str, ...] = ()
    dataset_dir: str | None = None
    dataset_name: str | None = None
    dataset_subset: str | None = None
    dataset_split: str = "train"
    seq_len: int = 128
    num_samples: int | None = None
    val_fraction: float = 0.05
    tokenizer: str | None = None
    bpe_vocab_size: int = 2048
    bpe_sample_mb: float | None = 64.0
    cache_dir: str | None = None
    num_workers: int = 0
    streaming: bool = False
    stream_val_blocks: int = 32

    @property
    def text_fields(self) -> list[str]:
        """data.text_field as a list (one name or several, joined)."""
        return [self.text_field] if isinstance(self.text_field, str) else list(self.text_field)


@dataclass(frozen=True)
class ObjectiveSpec:
    """`causal` is resolved: attention auto follows the objective's own default."""

    name: str = "clm"
    attention: str = "auto"
    weighting: str = "elbo"
    random_length_ratio: float = 0.0
    causal: bool = True
    block_size: int | None = None
    block_shift: bool = True


@dataclass(frozen=True)
class MaskingSpec:
    mask_ratio: float | tuple[float, float] = 0.15
    bert_mix: bool = False
    schedule: str = "linear"
    eps: float = 1e-3
    antithetic: bool = True
    time_step_masking: bool | None = None
    num_time_steps: int | None = None
    time_step_bins: tuple[int, ...] | None = None
    time_step_mask_fractions: dict[int, float] | None = None


@dataclass(frozen=True)
class GroupLRSpec:
    embeddings: float | None = None
    blocks: float | None = None
    head: float | None = None
    time: float | None = None
    lora: float | None = None
    base: float | None = None
    trunk: float | None = None
    memory: float | None = None


DEFAULT_PATIENCE = 3  # train.early_stopping: true without early_stopping_patience


def stopping_patience(switch: bool | None, patience: int | None) -> int | None:
    """train.early_stopping with early_stopping_patience: the evals without improvement that
    stop a run, or None when early stopping is off (false; or unset without a patience)."""
    if switch is False:
        return None
    return patience or (DEFAULT_PATIENCE if switch else None)


@dataclass(frozen=True)
class TrainSpec:
    """The optimiser, the LR schedule and the loop. `max_steps` is resolved (epochs become
    steps at the door); `greater_is_better` is resolved from metric_for_best."""

    seed: int = 0
    max_steps: int = 600
    num_train_epochs: float | None = None
    batch_size: int = 16
    grad_accum_steps: int = 1
    lr: float = 2e-3
    group_lr: GroupLRSpec = GroupLRSpec()
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    adam_eps: float = 1e-8
    fused_adamw: bool | None = None
    optimizer: str = "adamw"
    max_grad_norm: float = 1.0
    scheduler: str = "cosine"
    warmup_steps: int = 0
    warmup_ratio: float | None = None
    min_lr_ratio: float = 0.0
    poly_power: float = 1.0
    decay_ratio: float = 0.2
    mixed_precision: str = "auto"
    save_precision: str | None = None
    consolidated_weights: bool = False
    compile: bool | None = None
    eval_every: int = 100
    eval_batches: int = 10
    output_dir: str | None = None
    overwrite_output_dir: bool = False
    save_steps: int = 0
    save_total_limit: int | None = None
    resume_from_checkpoint: str | None = None
    save_best_model: bool = False
    metric_for_best: str = "loss"
    greater_is_better: bool = False
    early_stopping: bool | None = None
    early_stopping_patience: int | None = None
    early_stopping_threshold: float = 0.0
    skip_nonfinite_steps: bool = False
    enabled_extensions: tuple[str, ...] = ()
    num_processes: int | None = None

    def stopping_patience(self) -> int | None:
        return stopping_patience(self.early_stopping, self.early_stopping_patience)

    def best_is_greater(self) -> bool:
        return self.greater_is_better


@dataclass(frozen=True)
class LoggingSpec:
    run_name: str | None = None
    log_every: int = 10
    console: bool = True
    jsonl: bool = True
    tensorboard: bool = True
    progress_bar: str = "auto"
    log_to_wandb: bool = False
    wandb_project: str = "stackwise"


@dataclass(frozen=True)
class SampleSpec:
    """`sampler` is resolved: auto becomes the objective's default sampler. `changed` names the
    fields the user set (a sampler reads a ranking rule only when it was asked for)."""

    num_samples: int = 2
    prompt: str = ""
    max_new_tokens: int = 64
    temperature: float = 0.8
    top_k: int = 0
    top_p: float = 1.0
    steps: int = 32
    sampler: str = "remask"
    remasking: str = "low_confidence"
    block_length: int = 0
    no_repeat_words: bool = False
    confidence_threshold: float = 0.9
    remask_budget: float = 0.05
    changed_fields: frozenset[str] = frozenset()

    def changed(self, name: str) -> bool:
        return name in self.changed_fields

    def with_changes(self, **values: Any) -> SampleSpec:
        from dataclasses import replace

        return replace(self, **values, changed_fields=self.changed_fields | set(values))
