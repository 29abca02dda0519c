"""The seeds' legacy names, in one table keyed by the path where each is accepted.

Key aliases move a value to its real key (`progressive.qlora_rank` -> `lora.rank`); value
aliases rename a value in place (`new_stack_precision: half` -> `fp16`). Giving both an alias
and its real key is refused. `stackwise config show --aliases` prints this table.
"""

from __future__ import annotations

import copy
from typing import Any

from stackwise.config.paths import put, section_at
from stackwise.errors import StackWiseError

# the seeds' flat names and the key each stands for; accepted at the top level and inside the
# sections where the seeds put them (progressive:, train:)
_SEED_KEYS: dict[str, str] = {
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
    "memory_lr": "train.group_lr.memory",
    "base_model_lr": "train.group_lr.base",
    "enabled_extensions": "train.enabled_extensions",
    "eval_steps": "train.eval_every",
    "log_to_wandb": "logging.log_to_wandb",
}

# alias path -> real path
KEY_ALIASES: dict[str, str] = {
    f"{where}{name}": target
    for where in ("", "progressive.", "train.")
    for name, target in _SEED_KEYS.items()
    if f"{where}{name}" != target  # the real key itself is no alias
}

# real path -> {alias value: real value}
VALUE_ALIASES: dict[str, dict[str, str]] = {
    "progressive.new_stack_precision": {"half": "fp16", "float16": "fp16", "bfloat16": "bf16"},
    "quant.type": {"nf_fp8": "fp8"},
}


def alias_table() -> list[tuple[str, str]]:
    """(alias, meaning) rows, keys first, for `stackwise config show --aliases`."""
    rows = sorted(KEY_ALIASES.items())
    for path, values in VALUE_ALIASES.items():
        rows += [(f"{path}: {old}", f"{path}: {new}") for old, new in values.items()]
    return rows


def apply_aliases(data: dict[str, Any]) -> dict[str, Any]:
    """`data` (never modified) with every alias replaced by its real key or value."""
    data = copy.deepcopy(data)
    for alias, target in KEY_ALIASES.items():
        *where, name = alias.split(".")
        holder = section_at(data, where, create=False)
        if holder is None or name not in holder:
            continue
        value = holder.pop(name)
        *sections, leaf = target.split(".")
        node = section_at(data, sections, create=False)
        if node is not None and leaf in node:
            raise StackWiseError(
                f"Config sets both '{alias}' and '{target}' (its documented alias); "
                "keep one of them."
            )
        put(data, target, value, f"'{alias}'")
    for path, values in VALUE_ALIASES.items():
        *sections, leaf = path.split(".")
        node = section_at(data, sections, create=False)
        if node is not None and isinstance(node.get(leaf), str) and node[leaf] in values:
            node[leaf] = values[node[leaf]]
    return data
