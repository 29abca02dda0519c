"""`MemoryAdapter(config)` (seed 001): the memory-augmented model a config describes, built the
way a run builds it (a Hugging Face base with LoRA and memory layers hooked on, or a rack with
its memory layers), ready for `Trainer(config, model=model)`. `MemoryAdapter(layers)` stays the
module of memory layers itself. Importing this module registers the builder with the class."""

from __future__ import annotations

from typing import Any

from torch import nn

from stackwise.config import Config
from stackwise.errors import StackWiseError
from stackwise.hf import memory as hf_memory
from stackwise.hf.memory import MemoryAdapter
from stackwise.pipeline import adapter_for, prepared, with_hf_source
from stackwise.plan import compile_plan
from stackwise.train.adapters import get_model_adapter

__all__ = ["MemoryAdapter", "memory_model"]


def memory_model(config: Any) -> nn.Module:
    """The model of `config`, whose memory extension must be on (train.enabled_extensions:
    [memory])."""
    if not isinstance(config, Config):
        raise StackWiseError(
            f"MemoryAdapter(config) takes a StackWise config (stackwise.load_config(FILE)), not "
            f"a {type(config).__name__}; MemoryAdapter({{layer index: MemoryLayer}}) is the "
            "module of memory layers alone."
        )
    if not config.memory_on:
        raise StackWiseError(
            "MemoryAdapter(config) builds a model with memory layers, but this config has none: "
            "add memory to train.enabled_extensions (and size it in the memory: section), or "
            "build the plain model with Trainer(config)."
        )
    adapter = get_model_adapter(adapter_for(config))
    if config.model.source == "hf":  # the base names its own vocabulary: no data needed
        plan = compile_plan(with_hf_source(config))
        return adapter.build(plan, 0)
    plan, data = prepared(config)
    return adapter.build(plan, plan.model.vocab_size or len(data.tokenizer))


if not hf_memory.SEED_FRONT:
    hf_memory.SEED_FRONT.append(memory_model)
