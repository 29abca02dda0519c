"""A mixture-of-experts feed-forward layer: a router sends each token to its top-k SwiGLU
experts and mixes their outputs by the router's (renormalized) probabilities.

Experts run batched: the (token, choice) pairs are sorted by expert and each expert runs once
on all of its tokens, so the Python loop is over experts, never over tokens. With a capacity
factor c an expert takes at most ceil(c * N * k / E) of the N tokens' N * k choices, in token
order; the rest are dropped (that token keeps its other choices and the residual stream) and
counted. Capacity applies in training only: evaluation and generation route every choice, so
a token's output never depends on the other tokens in its batch. Router jitter multiplies the
router's input by uniform noise in [1 - j, 1 + j] while training. Each forward leaves its
router statistics in `last_stats` for the router losses.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from stackwise.model.routing import compute_router_auxiliary_loss, router_statistics


class Expert(nn.Module):
    """One SwiGLU expert, named like the dense FFN so LoRA targets find it."""

    def __init__(self, d: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(d, hidden, bias=False)
        self.up_proj = nn.Linear(d, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, d, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MoEFeedForward(nn.Module):
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
        self.last_stats: dict[str, Tensor] = {}

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
        weights, chosen = logits.float().softmax(-1).topk(self.top_k, dim=-1)
        if self.top_k > 1:  # renormalized over the chosen; one choice keeps its probability,
            weights = weights / weights.sum(-1, keepdim=True)  # or the router gets no gradient
        weights = weights.to(flat.dtype)
        out, dropped = self._dispatch(flat, chosen, weights)
        if self.shared is not None:
            out = out + self.shared(flat)
        stats = router_statistics(logits, chosen)
        stats["dropped"] = torch.tensor(dropped / max(chosen.numel(), 1))
        self.last_stats = stats
        return out.view_as(x)

    def _dispatch(self, flat: Tensor, chosen: Tensor, weights: Tensor) -> tuple[Tensor, int]:
        """Every expert on its tokens, weighted and summed back; returns (out, dropped)."""
        expert_of = chosen.flatten()  # (N * k,): choice j of token t sits at t * k + j
        order = torch.argsort(expert_of, stable=True)  # by expert, in token order within one
        counts = torch.bincount(expert_of, minlength=len(self.experts)).tolist()
        cap = self.capacity(flat.shape[0]) if self.training else None  # eval: all tokens
        out = torch.zeros_like(flat)
        dropped, start = 0, 0
        for e, count in enumerate(counts):
            pairs = order[start : start + count]
            start += count
            if cap is not None and count > cap:
                dropped += count - cap
                pairs = pairs[:cap]
            # an expert without tokens still runs (on none): its parameters get a zero
            # gradient, not None, so DDP and the hand-made all-reduce see every one each step
            tokens = pairs // self.top_k
            y = self.experts[e](flat[tokens]) * weights.flatten()[pairs].unsqueeze(-1)
            out = out.index_add(0, tokens, y.to(out.dtype))
        return out, dropped


def moe_layers(model: nn.Module) -> list[MoEFeedForward]:
    """The model's MoE layers; without a walk over its modules while none was ever built in
    this process (the training loss asks every step, and most racks are dense)."""
    if not MoEFeedForward.built:
        return []
    return [m for m in model.modules() if isinstance(m, MoEFeedForward)]


def router_loss(layers: list[MoEFeedForward]) -> Tensor:
    """The weighted router loss of the layers' last forward, averaged over the layers that ran
    and train (a frozen trunk's routers neither learn nor dilute the coefficients)."""
    live = [m for m in layers if m.last_stats and m.router.weight.requires_grad]
    if not live:
        return torch.zeros((), device=layers[0].router.weight.device)
    return compute_router_auxiliary_loss([m.last_stats for m in live], *live[0].loss_coefs)


def router_metrics(layers: list[MoEFeedForward]) -> dict[str, float]:
    """What the last step's routing looked like, for the logs: the router loss, its entropy,
    the expert load's coefficient of variation and the dropped share (means over layers), and
    each layer's load CV."""
    layers = [m for m in layers if m.last_stats]  # the ones that ran
    if not layers:
        return {}
    loads = [m.last_stats["fraction"] for m in layers]
    cvs = [float(f.std(correction=0) / f.mean()) for f in loads]
    dropped = [float(m.last_stats["dropped"]) for m in layers]
    entropy = [float(m.last_stats["entropy"]) for m in layers]
    out = {
        "train/router_entropy": sum(entropy) / len(entropy),
        "train/router_loss": float(router_loss(layers).detach()),
        "train/expert_load_cv": sum(cvs) / len(cvs),
        "train/dropped_fraction": sum(dropped) / len(dropped),
    }
    out |= {f"train/expert_load_cv/layer{i}": cv for i, cv in enumerate(cvs)}
    return out
