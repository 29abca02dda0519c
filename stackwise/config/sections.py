"""The config sections a plain run reads: model, data, objective, masking, train, logging, sample.

Field types and single-field checks live here; rules that relate fields are in
`stackwise.config.rules`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    field_validator,
    model_validator,
)

from stackwise.config.base import Section
from stackwise.config.moe import MoEConfig
from stackwise.config.names import ObjectiveName, ParallelizerName, SamplerName, ScheduleName
from stackwise.precision import MixedPrecision, ModelDtype, Storage4bit
from stackwise.registry import OBJECTIVES

# the model fields that make a rack's weights a different function
RACK_SHAPE_FIELDS = (
    "vocab_size",
    "d_model",
    "n_heads",
    "n_kv_heads",
    "n_stacks",
    "blocks_per_stack",
    "ffn_hidden",
    "max_seq_len",
    "rope_theta",
    "norm_eps",
    "tie_embeddings",
    "frozen_up_proj",
    "time_conditioning",
    "attention_bias",
)


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
    moe: MoEConfig = Field(default_factory=MoEConfig)
    time_conditioning: Literal["none", "sinusoidal", "learned"] = "none"
    init_std: PositiveFloat = 0.02
    gradient_checkpointing: bool = False
    attention_bias: bool = Field(
        False, description="Biases on q, k and v (Qwen2's attention); exported as Qwen2."
    )
    init_from_hf: str | None = Field(
        None,
        description="A local Llama checkpoint dir to start from: its shape, weights and "
        "tokenizer (layers grouped into stacks of blocks_per_stack).",
    )
    source: Literal["rack", "hf"] = Field(
        "rack", description="rack: StackWise's own model; hf: a Hugging Face causal LM."
    )
    model_name_or_path: str | None = Field(
        None, description="hf: a local model dir (or a hub name where a hub is reachable)."
    )
    dtype: ModelDtype = Field(
        "auto", description="hf: the base weights' dtype; auto: bf16 when training in bf16."
    )
    load_in_4bit: bool = Field(False, description="hf: NF4/FP4 base through bitsandbytes.")
    load_in_8bit: bool = Field(False, description="hf: int8 base through bitsandbytes.")
    quant_type_4bit: Literal["nf4", "fp4"] = "nf4"
    double_quant: bool = Field(True, description="4-bit: quantize the block scales too.")
    compute_dtype: ModelDtype = Field(
        "auto", description="4-bit: the matmul dtype; auto follows model.dtype."
    )
    quant_storage: Storage4bit = Field(
        "uint8", description="4-bit: the packed weights' storage dtype (bf16 for FSDP)."
    )
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = "sdpa"
    trust_remote_code: bool = Field(
        False, description="hf: run the model repo's own Python code; only for repos you trust."
    )

    @property
    def n_layers(self) -> int:
        return self.n_stacks * self.blocks_per_stack

    @property
    def ffn_width(self) -> int:
        if self.ffn_hidden is not None:
            return self.ffn_hidden
        return ((8 * self.d_model // 3) + 7) // 8 * 8


class MixSource(Section):
    """One source of a weighted mixture (data.mix): one of files, dataset_dir, dataset_name."""

    files: list[str] = Field(default_factory=list, description="Files or glob patterns.")
    dataset_dir: str | None = None
    dataset_name: str | None = None
    dataset_subset: str | None = None
    dataset_split: str = "train"
    weight: PositiveFloat = Field(1.0, description="Its share of the training blocks.")


class DataConfig(Section):
    source: Literal["shakespeare", "files"] = "shakespeare"
    files: list[str] = Field(default_factory=list, description="Local .txt/.jsonl/.json/.parquet")
    format: Literal["auto", "text", "json", "parquet"] = "auto"
    text_field: str | list[str] = "text"
    mix: list[MixSource] = Field(
        default_factory=list,
        description="pretraining, source: files: several sources, each drawn by its weight.",
    )
    mode: Literal["pretraining", "instruction"] = Field(
        "pretraining", description="instruction: chat/instruction rows, loss on the replies."
    )
    chat_format: Literal["auto", "messages", "sharegpt", "prompt_response", "alpaca", "text"] = (
        Field("auto", description="instruction: the rows' shape; auto detects it.")
    )
    chat_template: str | None = Field(
        None, description="instruction: a Jinja template (text or file) over the tokenizer's."
    )
    train_on: Literal["assistant", "all", "last_turn"] = "assistant"
    train_on_eos: Literal["turn", "last", "all", "none"] = Field(
        "turn", description="Which end-of-turn tokens are targets: turn = each trained reply's."
    )
    drop_unsupervised: bool = Field(
        False, description="Drop (and count) examples with no target token instead of failing."
    )
    packing: bool = Field(False, description="instruction: pack examples into rows of seq_len.")
    padding_free: Literal["auto"] | bool = Field(
        "auto",
        description="instruction: lay each batch's examples end to end in rows no longer than "
        "its longest (the same examples and loss, less padding); auto: on where checked safe.",
    )
    eval_files: list[str] = Field(
        default_factory=list, description="instruction: evaluation rows (else val_fraction)."
    )
    dataset_dir: str | None = Field(
        None, description="A save_to_disk folder (pretraining: with source: files, for files)."
    )
    dataset_name: str | None = Field(
        None, description="A hub dataset name (offline: from the local cache) or dataset folder."
    )
    dataset_subset: str | None = None
    dataset_split: str = "train"
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
    streaming: bool = Field(
        False,
        description="pretraining: read, tokenize and cut the corpus as training goes (no token "
        "store); in order, resumed at the recorded position.",
    )
    stream_val_blocks: PositiveInt = Field(
        32, description="streaming: the stream's first blocks, held out for validation."
    )

    @model_validator(mode="before")
    @classmethod
    def _files_mean_source_files(cls, data: Any) -> Any:
        """Naming pretraining data (files, a dataset, a mix) without data.source means source:
        files, so `data.files=[a.txt]` alone works; an explicit source is kept (and checked)."""
        named = ("files", "dataset_dir", "dataset_name", "mix")
        if not isinstance(data, dict) or "source" in data or data.get("mode") == "instruction":
            return data
        return {**data, "source": "files"} if any(data.get(n) for n in named) else data

    @field_validator("files", mode="before")
    @classmethod
    def _one_file(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v

    @field_validator("eval_files", mode="before")
    @classmethod
    def _one_eval_file(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v

    @property
    def text_fields(self) -> list[str]:
        """data.text_field as a list (one name or several, joined)."""
        return [self.text_field] if isinstance(self.text_field, str) else list(self.text_field)


class ObjectiveConfig(Section):
    name: ObjectiveName = "clm"
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
            return bool(OBJECTIVES.capabilities(self.name).causal)
        return self.attention == "causal"


class MaskingConfig(Section):
    mask_ratio: float | tuple[float, float] = Field(
        0.15, description="mlm: a ratio, or [low, high] drawn per example."
    )
    bert_mix: bool = Field(False, description="mlm: 80% mask, 10% random, 10% kept.")
    schedule: ScheduleName = "linear"
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


SchedulerName = Literal["linear", "cosine", "constant", "constant_with_warmup", "polynomial"]


class GroupLR(Section):
    """Absolute learning rates per named parameter group; None uses train.lr."""

    embeddings: PositiveFloat | None = None
    blocks: PositiveFloat | None = None
    head: PositiveFloat | None = None
    time: PositiveFloat | None = None
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
    max_steps: PositiveInt = 600
    num_train_epochs: PositiveFloat | None = Field(
        None, description="Set max_steps from the data: epochs x batches per epoch."
    )
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
    mixed_precision: MixedPrecision = Field(
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
    parallelizer: ParallelizerName = Field(
        "auto",
        description="How the model is placed on the run's processes: a registered parallelizer "
        "(ddp; manual: unwrapped, gradients averaged by hand); auto: ddp, or manual for local "
        "losses.",
    )

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
    run_name: str | None = Field(None, description="Default: <objective>-<timestamp>.")
    log_every: PositiveInt = 10
    console: bool = True
    jsonl: bool = True
    tensorboard: bool = True
    progress_bar: Literal["auto", "always", "never"] = "auto"
    log_to_wandb: bool = Field(False, description="W&B; WANDB_MODE=offline works without login.")
    wandb_project: str = "stackwise"


class SampleConfig(Section):
    """End-of-training samples, and the defaults of `stackwise generate`."""

    num_samples: NonNegativeInt = 2
    prompt: str = ""
    max_new_tokens: PositiveInt = 64
    temperature: NonNegativeFloat = 0.8
    top_k: NonNegativeInt = Field(0, description="Keep the k likeliest tokens; 0 disables.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling.")
    steps: PositiveInt = Field(32, description="mlm/diffusion: denoising steps.")
    sampler: SamplerName = Field(
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
    no_repeat_words: bool = Field(
        False,
        description="mlm/diffusion with a char or byte tokenizer: a word that repeats the word "
        "before it is masked again and redrawn.",
    )

    def resolved_sampler(self, objective: str) -> str:
        if self.sampler != "auto":
            return self.sampler
        return str(OBJECTIVES.capabilities(objective).default_sampler)  # auto
