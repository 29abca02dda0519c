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

Also here, what every routed layer shares: picking the top k (`route`), running each choice on
its tokens (`dispatch`, a loop over choices; `grouped`, for one batched matmul), recording the
routing (`RoutingRecord`) and the scope of a training forward (`routing_scope`), and the loss
and log values of a set of layers (`router_loss`, `router_metrics`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor, nn

TERMS = ("load_balance", "auxiliary", "z_loss")


def router_statistics(
    logits: Tensor, chosen: Tensor, keep: Tensor | None = None
) -> dict[str, Tensor]:
    """A router's raw statistics: `logits` (N, C) for N tokens, `chosen` (N, k) the indices
    each token was sent to; with `keep` (N,) only the tokens it marks (padding is routed like
    any token, but must not count in the balance losses or the load)."""
    if keep is not None and keep.numel() == logits.shape[0]:
        logits, chosen = logits[keep], chosen[keep]
    n_choices = logits.shape[-1]
    counts = torch.bincount(chosen.flatten(), minlength=n_choices).to(torch.float32)
    logp = logits.float().log_softmax(-1)
    with torch.no_grad():  # not a loss: how sure the router is (log C when uniform), for logs
        entropy = -(logp.exp() * logp).sum(-1).mean()
    return {
        "fraction": counts / max(chosen.numel(), 1),
        "probability": logp.exp().mean(0),
        "z": torch.logsumexp(logits.float(), -1).square().mean(),
        "entropy": entropy,
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


class RoutingRecord:
    """Mixin of a routed layer: its last routing, kept raw (router logits, choices, which
    tokens are real), and the statistics computed from it on demand (`last_stats`).

    Inside `routing_scope` only the first forward records: a replay of that forward under
    gradient checkpointing, in backward, computes the same routing and must neither replace it
    nor run other operations than the first run did (the checkpoint would refuse it)."""

    last_routing: dict[str, Tensor] | None = None
    token_mask: Tensor | None = None  # (N,) real tokens, for the forward in routing_scope
    recording = ""  # "open": inside a scope, nothing recorded yet; "done": recorded

    def record(self, logits: Tensor, chosen: Tensor, **extra: Tensor) -> None:
        if self.recording == "done":
            return
        self.last_routing = {"logits": logits, "chosen": chosen, **extra}
        self.last_routing["keep"] = self.token_mask  # type: ignore[assignment]
        if self.recording == "open":
            self.recording = "done"

    @property
    def last_stats(self) -> dict[str, Tensor]:
        """router_statistics of the last routing (real tokens only), plus the layer's extras
        (`dropped`, for experts); {} before any forward."""
        raw = self.last_routing
        if raw is None:
            return {}
        stats = router_statistics(raw["logits"], raw["chosen"], raw["keep"])
        return stats | {k: v for k, v in raw.items() if k not in ("logits", "chosen", "keep")}


def dispatch(
    flat: Tensor,
    chosen: Tensor,
    weights: Tensor,
    runs: Sequence[Callable[[Tensor], Tensor]],
    capacity: int | None = None,
) -> tuple[Tensor, int]:
    """Each choice's `runs[c]` on the tokens routed to it, weighted and summed back per token;
    returns (out, dropped). The (token, choice) pairs are sorted by choice, so each runs once
    on all of its tokens: the Python loop is over choices, never over tokens. Past `capacity`
    a choice keeps its first tokens (in token order) and the rest are dropped and counted."""
    top_k = chosen.shape[-1]
    choice_of = chosen.flatten()  # (N * k,): choice j of token t sits at t * k + j
    order = torch.argsort(choice_of, stable=True)
    counts = torch.bincount(choice_of, minlength=len(runs)).tolist()
    out = torch.zeros_like(flat)
    dropped, start = 0, 0
    for run, count in zip(runs, counts, strict=True):
        pairs = order[start : start + count]
        start += count
        if capacity is not None and count > capacity:
            dropped += count - capacity
            pairs = pairs[:capacity]
        # a choice without tokens still runs (on none): its parameters get a zero gradient,
        # not None, so DDP and the hand-made all-reduce see every one each step
        tokens = pairs // top_k
        y = run(flat[tokens]) * weights.flatten()[pairs].unsqueeze(-1)
        out = out.index_add(0, tokens, y.to(out.dtype))
    return out, dropped


def grouped(chosen: Tensor, n_choices: int) -> tuple[Tensor, Tensor]:
    """The (token, choice) pairs grouped by choice, each group padded to the largest: (pairs,
    valid), both (n_choices, width); pairs index chosen.flatten() (token = pair // k), valid
    marks the real ones. One batched matmul then serves every choice, with no Python loop."""
    choice_of = chosen.flatten()
    order = torch.argsort(choice_of, stable=True)
    counts = torch.bincount(choice_of, minlength=n_choices)
    first = torch.cumsum(counts, 0) - counts  # where each choice's pairs start in `order`
    sorted_choice = choice_of[order]
    slot = torch.arange(order.numel(), device=order.device) - first[sorted_choice]
    # rounded up to a multiple of 64: widths then repeat from step to step, and the CPU
    # allocator reuses their blocks (exact widths grew a memory run's peak RSS 2.2x)
    width = -(-max(int(counts.max()) if order.numel() else 0, 1) // 64) * 64
    pairs = torch.zeros(n_choices, width, dtype=torch.long, device=order.device)
    valid = torch.zeros(n_choices, width, dtype=torch.bool, device=order.device)
    pairs[sorted_choice, slot] = order
    valid[sorted_choice, slot] = True
    return pairs, valid


def route(logits: Tensor, top_k: int) -> tuple[Tensor, Tensor]:
    """(weights, chosen): the top-k choices by router probability, their weights renormalized
    over the chosen; a single choice keeps its probability, or the router gets no gradient."""
    weights, chosen = logits.float().softmax(-1).topk(top_k, dim=-1)
    if top_k > 1:
        weights = weights / weights.sum(-1, keepdim=True)
    return weights, chosen


@contextmanager
def routing_scope(layers: Sequence[nn.Module], attention_mask: Tensor | None) -> Iterator[None]:
    """Around a training forward: the routers forget their last statistics and learn which
    tokens are real (attention_mask (B, L), 1 for a token; None: all are) for this forward
    only, so no later forward (evaluation, generation) reads a stale mask."""
    keep = attention_mask.flatten().bool() if attention_mask is not None else None
    for layer in layers:
        layer.last_routing, layer.token_mask, layer.recording = None, keep, "open"
    try:
        yield
    finally:
        for layer in layers:
            layer.token_mask = None


def router_loss(layers: Sequence[nn.Module]) -> Tensor:
    """The weighted router loss of routed layers' last forward (their `last_stats`), averaged
    over the layers that ran and train (a frozen router neither learns nor dilutes the
    coefficients), with the `loss_coefs` of the first."""
    live = [m for m in layers if m.last_routing is not None and m.router.weight.requires_grad]
    if not live:
        return torch.zeros((), device=layers[0].router.weight.device)
    return compute_router_auxiliary_loss([m.last_stats for m in live], *live[0].loss_coefs)


def router_metrics(layers: Sequence[nn.Module], unit: str, prefix: str = "") -> dict[str, float]:
    """What the last step's routing looked like, for the logs: the router loss and entropy,
    the load's coefficient of variation over the `unit`s (experts, chapters) and, where tokens
    can be dropped, the dropped share (means over layers), and each layer's load CV and
    entropy."""
    layers = [m for m in layers if m.last_routing is not None]  # the ones that ran
    if not layers:
        return {}
    stats = [m.last_stats for m in layers]
    cvs = [float(s["fraction"].std(correction=0) / s["fraction"].mean()) for s in stats]
    entropy = [float(s["entropy"]) for s in stats]
    out = {
        f"train/{prefix}router_entropy": sum(entropy) / len(entropy),
        f"train/{prefix}router_loss": float(router_loss(layers).detach()),
        f"train/{unit}_load_cv": sum(cvs) / len(cvs),
    }
    if "dropped" in stats[0]:
        dropped = [float(s["dropped"]) for s in stats]
        out["train/dropped_fraction"] = sum(dropped) / len(dropped)
    names = [getattr(m, "where", None) for m in layers]  # a memory layer's block / decoder layer
    names = [i if n is None else n for i, n in enumerate(names)]
    out |= {f"train/{unit}_load_cv/layer{n}": cv for n, cv in zip(names, cvs, strict=True)}
    out |= {
        f"train/{prefix}router_entropy/layer{n}": e for n, e in zip(names, entropy, strict=True)
    }
    return out
