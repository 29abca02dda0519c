"""model.moe: mixture-of-experts feed-forward layers in some or all of a rack's stacks."""

from __future__ import annotations

from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt

from stackwise.config.base import Section


class MoEConfig(Section):
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
    load_balance_coef: float = Field(0.01, ge=0.0, description="C * sum(f_i * P_i), per layer.")
    auxiliary_coef: float = Field(0.0, ge=0.0, description="sum((f_i - 1/C)^2), per layer.")
    z_loss_coef: float = Field(0.001, ge=0.0, description="mean(logsumexp(logits)^2).")

    def at(self, index: int) -> bool:
        """Whether the stack grown `index`-th has MoE feed-forward layers."""
        return self.num_experts > 0 and (self.stacks is None or index in self.stacks)
