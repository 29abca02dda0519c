"""Rules for the routed layers: what an MoE rack can be, where memory layers can sit, and what
does not handle them yet."""

from __future__ import annotations

from collections.abc import Iterator
from difflib import get_close_matches

from stackwise.config.base import cross_rule
from stackwise.config.root import Config
from stackwise.precision import QUANT_FORMATS
from stackwise.registry import GROWTH_OPERATORS


@cross_rule
def moe(cfg: Config) -> Iterator[str]:
    """Experts per layer, top-k, the MoE stacks, and the features that cannot hold experts."""
    m = cfg.model.moe
    if m.num_experts == 0:
        changed = [k for k in type(m).model_fields if k != "num_experts" and m.changed(k)]
        if changed:
            yield f"model.moe.{changed[0]} needs experts: set model.moe.num_experts (2 or more)"
        return
    yield from _moe_shape(cfg)
    for what, on in _moe_unsupported(cfg).items():
        if on:
            yield (
                f"model.moe keeps every expert in full precision and trains it whole; {what} "
                "does not handle experts yet. Remove one of them"
            )


def _moe_shape(cfg: Config) -> Iterator[str]:
    """How many experts, how many routed to, and which stacks hold them."""
    m, n_stacks = cfg.model.moe, cfg.model.n_stacks
    if m.num_experts == 1:
        yield "model.moe.num_experts 1 is a dense layer behind a router: use 0 (dense) or >= 2"
    if m.top_k > m.num_experts:
        yield f"model.moe.top_k {m.top_k} exceeds num_experts {m.num_experts}: lower top_k"
    if m.stacks == []:
        yield (
            f"model.moe.stacks is [], so no stack would get its {m.num_experts} experts and the "
            "rack would be dense: list the MoE stacks' growth indices (e.g. [0]), remove "
            "model.moe.stacks for experts in every stack, or set model.moe.num_experts: 0"
        )
    bad = [k for k in m.stacks or [] if k >= n_stacks]
    if bad:
        yield f"model.moe.stacks names stack {bad[0]}; stacks are 0..{n_stacks - 1}"
    p = cfg.progressive
    init = p.growth.init
    copies = init in GROWTH_OPERATORS and GROWTH_OPERATORS.capabilities(init).copies_trunk
    mixed = m.stacks is not None and set(m.stacks) != set(range(n_stacks))
    if p.strategy == "progressive" and copies and mixed:
        yield (
            f"progressive.growth.init '{init}' starts each new stack as a copy of a trained "
            "one, but model.moe.stacks gives experts to some stacks only, and a dense stack "
            "cannot be copied into an MoE one (or back); remove model.moe.stacks (experts in "
            "every stack), or use growth.init random or zero_out"
        )


def _moe_unsupported(cfg: Config) -> dict[str, bool]:
    """Each feature that does not handle experts yet, and whether this config turns it on."""
    m, p, q = cfg.model.moe, cfg.progressive, cfg.quant
    return {
        "model.source hf (a Hugging Face model brings its own layers)": cfg.model.source == "hf",
        "model.init_from_hf (a Llama has dense layers)": cfg.model.init_from_hf is not None,
        "model.frozen_up_proj": cfg.model.frozen_up_proj,
        "lora.enabled": cfg.lora.enabled,
        "quant.enabled": q.enabled,
        f"new_stack_precision {p.new_stack_precision}": p.new_stack_precision
        in (*QUANT_FORMATS, "qlora"),
        "trunk_strategy qlora": p.trunk_strategy == "qlora",
        "train.compile (routing picks sizes at run time, so graphs would recompile)": (
            cfg.train.compile
        ),
        "end_to_end_scope stackwise (its local losses carry no router loss)": (
            p.strategy == "end_to_end" and p.end_to_end_scope == "stackwise"
        ),
        "building_mode prepend with model.moe.stacks (a saved rack is rebuilt by position)": (
            p.strategy == "progressive" and p.building_mode == "prepend" and m.stacks is not None
        ),
    }


@cross_rule
def memory(cfg: Config) -> Iterator[str]:
    """The memory section is read only when the memory extension is on; its shape, and where a
    memory layer can sit."""
    mem = cfg.memory
    if not cfg.memory_on:
        yield from _memory_off(cfg)
        return
    if mem.top_k > mem.chapters:
        yield f"memory.top_k {mem.top_k} exceeds memory.chapters {mem.chapters}: lower top_k"
    if cfg.model.source == "hf":
        yield from _hf_memory(cfg)
        return
    n = cfg.model.n_layers
    bad = [i for i in mem.layers if not -n <= i < n]
    if bad:
        yield f"memory.layers names block {bad[0]}; this rack has blocks 0..{n - 1} (or -{n}..-1)"
    elif len({i % n for i in mem.layers}) != len(mem.layers):
        yield "memory.layers names one block twice (a negative index counts from the end)"
    for what, on in _memory_unsupported(cfg).items():
        if on:
            yield f"memory layers on a rack do not work with {what}"


def _memory_off(cfg: Config) -> Iterator[str]:
    """Memory keys set while the memory extension is off (perhaps misspelt in the list)."""
    mem, gl = cfg.memory, cfg.train.group_lr
    changed = [k for k in type(mem).model_fields if mem.changed(k)]
    near = get_close_matches("memory", cfg.train.enabled_extensions, n=1, cutoff=0.7)
    typo = f" (it lists '{near[0]}': a typo of memory?)" if near else ""
    if changed:
        yield (
            f"memory.{changed[0]} is read only when the memory extension is on: add memory "
            f"to train.enabled_extensions{typo}, or remove the memory section"
        )
    if gl.memory is not None:
        yield "train.group_lr.memory (the memory_lr) needs memory in train.enabled_extensions"


def _memory_unsupported(cfg: Config) -> dict[str, bool]:
    """Each feature a rack's memory layers do not work with, and whether this config turns it on."""
    p = cfg.progressive
    return {
        "progressive growth (it freezes, caches or quantizes the stacks a memory layer sits "
        "in): use progressive.strategy: end_to_end": p.strategy != "end_to_end",
        "end_to_end_scope stackwise (its local losses carry no router loss)": (
            p.end_to_end_scope == "stackwise"
        ),
        "lora.enabled (the memory trains with the whole rack, not beside adapters)": (
            cfg.lora.enabled
        ),
        "quant.enabled (the memory trains with the whole rack in full precision)": (
            cfg.quant.enabled
        ),
        "train.compile (routing picks sizes at run time, so graphs would recompile)": (
            cfg.train.compile
        ),
    }


def _hf_memory(cfg: Config) -> Iterator[str]:
    """A Hugging Face base under memory is frozen: the memory (and LoRA, if on) train."""
    if cfg.train.group_lr.base is not None and not cfg.lora.enabled:
        yield (
            "train.group_lr.base: with memory the Hugging Face base is frozen (only the memory "
            "trains, and LoRA if on); remove it"
        )
    if cfg.train.compile:
        yield (
            "train.compile with memory layers: their routing picks sizes at run time, so the "
            "graphs would recompile every step; remove one of them"
        )
    if cfg.lora.enabled and cfg.lora.save_merged:
        yield (
            "lora.save_merged: a merged model has no memory layers, so it would not be the "
            "model you trained; remove it (the run saves the adapter and memory.safetensors)"
        )
