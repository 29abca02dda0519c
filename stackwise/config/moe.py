"""Routed layers: model.moe (mixture-of-experts feed-forward layers in some or all of a rack's
stacks) and memory (routed memory chapters beside chosen blocks or decoder layers). Both share
seed 001's router-loss coefficients."""

from __future__ import annotations

from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt

from stackwise.config.base import Section


class RouterLosses(Section):
    """The weights of the router losses (stackwise.model.routing), per routed layer."""

    load_balance_coef: float = Field(
        0.01, ge=0.0, description="Weight of the load-balancing loss C * sum(f_i * P_i), per layer."
    )
    auxiliary_coef: float = Field(
        0.0, ge=0.0, description="Weight of the spread loss sum((f_i - 1/C)^2), per layer."
    )
    z_loss_coef: float = Field(
        0.001, ge=0.0, description="Weight of the router z-loss mean(logsumexp(logits)^2)."
    )

    def coefs(self) -> tuple[float, float, float]:
        return self.load_balance_coef, self.auxiliary_coef, self.z_loss_coef


class MoEConfig(RouterLosses):
    num_experts: NonNegativeInt = Field(0, description="0: dense; else experts per MoE layer.")
    top_k: PositiveInt = Field(2, description="Experts each token is sent to.")
    capacity_factor: PositiveFloat | None = Field(
        None,
        description="An expert takes at most capacity_factor * tokens * top_k / num_experts; "
        "the rest are dropped and counted. None: no dropping.",
    )
    shared_expert: bool = Field(False, description="An expert every token also goes through.")
    router_jitter: float = Field(
        0.0, ge=0.0, lt=1.0, description="Multiplicative noise on the router's input (training)."
    )
    expert_hidden: PositiveInt | None = Field(
        None, description="Each expert's SwiGLU width; None: model.ffn_hidden's."
    )
    stacks: list[NonNegativeInt] | None = Field(
        None, description="Growth indices of the MoE stacks; None: every stack."
    )

    def at(self, index: int) -> bool:
        """Whether the stack grown `index`-th has MoE feed-forward layers."""
        return self.num_experts > 0 and (self.stacks is None or index in self.stacks)


class MemoryConfig(RouterLosses):
    """Read only when train.enabled_extensions lists memory (the switch, as in seed 002)."""

    chapters: PositiveInt = Field(8, description="C: chapters of slots per memory layer.")
    slots_per_chapter: PositiveInt = Field(16, description="Key/value slots in each chapter.")
    top_k: PositiveInt = Field(2, description="Chapters each token reads.")
    layers: list[int] = Field(
        default_factory=lambda: [-1],
        min_length=1,
        description="Blocks (rack, counted over the whole rack) or decoder layers (hf) that "
        "get a memory layer after them; negative counts from the end.",
    )
