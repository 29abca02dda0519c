"""Router losses (seed 001's formulas) and the mixture-of-experts feed-forward layer."""

from __future__ import annotations

import math

import pytest
import torch

from stackwise.model.moe import MoEFeedForward
from stackwise.model.routing import compute_router_auxiliary_loss, losses_of, router_statistics


def test_each_router_loss_matches_a_computation_by_hand():
    logits = torch.tensor([[2.0, 0.0, 0.0, 0.0], [0.0, 2.0, 0.0, 0.0], [0.0, 2.0, 0.0, 0.0]])
    chosen = torch.tensor([[0], [1], [1]])
    losses = losses_of(router_statistics(logits, chosen))
    e2 = math.exp(2.0)
    top, rest = e2 / (e2 + 3), 1 / (e2 + 3)  # the softmax of a row: its 2.0, and each 0.0
    f = [1 / 3, 2 / 3, 0.0, 0.0]
    p = [(top + 2 * rest) / 3, (rest + 2 * top) / 3, rest, rest]
    balance = 4 * sum(a * b for a, b in zip(f, p, strict=True))
    assert losses["load_balance"].item() == pytest.approx(balance)
    assert losses["auxiliary"].item() == pytest.approx(sum((a - 0.25) ** 2 for a in f))
    assert losses["z_loss"].item() == pytest.approx(math.log(e2 + 3) ** 2)


def test_uniform_routing_has_the_floor_of_each_balance_loss():
    logits = torch.zeros(8, 4)
    chosen = torch.arange(8).remainder(4).unsqueeze(-1)
    losses = losses_of(router_statistics(logits, chosen))
    assert losses["load_balance"].item() == pytest.approx(1.0)
    assert losses["auxiliary"].item() == pytest.approx(0.0)


def test_the_aggregate_weighs_each_term_and_averages_over_layers():
    """Seed 001's call, with routers that report their losses already computed."""
    total = compute_router_auxiliary_loss(
        router_losses=[
            {"load_balance": 0.01, "z_loss": 0.001},
            {"load_balance": 0.02, "z_loss": 0.002},
        ],
        load_balance_coef=0.01,
        auxiliary_coef=0.0,
        z_loss_coef=0.001,
    )
    per_layer = [0.01 * 0.01 + 0.001 * 0.001, 0.01 * 0.02 + 0.001 * 0.002]
    assert total.item() == pytest.approx(sum(per_layer) / 2)
    assert compute_router_auxiliary_loss([]).item() == 0.0
    stats = router_statistics(torch.randn(6, 3), torch.tensor([[0], [1], [2], [0], [0], [1]]))
    by_hand = losses_of(stats)
    mixed = compute_router_auxiliary_loss([stats], 0.5, 0.25, 0.125)
    expected = (
        0.5 * by_hand["load_balance"] + 0.25 * by_hand["auxiliary"] + 0.125 * by_hand["z_loss"]
    )
    assert mixed.item() == pytest.approx(expected.item())


def reference(
    moe: MoEFeedForward, x: torch.Tensor, capacity: int | None
) -> tuple[torch.Tensor, int]:
    """Token by token: each choice in token order, an expert refusing tokens past capacity."""
    flat = x.reshape(-1, x.shape[-1])
    probs = moe.router(flat).softmax(-1)
    w, chosen = probs.topk(moe.top_k, dim=-1)
    w = w / w.sum(-1, keepdim=True)
    taken = [0] * len(moe.experts)
    out, dropped = torch.zeros_like(flat), 0
    for t in range(flat.shape[0]):
        for j in range(moe.top_k):
            e = int(chosen[t, j])
            if capacity is not None and taken[e] >= capacity:
                dropped += 1
                continue
            taken[e] += 1
            out[t] += w[t, j] * moe.experts[e](flat[t : t + 1])[0]
        if moe.shared is not None:
            out[t] += moe.shared(flat[t : t + 1])[0]
    return out.view_as(x), dropped


@pytest.mark.parametrize(("capacity_factor", "shared"), [(None, False), (None, True), (0.5, False)])
def test_experts_run_batched_and_equal_a_token_by_token_loop(capacity_factor, shared):
    torch.manual_seed(0)
    moe = MoEFeedForward(
        16, 24, num_experts=4, top_k=2, capacity_factor=capacity_factor, shared_expert=shared
    )
    x = torch.randn(3, 10, 16)
    got = moe(x)
    want, dropped = reference(moe, x, moe.capacity(30))
    assert torch.allclose(got, want, atol=1e-5)
    assert moe.last_stats["dropped"].item() == pytest.approx(dropped / 60)
    assert (dropped > 0) == (capacity_factor is not None)
    assert moe.last_stats["fraction"].sum().item() == pytest.approx(1.0)


def test_the_router_and_every_used_expert_get_gradients():
    torch.manual_seed(1)
    moe = MoEFeedForward(8, 12, num_experts=3, top_k=2, jitter=0.1)
    moe(torch.randn(2, 16, 8)).square().mean().backward()
    assert moe.router.weight.grad is not None and moe.router.weight.grad.abs().sum() > 0
    used = moe.last_stats["fraction"] > 0
    for e, expert in enumerate(moe.experts):
        assert (expert.down_proj.weight.grad is not None) == bool(used[e])


def test_top_k_above_the_experts_is_refused():
    with pytest.raises(ValueError, match="top_k"):
        MoEFeedForward(8, 8, num_experts=2, top_k=3)
