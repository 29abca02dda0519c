"""Seed 000 (the unified training module): `TrainingConfig`'s flat keyword keys, its nested
`progressive=` and `qlora.*` options, at the top level of a config."""

from __future__ import annotations

from stackwise.config.seed_layouts import Layout, SeedKey, boolean_to, keys

LAYOUT = Layout(
    seed="000",
    title="unified training module: TrainingConfig(...) keywords",
    keys=keys(
        {
            "mode": "progressive.mode",
            "block_size": "progressive.block_size",
            "strategy": "progressive.strategy",
            "end_to_end_scope": "progressive.end_to_end_scope",
            "progressive.target_stacks": "progressive.target_stacks",
            "time_step_masking": "masking.time_step_masking",
            "num_time_steps": "masking.num_time_steps",
            "time_step_bins": "masking.time_step_bins",
            "time_step_mask_fractions": "masking.time_step_mask_fractions",
            "store_all_time_steps": "progressive.cache.store_all_time_steps",
            "time_step_cache_size": "progressive.cache.time_step_cache_size",
            "quantization_enabled": "quant.enabled",
            "quantization_type": "quant.type",
            "mixed_precision": SeedKey(
                "train.mixed_precision",
                boolean_to("auto", "no"),
                "true: the best precision this device runs (auto); false: fp32",
            ),
            "backbone_quantized": "quant.backbone_quantized",
            "adapters_full_precision": "quant.adapters_full_precision",
            "qlora_enabled": "lora.enabled",
            "qlora_rank": "lora.rank",
            "qlora_alpha": "lora.alpha",
            "qlora.enabled": "lora.enabled",
            "qlora.rank": "lora.rank",
            "qlora.alpha": "lora.alpha",
            "qlora.dropout": "lora.dropout",
            "qlora.lr": "train.group_lr.lora",
            "qlora.progressive_enabled": "lora.trunk_adapters",
            "qlora.strategy": "lora.strategy",
            "cache_mode": "progressive.cache.mode",
            "cache_dir": "progressive.cache.dir",
            "save_stacks": "progressive.save_stacks",
            "save_rack": "progressive.save_rack",
        }
    ),
    values={"quant.type": {"nf_fp8": "fp8"}},
)
