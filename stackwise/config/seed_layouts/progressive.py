"""Seed 003 (the progressive training system): `training.progressive:` and the model keys its
builder reads.

What the seed's section means as a whole (`implied`, applied only where the config leaves the
key unset): a `training.progressive:` section grows the rack stack by stack unless it says
`enabled: false`, and its default objective is the seed's masked one. The seed's `mlm` masks by
time step (its masking strategy turns a time step into a mask), which is our `diffusion`
objective; `clm` and `custom` (targets from the batch) are ours as named.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stackwise.config.seed_layouts import NOT_SEED, Layout, SeedKey, boolean_to, fill, keys

_P = "training.progressive."


@dataclass(frozen=True)
class Objective:
    """The seed's training_objective -> objective.name, and back (`config show --as-seed`)."""

    names: tuple[tuple[str, str], ...] = (
        ("mlm", "diffusion"),
        ("clm", "clm"),
        ("custom", "custom"),
    )

    def __call__(self, value: Any) -> Any:
        if not isinstance(value, str):
            return value  # anything else: our key's check names it
        return dict(self.names).get(value, value)

    def reverse(self, value: Any) -> Any:
        if not isinstance(value, str):
            return NOT_SEED
        return {ours: seed for seed, ours in self.names}.get(value, NOT_SEED)


def implied(given: dict[str, Any], data: dict[str, Any]) -> None:
    """A training.progressive section: growth stack by stack, the seed's masked objective."""
    if any(path.startswith(_P) for path in given):
        fill(data, "progressive.strategy", "progressive")
        fill(data, "objective.name", "diffusion")


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
            f"{_P}stack_time_mapping": SeedKey(
                "progressive.depth_mapping",
                None,
                "custom: a function given in Python (ProgressiveTrainer(config, "
                "time_mapping=fn)) or progressive.depth_time_table",
            ),
            f"{_P}time_per_stack": SeedKey(
                "progressive.time_per_stack",
                None,
                "without masking.num_time_steps the grid is time_per_stack x max_stacks",
            ),
            f"{_P}training_objective": SeedKey(
                "objective.name", Objective(), "mlm: diffusion (masks by time step); clm; custom"
            ),
            "model.d_ff": "model.ffn_hidden",
        }
    ),
    values={
        "progressive.new_stack_precision": {"half": "fp16", "float16": "fp16", "bfloat16": "bf16"}
    },
    implied=implied,
)
