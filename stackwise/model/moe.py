"""A mixture-of-experts feed-forward layer: a router sends each token to its top-k SwiGLU
experts and mixes their outputs by the router's (renormalized) probabilities.

Experts run batched (routing.dispatch): each expert runs once on all of its tokens, so the
Python loop is over experts, never over tokens. With a capacity
factor c an expert takes at most ceil(c * N * k / E) of the N tokens' N * k choices, in token
order; the rest are dropped (that token keeps its other choices and the residual stream) and
counted. Capacity applies in training only: evaluation and generation route every choice, so
a token's output never depends on the other tokens in its batch. Router jitter multiplies the
router's input by uniform noise in [1 - j, 1 + j] while training. Each forward leaves its
routing for the router losses (routing.RoutingRecord: `last_stats`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from stackwise.model.lean_autograd import silu_mul
from stackwise.model.routing import RoutingRecord, dispatch, route


class Expert(nn.Module):
    """One SwiGLU expert, named like the dense FFN so LoRA targets find it."""

    def __init__(self, d: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(d, hidden, bias=False)
        self.up_proj = nn.Linear(d, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, d, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(silu_mul(self.gate_proj(x), self.up_proj(x)))


class MoEFeedForward(RoutingRecord, nn.Module):
    built = 0  # layers made in this process, so dense runs can skip looking for them

    def __init__(
        self,
        d: int,
        hidden: int,
        num_experts: int,
        top_k: int,
        capacity_factor: float | None = None,
        shared_expert: bool = False,
        jitter: float = 0.0,
        loss_coefs: tuple[float, float, float] = (0.01, 0.0, 0.001),
    ) -> None:
        """`loss_coefs`: (load balance, auxiliary, z-loss) weights for router_loss."""
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"top_k {top_k} must be within 1..num_experts ({num_experts})")
        self.top_k, self.capacity_factor, self.jitter = top_k, capacity_factor, jitter
        self.loss_coefs = loss_coefs
        MoEFeedForward.built += 1
        self.router = nn.Linear(d, num_experts, bias=False)
        self.experts = nn.ModuleList(Expert(d, hidden) for _ in range(num_experts))
        self.shared = Expert(d, hidden) if shared_expert else None

    def capacity(self, n_tokens: int) -> int | None:
        if self.capacity_factor is None:
            return None
        slots = n_tokens * self.top_k / len(self.experts)
        return max(1, math.ceil(self.capacity_factor * slots))

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, x.shape[-1])
        scores_in = flat
        if self.training and self.jitter > 0:
            noise = torch.empty_like(flat).uniform_(1 - self.jitter, 1 + self.jitter)
            scores_in = flat * noise
        logits = self.router(scores_in)
        weights, chosen = route(logits, self.top_k)
        cap = self.capacity(flat.shape[0]) if self.training else None  # eval: all tokens
        runs = list(self.experts)
        out, dropped = dispatch(flat, chosen, weights.to(flat.dtype), runs, cap)
        if self.shared is not None:
            out = out + self.shared(flat)
        self.record(logits, chosen, dropped=torch.tensor(dropped / max(chosen.numel(), 1)))
        return out.view_as(x)


def moe_layers(model: nn.Module) -> list[MoEFeedForward]:
    """The model's MoE layers; without a walk over its modules while none was ever built in
    this process (the training loss asks every step, and most racks are dense)."""
    if not MoEFeedForward.built:
        return []
    return [m for m in model.modules() if isinstance(m, MoEFeedForward)]
