"""`random`: the new stack starts from the rack's own initialisation (GPT-2 style normals)."""

from __future__ import annotations

from torch import nn

from stackwise.model.layers import init_weights
from stackwise.registry import register_growth_operator


@register_growth_operator("random", preserves_function=False)
def random_init(new_stack: nn.Module, trunk_stacks: list[nn.Module], rack: nn.Module) -> None:
    """Draw the stack's weights as a fresh rack's are drawn; the trunk is not read."""
    cfg = rack.cfg
    init_weights(new_stack, cfg.init_std, cfg.n_layers, cfg.d_model)
