"""The seeds' ways to make a ProgressiveRackBuilder, and a builder handed to a progressive run.

`ProgressiveRackBuilder(config=config)` reads every setting from a config: the config door is a
layer above this one, so stackwise.fronts.progressive registers the function that reads it
(BUILDER_FRONT; importing the class from `stackwise` loads it). `ProgressiveRackBuilder(
vocab_size=..., d_model=..., d_ff=..., n_heads=...)` gives the rack's shape alone; a run that
adopts such a builder (`bind`) fills in the rest from its plan and checks the shape agrees.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from stackwise.errors import StackWiseError
from stackwise.model.rack import Rack
from stackwise.spec import AdapterSpec, ModelSpec, Plan

# config -> the builder's settings (spec, vocab_size, causal, adapters, ...): fronts.progressive
BUILDER_FRONT: list[Callable[[Any], dict[str, Any]]] = []
# the seeds' precision names -> ours
SEED_PRECISIONS = {
    "half": "fp16",
    "float16": "fp16",
    "bfloat16": "bf16",
    "float32": "full",
    "fp32": "full",
}
SHAPE_NAMES = {"d_ff": "ffn_hidden"}  # the seeds' shape keywords -> ModelSpec fields
SEED_ADAPTER = AdapterSpec(8, 16.0)  # a qlora stack's LoRA when nothing else says (lora's default)

# `ProgressiveTrainer(config)` then `train_progressively(rack_builder=, dataloader=, ...)` (the
# seeds' way) compiles the plan from a config and the caller's data: the config door is a layer
# above, so stackwise.fronts.progressive registers the function that does it (importing the
# class from `stackwise` loads it). It calls `setup` with the plan and data.
TRAINER_FRONT: list[Callable[..., None]] = []


@dataclass
class SeedSettings:
    """What `ProgressiveTrainer(config, ...)` was given, until the data arrives."""

    config: Any
    output_dir: str | Path | None
    quiet: bool
    strategy: Any  # a TrainingStrategy, or None: the standard one
    time_mapping: Any = None


def start_seed_run(recipe: Any, *args: Any, **data: Any) -> None:
    """Set `ProgressiveTrainer(config)` up for the data it was just given (TRAINER_FRONT)."""
    if not TRAINER_FRONT:
        raise StackWiseError(
            "ProgressiveTrainer(config) compiles its config through "
            "stackwise.fronts.progressive: import the class from stackwise "
            "(`from stackwise import ProgressiveTrainer`), which loads it."
        )
    TRAINER_FRONT[0](recipe, *args, **data)


def precision_name(precision: str) -> str:
    return SEED_PRECISIONS.get(precision, precision)


def seed_settings(
    config: Any, spec: ModelSpec | None, vocab_size: int | None, causal: bool | None, shape: dict
) -> dict[str, Any]:
    """What a builder call fixes: nothing beyond its arguments (`spec` given), the config's
    settings (`config=`), or a spec made from the seed's shape keywords."""
    if config is not None:
        if spec is not None or shape:
            raise StackWiseError(
                "ProgressiveRackBuilder takes config=... or the rack's shape (vocab_size=, "
                "d_model=, ...), not both: the config already holds the shape."
            )
        if not BUILDER_FRONT:
            raise StackWiseError(
                "ProgressiveRackBuilder(config=...) reads its config through "
                "stackwise.fronts.progressive: import the class from stackwise "
                "(`from stackwise import ProgressiveRackBuilder`), which loads it."
            )
        return BUILDER_FRONT[0](config)
    if spec is not None:
        if shape or vocab_size is None or causal is None:
            raise TypeError("ProgressiveRackBuilder(spec, vocab_size, causal, *, ...)")
        return {}
    return _from_shape(vocab_size, causal, shape)


def _from_shape(vocab_size: int | None, causal: bool | None, shape: dict) -> dict[str, Any]:
    names = {f.name for f in fields(ModelSpec)}
    given = {SHAPE_NAMES.get(k, k): v for k, v in shape.items()}
    unknown = sorted(set(given) - names)
    if unknown or vocab_size is None:
        problem = f"'{unknown[0]}' is not a shape setting" if unknown else "vocab_size is missing"
        raise StackWiseError(
            f"ProgressiveRackBuilder: {problem}. Give the rack's shape as vocab_size= (the size "
            "of the vocabulary your token ids come from) with d_model=, n_heads=, d_ff= and any "
            "other model setting (n_kv_heads, blocks_per_stack, max_seq_len, ...), or "
            "config=config to read them all from a config."
        )
    spec = ModelSpec(vocab_size=vocab_size, **given)
    return {
        "spec": spec,
        "vocab_size": vocab_size,
        # the seed's default objective masks tokens (bidirectional); a run re-binds it
        "causal": bool(causal) if causal is not None else False,
        "shape": {"vocab_size": vocab_size, **given},
        "default_adapter": SEED_ADAPTER,
    }


def check_fit(builder: Any, plan: Plan) -> None:
    """Refuse a builder that cannot grow the rack of `plan` (see bind)."""
    m, p = plan.model, plan.progressive
    problems = [
        f"{k}={v} (the config has {_plan_value(m, k)})"
        for k, v in builder.seed.get("shape", {}).items()
        if _plan_value(m, k) != v
    ]
    if builder.mode_given and builder.building_mode != p.building_mode:
        problems.append(
            f"building_mode={builder.building_mode!r} (the config has {p.building_mode!r})"
        )
    given = (getattr(builder, "growth_init", "random"), getattr(builder, "growth_noise", 0.0))
    if given != ("random", 0.0) and given != (p.growth.init, p.growth.noise):
        problems.append(
            f"growth_operator={given[0]!r}, growth_noise={given[1]} (the config has "
            f"progressive.growth.init {p.growth.init!r}, noise {p.growth.noise})"
        )
    rack = builder.rack
    if builder.grown and (rack.vocab_size, rack.causal) != (m.vocab_size, plan.objective.causal):
        problems.append("its vocabulary or attention direction (the config's differ)")
    layout = (rack.block_size, rack.block_shift)
    if builder.grown and layout != (m.diffusion_block, m.diffusion_shift):
        problems.append(
            f"block-diffusion layout {layout} (block size, shift; the config's objective gives "
            f"{(m.diffusion_block, m.diffusion_shift)})"
        )
    if builder.grown and _shape(builder.spec) != _shape(m):
        problems.append("its stacks' shape (the config's model section differs)")
    if problems:
        raise StackWiseError(
            "The rack builder does not fit this run's config: it was made with "
            + "; ".join(problems)
            + ". Make the builder from the same config (ProgressiveRackBuilder(config=config)) "
            "or change one of them."
        )


def bind(builder: Any, plan: Plan) -> None:
    """Make `builder` the one a progressive run of `plan` grows. A builder with no stacks yet
    takes the plan's settings (its rack rebuilt when they differ); one that holds stacks keeps
    them as the trunk, so it must match the plan's shape. The seed's shape keywords and an
    explicit building_mode must agree with the plan either way."""
    check_fit(builder, plan)
    m, p = plan.model, plan.progressive
    steps = plan.masking.num_time_steps
    if not builder.grown and (builder.spec, builder.vocab_size, builder.causal) != (
        m,
        m.vocab_size,
        plan.objective.causal,
    ):
        builder.rack = Rack(m, m.vocab_size or 0, plan.objective.causal, steps, n_stacks=0)
    builder.spec, builder.vocab_size, builder.causal = m, m.vocab_size, plan.objective.causal
    builder.building_mode = p.building_mode
    builder.set_growth(p.growth.init, p.growth.noise)
    builder.double_quant = plan.quant.enabled and plan.quant.double_quant
    builder.max_stacks = m.n_stacks
    # the run gives each stage its adapter and the trunk its adapters (GrowingRack.set_roles)
    builder.stack_adapters, builder.default_adapter, builder.trunk_adapter = {}, None, None


def _plan_value(m: ModelSpec, key: str) -> Any:
    return m.ffn_width if key == "ffn_hidden" else getattr(m, key)


def _shape(m: ModelSpec) -> tuple:
    return (m.d_model, m.n_heads, m.n_kv_heads, m.ffn_width, m.time_conditioning)
