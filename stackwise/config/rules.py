"""Rules inside one section: each yields what is wrong and how to fix it.

A field that only matters for some settings (say `mask_ratio` with a causal objective) is
refused when changed from its default while irrelevant, so a key never silently does nothing.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from typing import Any

from stackwise.config.base import section_rule, set_while_off
from stackwise.config.growth import (
    LoraConfig,
    ProgressiveConfig,
    QuantConfig,
    StackOverride,
)
from stackwise.config.sections import (
    DataConfig,
    LoggingConfig,
    MaskingConfig,
    ModelConfig,
    TrainConfig,
)


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


@section_rule("ModelConfig")
def model_shapes(s: ModelConfig) -> Iterator[str]:
    if s.d_model % s.n_heads:
        divisors = _divisors(s.d_model)
        # the counts nearest the one given whose head size is even (RoPE); odd d_model: any
        valid = [h for h in divisors if (s.d_model // h) % 2 == 0] or divisors
        fits = sorted(sorted(valid, key=lambda h: (abs(h - s.n_heads), h))[:4])
        yield (
            f"n_heads ({s.n_heads}) must divide d_model ({s.d_model}); head counts that "
            f"divide it: {', '.join(map(str, fits))}"
        )
    elif (s.d_model // s.n_heads) % 2:
        yield (f"head size d_model/n_heads = {s.d_model // s.n_heads} must be even for RoPE")
    if s.n_kv_heads is not None and s.n_heads % s.n_kv_heads:
        yield (f"n_kv_heads ({s.n_kv_heads}) must divide n_heads ({s.n_heads}) for GQA")


SOURCES = ("files", "dataset_dir", "dataset_name")


def one_source(s: Any, where: str, required: bool) -> Iterator[str]:
    """The rows' source in `s` (data, or an entry of data.mix): at most one (exactly one when
    `required`) of files, dataset_dir, dataset_name; subset and split only with a name."""
    given = [n for n in SOURCES if s.changed(n)]
    if len(given) > 1 or (required and not given):
        yield (
            f"{where} needs exactly one of {where}.files, {where}.dataset_dir or "
            f"{where}.dataset_name (it reads rows from exactly one, not both); given: "
            f"{', '.join(given) or 'none'}"
        )
    if (s.dataset_subset is not None or s.changed("dataset_split")) and not s.dataset_name:
        yield (
            f"{where}.dataset_subset and {where}.dataset_split only apply with {where}.dataset_name"
        )


def _mix_rules(s: DataConfig) -> Iterator[str]:
    if not s.mix:
        return
    for name in SOURCES:
        if s.changed(name):
            yield f"data.{name} and data.mix both name the data: move data.{name} into an entry"
    if len(s.mix) < 2:
        yield "data.mix mixes two or more sources; for one, set data.files (or dataset_*) instead"
    for i, m in enumerate(s.mix):
        yield from one_source(m, f"data.mix.{i}", required=True)


@section_rule("DataConfig")
def data_sources(s: DataConfig) -> Iterator[str]:
    yield from one_source(s, "data", required=s.mode == "instruction")
    if s.mode == "instruction":
        return  # its other rules: rules_hf.data_mode
    yield from _mix_rules(s)
    if s.source == "files" and not any(s.changed(n) for n in SOURCES) and not s.mix:
        yield "source 'files' needs data.files: [path, ...] (or data.dataset_dir, dataset_name)"
    if s.source == "files" and not s.files and s.changed("format"):
        yield "data.format reads data.files; datasets bring their own format. Remove it"
    if s.source == "shakespeare":
        for name in ("files", "dataset_dir", "dataset_name", "mix", "format", "text_field"):
            if s.changed(name):
                yield (
                    f"data.{name} only applies to source: files (the built-in corpus is "
                    "plain text); set data.source: files or remove it"
                )
    if s.tokenizer is not None and s.changed("bpe_vocab_size"):
        yield (
            "bpe_vocab_size only applies to the BPE trained when data.tokenizer is unset; "
            "remove one of them"
        )


@section_rule("MaskingConfig")
def masking_table(s: MaskingConfig) -> Iterator[str]:
    """The time grid: eps, and the per-step fractions of schedule 'table'."""
    if s.num_time_steps is not None and s.schedule != "loglinear" and s.changed("eps"):
        yield (
            "masking.eps bounds continuous t; with num_time_steps t lies on a grid, so eps "
            "has no effect (except in the loglinear schedule); remove it"
        )
    table = s.time_step_mask_fractions
    if s.schedule == "table":
        if not table or s.num_time_steps is None:
            yield (
                "schedule 'table' needs num_time_steps and time_step_mask_fractions "
                "(e.g. {0: 0.15, 5: 0.5, 9: 0.9})"
            )
            return
        steps = sorted(table)
        if steps[0] < 0 or steps[-1] >= s.num_time_steps:
            yield (f"time_step_mask_fractions steps must lie in 0..{s.num_time_steps - 1}")
        fracs = [table[k] for k in steps]
        if any(not 0.0 < f <= 1.0 for f in fracs):
            yield "time_step_mask_fractions values must be in (0, 1]"
        if any(b < a for a, b in itertools.pairwise(fracs)):
            yield "time_step_mask_fractions must not decrease with the step"
    elif table is not None:
        yield "time_step_mask_fractions needs schedule: table"


@section_rule("TrainConfig")
def train_schedule(s: TrainConfig) -> Iterator[str]:
    if s.warmup_ratio is not None and s.warmup_steps:
        yield "set warmup_steps or warmup_ratio, not both"
    if s.scheduler == "constant":
        for name in ("warmup_steps", "warmup_ratio"):
            if s.changed(name):
                yield (
                    f"scheduler 'constant' has no warmup; use "
                    f"'constant_with_warmup' or remove {name}"
                )
    if s.scheduler in ("constant", "constant_with_warmup") and s.changed("min_lr_ratio"):
        yield f"min_lr_ratio has no effect with scheduler '{s.scheduler}'"
    if s.scheduler != "polynomial" and s.changed("poly_power"):
        yield "poly_power only applies to scheduler: polynomial"
    tracks = s.save_best_model or s.early_stopping_patience is not None
    for name in ("metric_for_best", "greater_is_better"):
        if s.changed(name) and not tracks:
            yield (f"{name} is read by save_best_model and early stopping; turn one of them on")
    if s.changed("early_stopping_threshold") and s.early_stopping_patience is None:
        yield "early_stopping_threshold needs early_stopping_patience"
    if s.save_total_limit is not None and not (s.save_steps or s.save_best_model):
        yield (
            "save_total_limit rotates checkpoints, but none are written: set save_steps "
            "(or save_best_model)"
        )
    if s.save_steps > s.max_steps:
        yield (
            f"save_steps ({s.save_steps}) exceeds max_steps ({s.max_steps}), so no "
            "checkpoint would ever be written; lower it (0 turns checkpoints off)"
        )
    builtin = {
        "best_model": "save_best_model: true",
        "early_stopping": "early_stopping_patience",
        "console": "logging.console",
        "jsonl": "logging.jsonl",
        "tensorboard": "logging.tensorboard",
        "wandb": "logging.log_to_wandb",
        "progress_bar": "logging.progress_bar",
    }
    for name in s.enabled_extensions:
        if name in builtin:
            yield (
                f"enabled_extensions lists the built-in '{name}', which its own setting "
                f"turns on ({builtin[name]}); remove it from the list"
            )
    if len(set(s.enabled_extensions)) != len(s.enabled_extensions):
        yield "enabled_extensions lists an extension twice"
    if tracks and s.eval_every > s.max_steps:
        yield (
            f"save_best_model / early stopping act on evaluations, but eval_every "
            f"({s.eval_every}) exceeds max_steps ({s.max_steps}); lower eval_every"
        )


@section_rule("LoggingConfig")
def logging_wandb(s: LoggingConfig) -> Iterator[str]:
    if s.changed("wandb_project") and not s.log_to_wandb:
        yield "wandb_project needs log_to_wandb: true"
    if s.log_to_wandb:
        import importlib.util

        if importlib.util.find_spec("wandb") is None:
            yield (
                "log_to_wandb is on but wandb is not installed: pip install wandb (set "
                "WANDB_MODE=offline to log without an account), or turn it off"
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
        "growth_operator",
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
        if (s.depth_mapping == "custom") != (s.depth_time_table is not None):
            yield (
                "depth_mapping 'custom' takes its times from depth_time_table; set both "
                "(a callable mapping is available from the Python API)"
            )


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
