"""Memory layers on a Hugging Face causal LM (train.enabled_extensions: memory).

`MemoryAdapter` holds one routed memory layer (stackwise.model.memory) per chosen decoder layer
and adds each one's gated read to that layer's output through a forward hook. Hooks rather
than wrapper modules keep the base's parameter names as they were, so the LoRA adapter saved
beside the memory still loads onto a plain base with PEFT. The adapter sits in the model's
module tree (as `stackwise_memory`), so the optimizer, DDP and `model.modules()` see it. The
base is frozen: only the memory trains, and LoRA when it is on. Its weights are saved apart,
in memory.safetensors, next to the adapter.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn

from stackwise.errors import StackWiseError
from stackwise.io.files import read_tensors, save_tensors
from stackwise.model.memory import MemoryLayer, chosen_indices, new_memory
from stackwise.spec import Plan

MEMORY_WEIGHTS = "memory.safetensors"
ATTRIBUTE = "stackwise_memory"


def _base(model: nn.Module) -> nn.Module:
    """The transformers model under a PEFT wrapper (or the model itself)."""
    get = getattr(model, "get_base_model", None)
    return get() if callable(get) else model


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    get = getattr(_base(model), "get_decoder", None)
    layers = getattr(get() if callable(get) else None, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise StackWiseError(
            f"memory: cannot find the decoder layers of this {type(_base(model)).__name__} "
            "(its get_decoder() has no `layers` list). Memory layers fit Llama-style models "
            "(Llama, Qwen2, Mistral ...); remove memory from train.enabled_extensions."
        )
    return layers


def _add_read(memory: MemoryLayer, module: nn.Module, args: Any, output: Any) -> Any:
    """Forward hook: the decoder layer's hidden states plus the memory's gated read."""
    hidden = output[0] if isinstance(output, tuple) else output
    own = memory.gate.dtype  # a bf16 or 4-bit base's activations, without autocast: our dtype
    if hidden.dtype != own and not torch.is_autocast_enabled(hidden.device.type):
        new = memory(hidden.to(own)).to(hidden.dtype)
    else:
        new = memory(hidden)
    return (new, *output[1:]) if isinstance(output, tuple) else new


# `MemoryAdapter(config)` (seed 001) builds the whole memory-augmented model from a config,
# which is read above this layer: stackwise.fronts.memory registers that builder here
SEED_FRONT: list[Any] = []


class MemoryAdapter(nn.Module):
    """The memory layers of one model, keyed by the index of the decoder layer they follow.
    `MemoryAdapter(config)` is the seeds' call: the config's whole model (see SEED_FRONT)."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        given = args[0] if args else kwargs.get("config", kwargs.get("layers"))
        if isinstance(given, dict):
            return super().__new__(cls)
        if not SEED_FRONT:
            raise StackWiseError(
                "MemoryAdapter(config) is built by stackwise.fronts.memory: import the class "
                "from stackwise (`from stackwise import MemoryAdapter`), which loads it."
            )
        return SEED_FRONT[0](*args, **kwargs)

    def __init__(self, layers: dict[int, MemoryLayer]) -> None:
        super().__init__()
        self.layers = nn.ModuleDict({str(i): m for i, m in layers.items()})
        self.handles: list[Any] = []

    def hook(self, decoder: nn.ModuleList) -> None:
        for index, memory in self.layers.items():
            hook = partial(_add_read, memory)
            self.handles.append(decoder[int(index)].register_forward_hook(hook))


def attach_memory_hf(model: nn.Module, plan: Plan) -> MemoryAdapter:
    """Memory layers after the decoder layers named by plan.memory.layers, on the model's
    device; without LoRA the base is frozen (with it, PEFT froze it and left LoRA's weights
    on)."""
    if memory_of(model) is not None:
        raise ValueError("this model has its memory layers already; attach them once")
    if not plan.lora.enabled:
        model.requires_grad_(False)
    decoder = decoder_layers(model)
    try:
        where = chosen_indices(plan.memory.layers, len(decoder), "decoder layer")
    except ValueError as err:
        raise StackWiseError(f"{err}. Pick memory.layers within this model's layers.") from None
    text = getattr(_base(model).config, "get_text_config", lambda: _base(model).config)()
    adapter = MemoryAdapter({i: new_memory(text.hidden_size, plan.memory) for i in where})
    for i, layer in adapter.layers.items():
        layer.where = int(i)
    adapter.to(next(model.parameters()).device)
    _base(model).add_module(ATTRIBUTE, adapter)
    adapter.hook(decoder)
    return adapter


def memory_of(model: nn.Module) -> MemoryAdapter | None:
    found = getattr(_base(model), ATTRIBUTE, None)
    return found if isinstance(found, MemoryAdapter) else None


def save_memory(model: nn.Module, folder: Path) -> None:
    adapter = memory_of(model)
    if adapter is not None:
        save_tensors(adapter.state_dict(), folder / MEMORY_WEIGHTS)


def load_memory(model: nn.Module, folder: Path) -> None:
    """memory.safetensors of `folder` into the model's memory layers (same layers and sizes)."""
    adapter = memory_of(model)
    assert adapter is not None
    state = read_tensors(
        folder / MEMORY_WEIGHTS, "Pass a folder a memory run wrote, or retrain its memory."
    )
    try:
        adapter.load_state_dict(state)
    except RuntimeError as err:
        raise StackWiseError(
            f"'{folder / MEMORY_WEIGHTS}' does not fit this config's memory layers "
            f"({str(err)[:160]}). Use the config.yaml it was saved with."
        ) from None


MODEL_CARD_NOTE = """
## Memory layers

This run also trained routed memory layers beside the base, saved in `memory.safetensors`.
Loading only the base (and the LoRA adapter, with `PeftModel.from_pretrained`) leaves them
out, which is not the model that was trained. Load the whole of it with StackWise:
`stackwise generate --checkpoint <this folder> --chat ...`, or in Python
`stackwise.runs.load_finetuned("<this folder>")`.
"""


def note_memory(folder: Path) -> None:
    """Say in the run's model card (PEFT's README.md, or a new one) how to load the memory."""
    from stackwise.io.files import write_atomic

    card = folder / "README.md"
    text = card.read_text(encoding="utf-8") if card.is_file() else "# StackWise run\n"
    if MODEL_CARD_NOTE not in text:
        write_atomic(card, text.rstrip("\n") + "\n" + MODEL_CARD_NOTE)


def describe_memory(model: nn.Module) -> str:
    adapter = memory_of(model)
    if adapter is None:
        return ""
    first = next(iter(adapter.layers.values()))
    assert isinstance(first, MemoryLayer)
    where = ", ".join(adapter.layers.keys())
    slots = first.keys.shape[1]
    return (
        f" + memory after decoder layer(s) {where} ({first.chapters} chapters x {slots} slots, "
        f"top-{first.top_k})"
    )
