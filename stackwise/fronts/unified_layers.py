"""The layers `UnifiedTrainer.train_all_layers` is given, as the blocks of the stacks it trains:
read from Blocks, Stacks or a Rack, grouped per training stage, placed into the growing rack
(or an end-to-end one) as the very objects given, and the model keys they decide."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from stackwise.errors import StackWiseError
from stackwise.growth import Growth
from stackwise.model.layers import Block, Stack
from stackwise.model.rack import Rack
from stackwise.strategies import LocalLossStrategy
from stackwise.train.strategy import TrainingStrategy

NOT_LAYERS = (
    "train_all_layers trains StackWise transformer layers: a list of stackwise.Block (build "
    "them with UnifiedTrainer(config).new_layers()), Stacks, or a Rack (its stacks' blocks). "
    "Got {what}, which cannot be grown as stacks; for a Hugging Face model use "
    "`stackwise finetune` (model.source: hf)."
)


def as_layers(model_layers: Any) -> list[Block]:
    """The Blocks in `model_layers` (Blocks, Stacks, a Rack, or lists of them), in order."""
    if isinstance(model_layers, Rack):
        model_layers = list(model_layers.stacks)
    if isinstance(model_layers, Block):
        return [model_layers]
    if isinstance(model_layers, Stack):
        return list(model_layers.blocks)  # type: ignore[arg-type]
    if not isinstance(model_layers, Iterable) or isinstance(model_layers, str | bytes):
        raise StackWiseError(NOT_LAYERS.format(what=type(model_layers).__name__))
    layers: list[Block] = []
    for item in model_layers:
        if not isinstance(item, Block | Stack):
            raise StackWiseError(NOT_LAYERS.format(what=f"a {type(item).__name__} among them"))
        layers += as_layers(item)
    if not layers:
        raise StackWiseError("train_all_layers was given no layers to train.")
    if len({id(b) for b in layers}) != len(layers):
        raise StackWiseError("train_all_layers was given the same layer twice; give each once.")
    return layers


def grouped(layers: list[Block], size: int) -> list[list[Block]]:
    """Consecutive groups of `size` layers, one per stack (the last may be shorter)."""
    return [layers[i : i + size] for i in range(0, len(layers), size)]


def layer_shape(layers: list[Block]) -> tuple[dict[str, Any], bool]:
    """(the model keys the layers decide, whether they attend causally); all must agree."""
    shapes = set()
    for b in layers:
        attn = b.attn
        width = getattr(b.ffn, "gate_proj", None)
        shapes.add(
            (
                attn.q_proj.in_features,
                attn.n_heads,
                attn.n_kv,
                width.out_features if width is not None else None,
                attn.q_proj.bias is not None,
                attn.causal,
            )
        )
    if len(shapes) != 1:
        raise StackWiseError(
            "The layers given to train_all_layers differ in shape (width, heads, FFN, "
            "attention direction); one rack's layers must share one shape."
        )
    d, heads, kv, ffn, bias, causal = shapes.pop()
    keys = {"d_model": d, "n_heads": heads, "n_kv_heads": kv if kv != heads else None}
    return {**keys, "ffn_hidden": ffn, "attention_bias": bias}, causal


class GivenLayers:
    """A growth operator for one run: stack g (the g-th grown) takes group g of the layers
    given, the very modules, in place of the blocks it was built with."""

    def __init__(self, groups: list[list[Block]]) -> None:
        self.groups = groups

    def __call__(self, growth: Growth) -> None:
        growth.stack.blocks = nn.ModuleList(self.groups[growth.index])
        for p in growth.stack.parameters():
            p.requires_grad_(p.is_floating_point())


def rack_of(plan: Any, vocab_size: int, groups: list[list[Block]]) -> Rack:
    """An end-to-end rack whose stacks hold the given layers (embeddings, norm and head new)."""
    rack = Rack(plan.model, vocab_size, plan.objective.causal, plan.masking.num_time_steps, 0)
    for index, group in enumerate(groups):
        stack = Stack(plan.model, plan.objective.causal, n_blocks=0, index=index)
        stack.blocks = nn.ModuleList(group)
        rack.stacks.append(stack)
    if plan.memory_on:
        from stackwise.model.memory import attach_memory

        attach_memory(rack, plan)
    if plan.lora.enabled:
        from stackwise.quant.rack_qlora import adapt_rack

        adapt_rack(rack, plan.lora, plan.quant)
    return rack


class StageLossLog:
    """Every optimizer step's loss, one list per Trainer the strategy serves (each binds its
    own copy of the strategy; the copies share `runs`), in the order they trained."""

    runs: list[list[float]]

    def bind(self, ctx: Any) -> None:
        super().bind(ctx)  # type: ignore[misc]
        self.current: list[float] = []
        self.runs.append(self.current)

    def train_step(
        self,
        model: nn.Module,
        batch: dict[str, torch.Tensor],
        optimizer: Any,
        scaler: Any,
        scheduler: Any,
        update_gradients: bool = True,
    ) -> torch.Tensor:
        loss = super().train_step(  # type: ignore[misc]
            model, batch, optimizer, scaler, scheduler, update_gradients
        )
        step = self.ctx.step_loss  # type: ignore[attr-defined]
        if update_gradients and step is not None:
            self.current.append(float(step))
        return loss


class LoggedStep(StageLossLog, TrainingStrategy):
    """The standard step (whole model, one loss; each progressive stage), its losses kept."""

    def __init__(self) -> None:
        super().__init__()
        self.runs = []


class LoggedLocalLosses(StageLossLog, LocalLossStrategy):
    """end_to_end_scope stackwise: a detached loss per stack, the last stack's kept."""

    def __init__(self) -> None:
        super().__init__()
        self.runs = []
