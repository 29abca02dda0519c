"""`random`: the new stack starts from the rack's own initialisation (GPT-2 style normals)."""

from __future__ import annotations

from stackwise.growth.base import Growth
from stackwise.model.layers import init_weights
from stackwise.registry import register_growth_operator


@register_growth_operator("random", preserves_function=False)
def random_init(growth: Growth) -> None:
    """Draw the stack's weights as a fresh rack's are drawn (from the global RNG, as before
    operators took a context); the trunk is not read."""
    cfg = growth.rack.cfg
    init_weights(growth.stack, cfg.init_std, cfg.n_layers, cfg.d_model)
