"""Seed 004 (the model trainer): the flat keys of its `TrainingConfig`, its `default.json` and
its command-line flags (`stackwise finetune` takes the same names as flags)."""

from __future__ import annotations

from typing import Any

from stackwise.config.seed_layouts import Layout, SeedKey, keys

# read as lists where the seed gives one name
LISTS = frozenset({"data.files", "data.eval_files", "lora.target_modules"})
OMIT = object()  # a converted value that sets nothing (fp16: false leaves the choice to bf16)


def _as_list(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


def _precision(name: str) -> Any:
    def convert(value: Any) -> Any:
        if isinstance(value, bool):
            return name if value else OMIT
        return value

    return convert


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
    "lora_target_modules": SeedKey("lora.target_modules", _as_list),
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
    "deepspeed_config": "train.deepspeed_config",
    "fp16": SeedKey("train.mixed_precision", _precision("fp16"), "true: fp16 autocast"),
    "bf16": SeedKey("train.mixed_precision", _precision("bf16"), "true: bf16 autocast"),
}

LAYOUT = Layout(
    seed="004",
    title="model trainer: TrainingConfig(...) keywords, default.json, finetune flags",
    keys=keys(_FLAT),
)


def both_precisions_off(given: dict[str, Any]) -> bool:
    """fp16: false and bf16: false, neither true: the seed asks for fp32."""
    flags = [given[p] for p in ("fp16", "bf16") if p in given]
    return bool(flags) and all(v is False for v in flags)
