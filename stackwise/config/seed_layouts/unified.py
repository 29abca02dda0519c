"""Seed 000 (the unified training module): `TrainingConfig`'s flat keyword keys, its nested
`progressive=` and `qlora.*` options, at the top level of a config.

What the seed's keys mean together (`implied`, applied only where the config leaves the key
unset): a training `mode` or `block_size` grows the rack stage by stage (progressive.strategy:
progressive); `time_step_masking: true` trains the masked objective that draws time steps
(objective diffusion); QLoRA with quantization on a grown rack keeps adapting the frozen,
quantized trunk through its adapters (trunk_strategy qlora); naming a `cache_mode` or
`cache_dir` turns the activation cache on (a `cache_dir` stores it on disk).
"""

from __future__ import annotations

from typing import Any

from stackwise.config.seed_layouts import Layout, SeedKey, boolean_to, fill, get_path, keys


def implied(given: dict[str, Any], data: dict[str, Any]) -> None:
    """What seed 000's keys imply, set where `data` leaves it unset (see the module doc)."""
    named = {k for k, v in given.items() if v is not None}
    if named & {"mode", "block_size"}:
        fill(data, "progressive.strategy", "progressive")
    if given.get("time_step_masking") is True:
        fill(data, "objective.name", "diffusion")
    if named & {"cache_mode", "cache_dir"}:
        fill(data, "progressive.cache.enabled", True)
    if "cache_dir" in named:
        fill(data, "progressive.cache.storage", "disk")
    _trunk_qlora(given, data)


def _trunk_qlora(given: dict[str, Any], data: dict[str, Any]) -> None:
    """The seed's QLoRA with quantization on a grown rack: the frozen trunk is stored
    quantized and keeps training its adapters (trunk_strategy qlora)."""
    qlora = any(given.get(k) is True for k in ("qlora_enabled", "qlora.enabled"))
    quantized = get_path(data, "quant.enabled") is True
    if qlora and quantized and get_path(data, "progressive.strategy") == "progressive":
        fill(data, "progressive.trunk_strategy", "qlora")


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
            "cache_mode": SeedKey("progressive.cache.mode", None, "also turns the cache on"),
            "cache_dir": SeedKey(
                "progressive.cache.dir", None, "also turns the cache on, stored on disk"
            ),
            "save_stacks": "progressive.save_stacks",
            "save_rack": "progressive.save_rack",
        }
    ),
    values={"quant.type": {"nf_fp8": "fp8"}},
    implied=implied,
)
