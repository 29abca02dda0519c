"""Router statistics and seed 001's router losses.

A router (mixture-of-experts, memory chapters) scores C choices per token and keeps the top k.
It reports raw statistics, not losses; `compute_router_auxiliary_loss` turns every layer's
statistics into the three losses and weighs them with the run's coefficients:

- load balance  C * sum_i f_i * P_i, where f_i is the share of the routed slots that chose i
  (each token's k choices count, so the f_i sum to 1) and P_i the mean router probability of i;
  1 when routing is uniform, up to C when one choice takes everything. Only P carries a
  gradient: the counts behind f are not differentiable.
- auxiliary     sum_i (f_i - 1/C)^2: 0 when uniform.
- z-loss        the mean over tokens of logsumexp(router logits)^2: keeps logits small.

Layers are averaged, not summed, so a coefficient means the same at every depth.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

TERMS = ("load_balance", "auxiliary", "z_loss")


def router_statistics(logits: Tensor, chosen: Tensor) -> dict[str, Tensor]:
    """A router's raw statistics: `logits` (N, C) for N tokens, `chosen` (N, k) the indices
    each token was sent to."""
    n_choices = logits.shape[-1]
    counts = torch.bincount(chosen.flatten(), minlength=n_choices).to(torch.float32)
    logp = logits.float().log_softmax(-1)
    return {
        "fraction": counts / max(chosen.numel(), 1),
        "probability": logp.exp().mean(0),
        "z": torch.logsumexp(logits.float(), -1).square().mean(),
        # not a loss: how sure the router is (log C when uniform), for the logs
        "entropy": -(logp.exp() * logp).sum(-1).mean().detach(),
    }


def losses_of(stats: Mapping[str, Tensor | float]) -> dict[str, Tensor]:
    """The three losses of one router, from its statistics (or as given, when a router
    reports them already computed, as seed 001's routers do)."""
    if "fraction" not in stats:
        return {t: torch.as_tensor(stats.get(t, 0.0), dtype=torch.float32) for t in TERMS}
    f, p = torch.as_tensor(stats["fraction"]), torch.as_tensor(stats["probability"])
    c = f.numel()
    return {
        "load_balance": c * (f * p).sum(),
        "auxiliary": (f - 1.0 / c).square().sum(),
        "z_loss": stats["z"],
    }


def compute_router_auxiliary_loss(
    router_losses: Sequence[Mapping[str, Tensor | float]],
    load_balance_coef: float = 0.01,
    auxiliary_coef: float = 0.0,
    z_loss_coef: float = 0.001,
) -> Tensor:
    """The weighted router loss, averaged over layers. Each entry is one router's statistics
    (`fraction`, `probability`, `z`, from router_statistics) or its losses (`load_balance`,
    `auxiliary`, `z_loss`; a missing one counts 0). No routers: 0."""
    coefs = dict(zip(TERMS, (load_balance_coef, auxiliary_coef, z_loss_coef), strict=True))
    totals = []
    for stats in router_losses:
        losses = losses_of(stats)
        totals.append(sum(coefs[t] * losses[t] for t in TERMS))
    if not totals:
        return torch.zeros(())
    return torch.stack([torch.as_tensor(t) for t in totals]).mean()
