"""What routed layers (MoE experts, memory chapters) add to a training step: their router
losses, one average per kind, and the train/* routing metrics that are logged with the loss."""

from __future__ import annotations

import torch
from torch import nn

from stackwise.model.memory import memory_layers, memory_metrics
from stackwise.model.moe import moe_layers
from stackwise.model.routing import router_loss, router_metrics


def routed_families(model: nn.Module) -> list[list[nn.Module]]:
    """The model's routed layers by kind (MoE, memory); each kind has its own coefficients."""
    return [layers for layers in (moe_layers(model), memory_layers(model)) if layers]


def routing_loss(model: nn.Module, families: list[list[nn.Module]]) -> torch.Tensor | float:
    """The router losses of the last forward, one average per kind, in training only."""
    if not model.training or not families:
        return 0.0
    return sum((router_loss(layers) for layers in families), torch.zeros(()))


def routing_metrics(model: nn.Module) -> dict[str, float]:
    """train/* routing values: experts (router_loss, expert_load_cv ...) and memory chapters
    (memory_router_loss, chapter_load_cv ...), per layer too."""
    out = router_metrics(moe_layers(model), "expert")
    return out | memory_metrics(memory_layers(model))
