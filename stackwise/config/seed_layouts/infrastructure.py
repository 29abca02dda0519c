"""Seed 001 (the training infrastructure): its `training:` section."""

from __future__ import annotations

from typing import Any

from stackwise.config.seed_layouts import Layout, SeedKey, fill, keys
from stackwise.launcher import fsdp_launch


def implied(given: dict[str, Any], data: dict[str, Any]) -> None:
    """A config in this seed's layout keeps its checkpoints as the seed lists them, with
    model.pt beside our files (unless the config says otherwise); a sharded run's are its
    shards (the seed's "FSDP variants"), gathered whole only at the end."""
    sharded = (data.get("parallel") or {}).get("strategy") == "fsdp"
    if not sharded and fsdp_launch() is None:
        fill(data, "train.consolidated_weights", True)


LAYOUT = Layout(
    seed="001",
    title="training infrastructure: the training: section",
    keys=keys(
        {
            "training.memory_lr": "train.group_lr.memory",
            "training.lora_lr": "train.group_lr.lora",
            "training.base_model_lr": "train.group_lr.base",
            "training.training_mode": "data.mode",
            "training.dataset_name": "data.dataset_name",
            "training.dataset_subset": "data.dataset_subset",
            "training.dataset_split": "data.dataset_split",
            "training.text_field": "data.text_field",
            "training.max_length": "data.seq_len",
            "training.distributed_strategy": "parallel.strategy",
            "training.num_gpus": "train.num_processes",
            "training.fsdp_sharding_strategy": "parallel.sharding",
            "training.batch_size": "train.batch_size",
            "training.gradient_accumulation_steps": "train.grad_accum_steps",
            "training.max_steps": "train.max_steps",
            "training.warmup_steps": "train.warmup_steps",
            "training.optimizer": "train.optimizer",
            "training.weight_decay": "train.weight_decay",
            "training.max_grad_norm": "train.max_grad_norm",
            "training.scheduler": "train.scheduler",
            "training.mixed_precision": SeedKey(
                "train.mixed_precision", None, "no, fp16 or bf16 (true: auto)"
            ),
            "training.save_precision": "train.save_precision",
            "training.gradient_checkpointing": "model.gradient_checkpointing",
            "training.save_steps": "train.save_steps",
            "training.eval_steps": "train.eval_every",
            "training.save_total_limit": "train.save_total_limit",
            "training.save_best_model": "train.save_best_model",
            "training.early_stopping": "train.early_stopping",
            "training.early_stopping_patience": "train.early_stopping_patience",
            "training.early_stopping_threshold": "train.early_stopping_threshold",
            "training.logging_steps": "logging.log_every",
            "training.log_to_wandb": "logging.log_to_wandb",
            "training.output_dir": "train.output_dir",
            "training.resume_from_checkpoint": "train.resume_from_checkpoint",
        }
    ),
    values={
        "data.mode": {"instruction_finetuning": "instruction"},
        "parallel.sharding": {
            "FULL_SHARD": "full_shard",
            "SHARD_GRAD_OP": "shard_grad_op",
            "HYBRID_SHARD": "hybrid_shard",
            "NO_SHARD": "no_shard",
        },
    },
    implied=implied,
)
