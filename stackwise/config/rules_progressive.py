"""Rules inside the growth sections (lora, quant, progressive and its cache, per-stack
overrides): keys that need a strategy or a switch, and what a grown run must save."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from stackwise.config.base import section_rule, set_while_off
from stackwise.config.growth import (
    LoraConfig,
    ProgressiveConfig,
    QuantConfig,
    StackOverride,
)


@section_rule("LoraConfig")
def lora_relevance(s: LoraConfig) -> Iterator[str]:
    yield from set_while_off(s, "lora")
    if s.strategy != "progressive":
        for name in ("rank_pattern", "alpha_pattern"):
            if s.changed(name):
                yield f"lora.{name} needs lora.strategy: progressive"
    if s.strategy != "variable" and s.per_stack:
        yield "lora.per_stack needs lora.strategy: variable"
    if s.strategy == "variable" and not s.per_stack:
        yield "lora.strategy 'variable' needs lora.per_stack: {stack: {rank: r}}"
    if not s.trunk_adapters:
        for name in ("trunk_rank", "trunk_alpha"):
            if s.changed(name):
                yield f"lora.{name} needs lora.trunk_adapters: true"


@section_rule("QuantConfig")
def quant_relevance(s: QuantConfig) -> Iterator[str]:
    yield from set_while_off(s, "quant")
    if s.type != "nf4" and s.changed("double_quant"):
        yield "quant.double_quant applies to type nf4 only"


@section_rule("StackOverride")
def stackoverride_budget(s: StackOverride) -> Iterator[str]:
    if s.steps is not None and s.epochs is not None:
        yield "a stack override takes steps or epochs, not both"


@section_rule("ProgressiveConfig")
def progressive_strategy(s: ProgressiveConfig) -> Iterator[str]:
    """Growth keys need strategy progressive; end-to-end keys need end_to_end."""
    grown = (
        "mode",
        "block_size",
        "joint_tuning_steps",
        "building_mode",
        "trunk_strategy",
        "head_policy",
        "new_stack_precision",
        "steps_per_stack",
        "epochs_per_stack",
        "stacks",
        "time_interpretation",
        "lr_schedule",
        "cache",
        "growth",
    )
    if s.strategy == "end_to_end":
        for name in grown:
            if s.changed(name):
                yield (
                    f"progressive.{name} only applies to strategy: progressive; set "
                    "progressive.strategy: progressive or remove it"
                )
    elif s.changed("end_to_end_scope"):
        yield "progressive.end_to_end_scope only applies to strategy: end_to_end"


@section_rule("ProgressiveConfig")
def progressive_saving(s: ProgressiveConfig) -> Iterator[str]:
    """What a run must save to be loaded again."""
    if (
        s.strategy == "progressive"
        and not s.save_stacks
        and (s.new_stack_precision != "full" or s.trunk_strategy == "qlora")
    ):
        yield (
            "stacks stored as bf16/fp16 or quantized are rebuilt from their stack files on "
            "load; keep save_stacks: true"
        )
    if not (s.save_rack or s.save_stacks):
        yield ("with save_rack and save_stacks both false nothing would be saved; keep one")


@section_rule("ProgressiveConfig")
def progressive_shape(s: ProgressiveConfig) -> Iterator[str]:
    """Budgets and stack shapes."""
    if s.steps_per_stack is not None and s.epochs_per_stack is not None:
        yield "set progressive.steps_per_stack or epochs_per_stack, not both"
    if (s.mode == "fused") != (s.joint_tuning_steps > 0):
        yield (
            "mode 'fused' means progressive growth followed by joint_tuning_steps (> 0) of "
            "whole-rack tuning; set both, or neither"
        )
    if s.mode == "layerwise" and s.changed("block_size"):
        yield "mode 'layerwise' has one block per stack; remove block_size"


@section_rule("ProgressiveConfig")
def progressive_depth_keys(s: ProgressiveConfig) -> Iterator[str]:
    """Time-as-depth keys and their mapping."""
    if s.time_interpretation != "depth":
        for name in (
            "depth_mapping",
            "depth_growth",
            "time_per_stack",
            "depth_time_table",
            "depth_order",
        ):
            if s.changed(name):
                yield f"progressive.{name} needs time_interpretation: depth"
    else:
        if s.depth_mapping != "linear" and s.time_per_stack is not None:
            yield ("progressive.time_per_stack sets linear widths; use depth_mapping: linear")
        if s.depth_mapping != "exponential" and s.changed("depth_growth"):
            yield "progressive.depth_growth needs depth_mapping: exponential"
        if s.depth_time_table is not None and s.depth_mapping != "custom":
            yield "progressive.depth_time_table needs depth_mapping: custom"
        # custom without a table: the mapping function comes from Python (stackwise.plan)


@section_rule("ProgressiveConfig")
def progressive_cache(s: ProgressiveConfig) -> Iterator[str]:
    """The activation cache's settings and what it needs."""
    c = s.cache
    yield from set_while_off(c, "progressive.cache")
    if c.enabled:
        if s.building_mode != "append" or s.trunk_strategy != "frozen":
            yield (
                "the activation cache stores a frozen trunk's output before the new stack, "
                "so it needs building_mode: append and trunk_strategy: frozen (frozen + "
                "cache is the memory-light path; 'qlora' and 'full' keep adapting the trunk, "
                "so its activations cannot be cached)"
            )
        if s.head_policy == "always":
            yield (
                "with head_policy 'always' the embeddings keep training, so cached trunk "
                "activations would go stale; use train_first or frozen, or disable the cache"
            )
    if c.storage != "disk" and c.changed("dir"):
        yield "progressive.cache.dir needs cache.storage: disk"
    if c.max_bytes is None and c.changed("on_full"):
        yield "progressive.cache.on_full needs a cache.max_bytes budget"
    if c.store_all_time_steps and c.changed("time_step_cache_size"):
        yield (
            "progressive.cache.store_all_time_steps keeps every grid step; remove "
            "progressive.cache.time_step_cache_size"
        )


@section_rule("ProgressiveConfig")
def progressive_chain(s: ProgressiveConfig) -> Iterator[str]:
    """What a denoising chain (depth_order high_to_low) cannot combine with."""
    if s.time_interpretation != "depth" or s.depth_order != "high_to_low":
        return
    if s.building_mode != "append":
        yield (
            "progressive.depth_order: high_to_low needs building_mode: append (each stack "
            "continues the one grown before it)"
        )
    if s.mode == "fused":
        yield (
            "progressive.depth_order: high_to_low needs no joint tuning (mode fused tunes the "
            "whole rack on every noise level)"
        )
    if s.cache.enabled:
        yield (
            "progressive.depth_order: high_to_low needs no activation cache (the trunk sees its "
            "own, further-masked inputs)"
        )
    table = s.depth_time_table
    if table is not None:
        tops = [e if isinstance(e, float | int) else e[1] for e in table]
        if any(b >= a for a, b in itertools.pairwise(tops)):
            yield (
                "progressive.depth_order: high_to_low needs depth_time_table ranges whose "
                f"tops decrease stack by stack (stack 0 the noisiest); got {tops}"
            )
