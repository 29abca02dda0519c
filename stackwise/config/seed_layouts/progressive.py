"""Seed 003 (the progressive training system): `training.progressive:` and the model keys its
builder reads."""

from __future__ import annotations

from stackwise.config.seed_layouts import Layout, SeedKey, boolean_to, keys

_P = "training.progressive."
LAYOUT = Layout(
    seed="003",
    title="progressive training system: the training.progressive: section",
    keys=keys(
        {
            f"{_P}enabled": SeedKey(
                "progressive.strategy",
                boolean_to("progressive", "end_to_end"),
                "true: grow stack by stack (strategy progressive)",
            ),
            f"{_P}trunk_strategy": "progressive.trunk_strategy",
            f"{_P}new_stack_precision": "progressive.new_stack_precision",
            f"{_P}cache_activations": "progressive.cache.enabled",
            f"{_P}qlora_enabled": "lora.enabled",
            f"{_P}qlora_rank": "lora.rank",
            f"{_P}qlora_alpha": "lora.alpha",
            f"{_P}qlora_strategy": "lora.strategy",
            f"{_P}qlora_rank_pattern": "lora.rank_pattern",
            f"{_P}qlora_alpha_pattern": "lora.alpha_pattern",
            f"{_P}qlora_configs": "lora.per_stack",
            f"{_P}progressive_qlora": "lora.trunk_adapters",
            f"{_P}progressive_qlora_rank": "lora.trunk_rank",
            f"{_P}progressive_qlora_alpha": "lora.trunk_alpha",
            f"{_P}max_stacks": "progressive.target_stacks",
            f"{_P}building_mode": "progressive.building_mode",
            f"{_P}time_interpretation": "progressive.time_interpretation",
            f"{_P}time_embedding_dim": "model.time_embedding_dim",
            f"{_P}time_encoding_type": "model.time_conditioning",
            f"{_P}stack_time_mapping": "progressive.depth_mapping",
            f"{_P}time_per_stack": "progressive.time_per_stack",
            f"{_P}training_objective": "objective.name",
            "model.d_ff": "model.ffn_hidden",
        }
    ),
    values={
        "progressive.new_stack_precision": {"half": "fp16", "float16": "fp16", "bfloat16": "bf16"}
    },
)
