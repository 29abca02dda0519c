"""Rules across sections about progressive growth: precision, adapters, storage, time as depth,
per-stack overrides."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from stackwise.config.base import cross_rule, derived_rule
from stackwise.config.derive import stack_config
from stackwise.config.growth import QUANTIZED
from stackwise.config.loading import InvalidConfig
from stackwise.config.root import Config
from stackwise.precision import QUANT_FORMATS, storage_of
from stackwise.registry import OBJECTIVES

if TYPE_CHECKING:
    from stackwise.config.growth import LoraConfig, ProgressiveConfig, QuantConfig


def rack_rule(fn: Callable[[Config], Iterator[str]]) -> Callable[[Config], Iterator[str]]:
    """A growth rule: racks only (a Hugging Face run's lora/quant keys are rules_hf's)."""

    @functools.wraps(fn)
    def checked(cfg: Config) -> Iterator[str]:
        return iter(()) if cfg.model.source == "hf" else fn(cfg)

    return cross_rule(checked)


def _growth(cfg: Config) -> tuple[ProgressiveConfig, LoraConfig, QuantConfig]:
    """The three sections most growth rules read, in the order they unpack."""
    return cfg.progressive, cfg.lora, cfg.quant


@rack_rule
def growth_budget(cfg: Config) -> Iterator[str]:
    """What strategy, budget and saving a progressive run needs."""
    p, lo, q = _growth(cfg)
    name = cfg.objective.name
    if cfg.model.init_from_hf and p.strategy == "progressive":
        for bad, why in (
            (p.time_interpretation == "depth", "time_interpretation: depth"),
            (p.building_mode == "prepend", "building_mode: prepend"),
        ):
            if bad:
                yield (
                    f"model.init_from_hf grows stacks on the imported (frozen) trunk, after it; "
                    f"{why} does not fit that. Remove it"
                )
    if p.time_interpretation == "depth" and not OBJECTIVES.capabilities(name).uses_time:
        yield (
            "time_interpretation 'depth' ties the diffusion time step to the stack; it "
            f"needs objective 'diffusion', not '{name}'"
        )
    budget = p.steps_per_stack or p.epochs_per_stack
    if p.strategy == "progressive" and budget and cfg.train.changed("max_steps"):
        yield (
            "train.max_steps has no effect when progressive.steps_per_stack or "
            "epochs_per_stack sets each stack's budget; change those (or "
            "progressive.stacks.<k>.steps) instead"
        )
    if (lo.enabled or q.enabled) and not p.save_stacks:
        yield (
            "quantized or LoRA stacks are rebuilt from their stack files on load; keep "
            "progressive.save_stacks: true"
        )
    if p.end_to_end_scope == "stackwise" and cfg.train.compile:
        yield (
            "train.compile does not apply to end_to_end_scope 'stackwise', which runs the "
            "stacks one by one; remove one of them"
        )
    if p.strategy == "end_to_end":
        yield from _end_to_end_adapters(lo, q)


def _end_to_end_adapters(lo: LoraConfig, q: QuantConfig) -> Iterator[str]:
    """An end-to-end rack with lora.enabled is QLoRA: every stack's base weights frozen (stored
    as quant.type when quant is on) under one trainable adapter each, the anchor training."""
    if q.enabled and not lo.enabled:
        yield (
            "quant on an end-to-end rack stores its frozen base weights quantized under LoRA "
            "adapters (QLoRA); set lora.enabled: true, or remove quant to train every weight"
        )
    if lo.trunk_adapters:
        yield (
            "lora.trunk_adapters adapt the frozen trunk of a progressive run; an end-to-end "
            "rack with lora.enabled gives every stack one adapter (lora.rank, lora.alpha)"
        )


@rack_rule
def growth_precision(cfg: Config) -> Iterator[str]:
    """New-stack precisions and the adapters they need."""
    p, lo, q = _growth(cfg)
    prec = p.new_stack_precision
    if prec in QUANTIZED and not lo.enabled:
        yield (
            f"new_stack_precision '{prec}' stores the new stack's weights frozen and trains "
            "a LoRA adapter on them; set lora.enabled: true (rank, alpha) or use full/bf16"
        )
    fp16_store = prec == "fp16" or (q.enabled and q.type == "fp16")
    if fp16_store and (p.trunk_strategy == "full" or p.mode == "fused"):
        yield (
            "fp16 storage (new_stack_precision or quant.type) applies to stacks once they "
            "are trained, but trunk_strategy 'full' or mode 'fused' keeps training them, and "
            "fp16 weights diverge without loss scaling; use bf16 there"
        )
    if p.strategy != "progressive":
        return  # an end-to-end rack: one adapter per stack (see _end_to_end_adapters)
    # lora.enabled gives every stack its own adapter as it is created (a float stack trains it
    # beside its weights; a packed one trains only it); a qlora trunk trains every adapter
    if p.trunk_strategy == "qlora" and not lo.enabled:
        yield (
            "trunk_strategy 'qlora' quantizes the frozen trunk and trains only its LoRA "
            "adapters: set lora.enabled: true (each stack's own adapter), and for one more "
            "adapter per trunk stack lora.trunk_adapters: true (use 'frozen' with "
            "cache.enabled for the memory-light path)"
        )


@rack_rule
def growth_adapters(cfg: Config) -> Iterator[str]:
    """Trunk adapters, random lengths and the cache."""
    p, lo, q = _growth(cfg)
    if p.cache.enabled and cfg.objective.random_length_ratio > 0:
        yield (
            "objective.random_length_ratio cuts sequences at random, but the activation cache "
            "stores the trunk's output for whole sequences; disable progressive.cache or set "
            "random_length_ratio: 0"
        )
    if lo.trunk_adapters and p.cache.enabled:
        yield (
            "lora.trunk_adapters keeps adapting the trunk, so its activations cannot be "
            "cached; disable progressive.cache or the trunk adapters"
        )
    if lo.trunk_adapters and p.trunk_strategy == "full":
        yield "lora.trunk_adapters adapt a frozen trunk; trunk_strategy is 'full'"
    if q.enabled and p.trunk_strategy == "full" and q.backbone_quantized:
        yield (
            "quant.backbone_quantized stores frozen trunk stacks quantized, but "
            "trunk_strategy 'full' keeps training them; use frozen or qlora"
        )
    if (
        q.enabled
        and not q.backbone_quantized
        and p.trunk_strategy != "qlora"
        and p.new_stack_precision not in QUANT_FORMATS
    ):
        yield (
            "quant.enabled with backbone_quantized: false quantizes nothing here; "
            "set backbone_quantized, trunk_strategy: qlora, or a quantized "
            "new_stack_precision"
        )


@rack_rule
def growth_storage(cfg: Config) -> Iterator[str]:
    """How frozen stacks are stored."""
    p, q = cfg.progressive, cfg.quant
    if p.trunk_strategy == "qlora" and q.enabled and not q.backbone_quantized:
        yield (
            "trunk_strategy 'qlora' stores the trunk quantized by definition, so "
            "quant.backbone_quantized: false contradicts it; for an unquantized trunk "
            "adapted by LoRA use trunk_strategy: frozen with lora.trunk_adapters: true"
        )
    new_storage = storage_of(p.new_stack_precision)
    if q.enabled and q.backbone_quantized and p.strategy == "progressive":
        if new_storage in QUANT_FORMATS and q.type != new_storage:
            yield (
                f"new stacks are stored as {new_storage} from birth and are not "
                f"re-quantized, so quant.type '{q.type}' would never apply; set quant.type: "
                f"{new_storage} or another new_stack_precision"
            )
        same = q.type == new_storage and not (q.type == "nf4" and q.double_quant)
        if same and p.trunk_strategy != "qlora":  # qlora: type is the trunk's format
            yield (
                f"new stacks are already stored as {new_storage}, so quant.type "
                f"'{q.type}' changes nothing when they freeze; pick another quant.type or "
                "disable quant"
            )


@rack_rule
def growth_trunk(cfg: Config) -> Iterator[str]:
    """Trunk settings with one stack, and per-group LRs of growth."""
    p, lo, q = _growth(cfg)
    if p.strategy == "progressive" and cfg.model.n_stacks == 1:
        trunk_bits = {
            "trunk_strategy 'qlora'": p.trunk_strategy == "qlora",
            "lora.trunk_adapters": lo.trunk_adapters,
            "quant.backbone_quantized": q.enabled and q.backbone_quantized,
        }
        on = [k for k, v in trunk_bits.items() if v]
        if on:
            yield (
                f"{on[0]} acts on the trunk, but with model.n_stacks 1 there never is one; "
                "grow more stacks or remove it"
            )
    if cfg.train.group_lr.lora is not None and not lo.enabled:
        yield "train.group_lr.lora (the lora_lr) needs lora.enabled: true"
    if q.changed("adapters_full_precision") and not lo.enabled:
        yield "quant.adapters_full_precision needs lora.enabled: true"
    if lo.strategy == "variable":
        bad = [k for k in lo.per_stack if not 0 <= k < cfg.model.n_stacks]
        if bad:
            yield (f"lora.per_stack has stack {bad[0]}; stacks are 0..{cfg.model.n_stacks - 1}")
    if p.end_to_end_scope == "stackwise" and cfg.model.n_stacks < 2:
        yield (
            "end_to_end_scope 'stackwise' gives each stack its own loss; with one stack it "
            "equals rackwise. Set model.n_stacks >= 2 or remove it"
        )


@rack_rule
def growth_depth(cfg: Config) -> Iterator[str]:
    """Time as depth: the mapping must cover the noise that sampling starts from."""
    p = cfg.progressive
    steps = cfg.masking.num_time_steps
    if p.time_per_stack is not None and steps is None:
        yield "progressive.time_per_stack counts grid steps: set num_time_steps"
    if p.strategy == "progressive" and p.time_interpretation == "depth":
        n = cfg.model.n_stacks
        if p.depth_time_table is not None and len(p.depth_time_table) < n:
            yield (f"depth_time_table has {len(p.depth_time_table)} entries for {n} stacks")
        if p.time_per_stack is not None and steps is not None and p.time_per_stack * n > steps:
            yield (f"time_per_stack={p.time_per_stack} x {n} stacks exceeds num_time_steps={steps}")
        top = 1.0
        if p.time_per_stack is not None and steps is not None:
            top = p.time_per_stack * n / steps
        elif p.depth_time_table is not None:
            ends = [e if isinstance(e, float | int) else e[1] for e in p.depth_time_table[:n]]
            top = max(ends)
        if top < 1.0 - 1e-9:
            yield (
                f"with time as depth the stacks cover noise levels up to t={top:g} only, but "
                "sampling starts from full noise (t=1): no stack would be trained for it. "
                "Make the last stack's range reach 1"
            )
        if p.depth_order == "high_to_low" and cfg.model.time_conditioning != "none":
            yield (
                "progressive.depth_order: high_to_low gives each stack its noise level by its "
                "place in the chain; set model.time_conditioning: none"
            )
        if cfg.model.time_conditioning == "learned" and p.head_policy != "always":
            yield (
                "a learned time embedding freezes with the anchor after stack 0 "
                f"(head_policy {p.head_policy}), so with time as depth its rows outside "
                "stack 0's noise range would never train. Use time_conditioning "
                "sinusoidal or none, or head_policy always"
            )


@rack_rule
def growth_cache_grid(cfg: Config) -> Iterator[str]:
    """Cache variants need masked inputs."""
    c = cfg.progressive.cache
    name = cfg.objective.name
    caps = OBJECTIVES.capabilities(name)
    steps = cfg.masking.num_time_steps
    if c.store_all_time_steps and (not caps.uses_time or steps is None):
        yield (
            "progressive.cache.store_all_time_steps keeps one entry per grid step: it needs "
            "objective 'diffusion' with masking.num_time_steps"
        )
    if c.enabled and not caps.masked and c.changed("time_step_cache_size"):
        yield f"progressive.cache.time_step_cache_size must stay 1 with {name} (nothing is masked)"


@rack_rule
def growth_stack_overrides(cfg: Config) -> Iterator[str]:
    """Per-stack overrides must name real stacks and keep the attention direction."""
    p = cfg.progressive
    for idx, over in p.stacks.items():
        if not 0 <= idx < cfg.model.n_stacks:
            yield (
                f"progressive.stacks has an entry for stack {idx}; stacks are numbered "
                f"0..{cfg.model.n_stacks - 1}"
            )
            continue
        if over.objective is not None and over.objective.causal != cfg.objective.causal:
            yield (
                f"progressive.stacks.{idx}.objective changes the attention direction; a "
                "stack override must keep the rack's causal/bidirectional attention"
            )


@derived_rule
def stack_configs(cfg: Config) -> Iterator[str]:
    """Each stack's config (the rack's with its override applied) must be valid in itself."""
    if cfg.model.source == "hf":
        return
    for idx in cfg.progressive.stacks:
        try:
            stack_config(cfg, idx)
        except InvalidConfig as err:
            for problem in err.problems:
                yield f"progressive.stacks.{idx} makes an invalid config: {problem}"
