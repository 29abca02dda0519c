"""Copying a trained stack into a new one: its effective weights, whatever their storage.

A trunk stack may be stored in bf16/fp16, quantized (nf4, fp8, nvfp4) and carry LoRA adapters;
the copy takes what its forward computes with (dequantized base plus every adapter's delta)
into the new float32 stack, which the builder then stores in the new stack's own precision.
Norm weights are copied too. When the two stacks differ in block count, new block i copies
source block i mod (source's blocks), so a deeper stack repeats the source's blocks in order.
"""

from __future__ import annotations

import torch
from torch import nn

from stackwise.errors import StackWiseError
from stackwise.model.layers import Stack
from stackwise.quant.lora import effective_weight

FIX = (
    "Use progressive.growth.init: random or zero_out, or give every stack the same layout "
    "(the same model.moe settings for every stack, no memory layers on the trunk)."
)


def unreadable(what: str) -> StackWiseError:
    return StackWiseError(
        f"The growth operator copies a trained stack into the new one, but {what}. {FIX}"
    )


def copy_stack(source: Stack, target: Stack) -> None:
    """`target`'s weights become `source`'s effective weights (blocks copied cyclically)."""
    if not len(source.blocks):
        raise unreadable("the stack to copy has no blocks")
    with torch.no_grad():
        for i, block in enumerate(target.blocks):
            copy_block(source.blocks[i % len(source.blocks)], block)


def copy_block(source: nn.Module, target: nn.Module) -> None:
    """Every linear by its effective weight (and bias), every other parameter by name."""
    if getattr(source, "memory", None) is not None:
        raise unreadable("the stack to copy has a memory layer the new stack would not have")
    linears = {n: m for n, m in target.named_modules() if isinstance(m, nn.Linear)}
    for name, linear in linears.items():
        copy_linear(_module(source, name), linear, name)
    for name, p in target.named_parameters():
        if name.rpartition(".")[0] in linears:
            continue
        try:
            theirs = source.get_parameter(name)
        except AttributeError:
            raise unreadable(f"the stack to copy has no '{name}'") from None
        _put(p, theirs.detach().float(), name)


def copy_linear(source: nn.Module, target: nn.Linear, name: str) -> None:
    _put(target.weight, effective_weight(source), f"{name}.weight")
    base = source.get_base_layer() if hasattr(source, "get_base_layer") else source
    bias = getattr(base, "bias", None)
    if (bias is None) != (target.bias is None):
        raise unreadable(f"'{name}' has a bias in one stack and none in the other")
    if bias is not None and target.bias is not None:
        _put(target.bias, bias.detach().float(), f"{name}.bias")


def _module(source: nn.Module, name: str) -> nn.Module:
    try:
        return source.get_submodule(name)
    except AttributeError:
        raise unreadable(
            f"the stack to copy has no '{name}' (is one of them an MoE stack and the other dense?)"
        ) from None


def _put(target: torch.Tensor, value: torch.Tensor, name: str) -> None:
    if value.shape != target.shape:
        raise unreadable(
            f"'{name}' is {tuple(value.shape)} in the stack to copy and {tuple(target.shape)} "
            "in the new one"
        )
    target.copy_(value.to(device=target.device, dtype=target.dtype))
