"""Seed 004 (the model trainer): the flat keys of its `TrainingConfig`, its `default.json` and
its command-line flags. `stackwise finetune` and `python -m stackwise.fronts.model_trainer`
take the same names as flags, from this one table."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stackwise.config.seed_layouts import NOT_SEED, Layout, SeedKey, fill, keys

OMIT = object()  # a converted value that sets nothing (fp16: false leaves the choice to bf16)
PRECISION = ("fp16", "bf16")  # the two flat switches of train.mixed_precision
TRUE, FALSE = (
    frozenset({"true", "1", "yes", "y", "on"}),
    frozenset({"false", "0", "no", "n", "off"}),
)
DEFAULT_LR = 2e-4  # a fine-tuning LR (train.lr's own default, 2e-3, suits training from scratch)
# what a config in this layout means unless it says otherwise: a Hugging Face model, fine-tuned
# with LoRA on instruction rows (a missing train.lr and length are filled in by fine_tune_defaults)
FINE_TUNE = (("model.source", "hf"), ("data.mode", "instruction"), ("lora.enabled", True))


@dataclass(frozen=True)
class _AsList:
    """A list key that takes one name as a list of one (but `keep`, a word the key takes
    as it is: lora.target_modules' all-linear)."""

    keep: str | None = None

    def __call__(self, value: Any) -> Any:
        return [value] if isinstance(value, str) and value != self.keep else value

    def reverse(self, value: Any) -> Any:
        return value


def switch_value(value: Any) -> Any:
    """A switch's value as a bool where it spells one (`"False"`, 1, `yes`), else as given."""
    if isinstance(value, str) and value.strip().lower() in TRUE | FALSE:
        return value.strip().lower() in TRUE
    if isinstance(value, int) and not isinstance(value, bool) and value in (0, 1):
        return bool(value)
    return value


@dataclass(frozen=True)
class _Precision:
    """fp16/bf16: true asks for that autocast; false leaves the choice to the other switch
    (both false: fp32, see both_precisions_off)."""

    name: str

    def __call__(self, value: Any) -> Any:
        value = switch_value(value)
        if isinstance(value, bool):
            return self.name if value else OMIT
        return value  # train.mixed_precision's own check names the problem

    def reverse(self, value: Any) -> Any:
        return True if value == self.name else NOT_SEED


_as_list = _AsList()


_FLAT: dict[str, str | SeedKey] = {
    "model_name_or_path": "model.model_name_or_path",
    "train_file": SeedKey("data.files", _as_list),
    "eval_file": SeedKey("data.eval_files", _as_list),
    "dataset_dir": "data.dataset_dir",
    "dataset_name": "data.dataset_name",
    "dataset_subset": "data.dataset_subset",
    "dataset_split": "data.dataset_split",
    "use_lora": "lora.enabled",
    "load_in_4bit": "model.load_in_4bit",
    "load_in_8bit": "model.load_in_8bit",
    "gradient_checkpointing": "model.gradient_checkpointing",
    "attn_implementation": "model.attn_implementation",
    "trust_remote_code": "model.trust_remote_code",
    "num_train_epochs": "train.num_train_epochs",
    "max_steps": "train.max_steps",
    "learning_rate": "train.lr",
    "train_batch_size": "train.batch_size",
    "per_device_train_batch_size": "train.batch_size",
    "gradient_accumulation_steps": "train.grad_accum_steps",
    "output_dir": "train.output_dir",
    "lora_r": "lora.rank",
    "lora_alpha": "lora.alpha",
    "lora_dropout": "lora.dropout",
    "lora_target_modules": SeedKey("lora.target_modules", _AsList(keep="all-linear")),
    "lora_lr": "train.group_lr.lora",
    "memory_lr": "train.group_lr.memory",
    "base_model_lr": "train.group_lr.base",
    "loraplus_lr_ratio": "lora.loraplus_lr_ratio",
    "use_dora": "lora.use_dora",
    "use_rslora": "lora.use_rslora",
    "save_merged": "lora.save_merged",
    "max_seq_length": "data.seq_len",
    "packing": "data.packing",
    "chat_template": "data.chat_template",
    "train_on": "data.train_on",
    "warmup_ratio": "train.warmup_ratio",
    "warmup_steps": "train.warmup_steps",
    "weight_decay": "train.weight_decay",
    "max_grad_norm": "train.max_grad_norm",
    "lr_scheduler_type": "train.scheduler",
    "early_stopping_patience": "train.early_stopping_patience",
    "early_stopping_threshold": "train.early_stopping_threshold",
    "eval_steps": "train.eval_every",
    "save_steps": "train.save_steps",
    "save_total_limit": "train.save_total_limit",
    "logging_steps": "logging.log_every",
    "seed": "train.seed",
    "resume_from_checkpoint": "train.resume_from_checkpoint",
    "use_wandb": "logging.log_to_wandb",
    "wandb_project": "logging.wandb_project",
    "wandb_name": SeedKey("logging.run_name", None, "the run's name, in W&B too"),
    "run_name": "logging.run_name",
    "distributed_strategy": "parallel.strategy",
    "fsdp_sharding_strategy": "parallel.sharding",
    "deepspeed_config": "parallel.deepspeed_config",
    "fp16": SeedKey("train.mixed_precision", _Precision("fp16"), "true: fp16 autocast"),
    "bf16": SeedKey("train.mixed_precision", _Precision("bf16"), "true: bf16 autocast"),
}


def both_precisions_off(given: dict[str, Any]) -> bool:
    """fp16: false and bf16: false, neither true: the seed asks for fp32."""
    flags = [switch_value(given[p]) for p in PRECISION if p in given]
    return bool(flags) and all(v is False for v in flags)


def fine_tune_defaults(data: dict[str, Any]) -> dict[str, Any]:
    """`data` (plain config data, changed in place) with what a seed-004 config means where it
    does not say: FINE_TUNE's keys, train.lr DEFAULT_LR, and one epoch unless train.max_steps
    or train.num_train_epochs is set. Applied by `stackwise finetune` to every config, and by
    the loaders to any config that names a flat `model_name_or_path`."""
    for path, value in (*FINE_TUNE, ("train.lr", DEFAULT_LR)):
        fill(data, path, value)
    train = data["train"]
    if "max_steps" not in train and "num_train_epochs" not in train:
        train["num_train_epochs"] = 1.0
    return data


def _implied(given: dict[str, Any], data: dict[str, Any]) -> None:
    """A flat model_name_or_path (with a value) marks a seed-004 config: a fine-tune."""
    if given.get("model_name_or_path"):
        fine_tune_defaults(data)


LAYOUT = Layout(
    seed="004",
    title="model trainer: TrainingConfig(...) keywords, default.json, finetune flags",
    keys=keys(_FLAT),
    implied=_implied,
)
