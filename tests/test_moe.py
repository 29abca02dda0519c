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
    stats = router_statistics(logits, chosen)
    losses = losses_of(stats)
    assert losses["load_balance"].item() == pytest.approx(1.0)
    assert losses["auxiliary"].item() == pytest.approx(0.0)
    assert stats["entropy"].item() == pytest.approx(math.log(4))


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
    for e, expert in enumerate(moe.experts):  # every expert has a gradient, zero if unused
        grad = expert.down_proj.weight.grad
        assert grad is not None and bool(grad.abs().sum() > 0) == bool(used[e])


def test_an_expert_without_tokens_still_gets_a_zero_gradient():
    """So DDP (find_unused_parameters off) and the hand-made all-reduce see every parameter."""
    torch.manual_seed(2)
    moe = MoEFeedForward(8, 12, num_experts=3, top_k=1)
    with torch.no_grad():
        moe.router.weight[2] = -100.0  # on positive inputs expert 2 never wins
    x = torch.randn(4, 8, 8).abs()
    moe(x).square().mean().backward()
    assert moe.last_stats["fraction"][2] == 0
    assert torch.count_nonzero(moe.experts[2].down_proj.weight.grad) == 0


def test_one_choice_keeps_its_probability_so_the_router_learns_from_the_lm_loss():
    torch.manual_seed(3)
    moe = MoEFeedForward(8, 12, num_experts=4, top_k=1)
    moe(torch.randn(2, 8, 8)).square().mean().backward()  # no router loss at all
    assert moe.router.weight.grad.abs().sum() > 0


def test_the_load_balance_term_reaches_the_router():
    from stackwise.model.routing import router_loss

    torch.manual_seed(4)
    moe = MoEFeedForward(8, 12, num_experts=4, top_k=2, loss_coefs=(1.0, 0.0, 0.0))
    moe(torch.randn(2, 8, 8))
    router_loss([moe]).backward()
    assert moe.router.weight.grad.abs().sum() > 0


def test_capacity_drops_only_in_training():
    """Evaluation and generation route every choice, whatever the batch holds."""
    torch.manual_seed(5)
    moe = MoEFeedForward(16, 24, num_experts=4, top_k=2, capacity_factor=0.5).eval()
    x = torch.randn(3, 10, 16)
    want, _ = reference(moe, x, None)
    assert torch.allclose(moe(x), want, atol=1e-5)
    assert moe.last_stats["dropped"].item() == 0
    alone = moe(x[:1])  # the first row's output does not depend on the other rows
    assert torch.allclose(alone, want[:1], atol=1e-5)


def test_top_k_above_the_experts_is_refused():
    with pytest.raises(ValueError, match="top_k"):
        MoEFeedForward(8, 8, num_experts=2, top_k=3)


# -- model.moe in racks --------------------------------------------------------------------

MOE = {"num_experts": 4, "top_k": 2, "capacity_factor": 1.5, "shared_expert": True}


def moe_model(**moe):
    return {"n_stacks": 2, "blocks_per_stack": 1, "moe": {**MOE, **moe}}


def test_an_moe_rack_trains_logs_its_routing_and_reloads(tiny, tmp_path):
    import json

    from stackwise.model.moe import moe_layers
    from stackwise.pipeline import train_from_config
    from stackwise.runs import load_trained

    out = tmp_path / "moe"
    model = moe_model(capacity_factor=0.5)  # half an even share: some choices must drop
    cfg = tiny(model=model, train={"max_steps": 8, "output_dir": str(out)})
    result = train_from_config(cfg, quiet=True)
    layers = moe_layers(result.rack)
    assert len(layers) == 2 and all(len(m.experts) == 4 and m.shared is not None for m in layers)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in rows if "train/router_loss" in r]
    assert all(0 < r["train/router_entropy"] <= math.log(4) + 1e-6 for r in logged)
    assert logged and all(
        r["train/router_loss"] > 0 and "train/expert_load_cv" in r for r in logged
    )
    assert any(r.get("train/dropped_fraction", 0) > 0 for r in logged)
    from stackwise.report import write_report

    page = write_report([out]).read_text(encoding="utf-8")  # the report plots the routing
    assert 'id="plot-routing"' in page and "train/router_entropy" in page
    assert "layer0" not in page  # the per-layer values stay in metrics.jsonl, not in the plot
    history = [h["loss"] for h in result.state.history if "loss" in h]
    assert history[-1] < history[0]
    _, again, _ = load_trained(out)
    ids = torch.randint(4, 60, (2, 16))
    result.rack.eval()
    assert torch.equal(result.rack(ids), again.eval()(ids))


def test_the_router_loss_joins_the_training_loss_only(tiny):
    from stackwise.model.moe import moe_layers
    from stackwise.model.routing import router_loss
    from stackwise.objectives import Specials, build_objective
    from stackwise.train import build_rack
    from stackwise.train.adapters import RackAdapter

    cfg = tiny(model=moe_model(load_balance_coef=1.0, z_loss_coef=0.5))
    rack = build_rack(cfg, 300)
    objective = build_objective(cfg, Specials(300, 0, 3, 1, 2))
    batch = {"input_ids": torch.randint(4, 300, (2, 16))}
    adapter = RackAdapter()
    for training in (True, False):
        rack.train(training)
        total = adapter.loss(rack, objective, batch, torch.Generator().manual_seed(0), False)
        logits = rack(batch["input_ids"])
        plain = objective.loss(logits, objective.prepare(batch, torch.Generator().manual_seed(0)))
        extra = router_loss(moe_layers(rack)) if training else 0.0
        assert torch.allclose(total, plain + extra, atol=1e-6)


def test_growth_adds_an_moe_stack_on_a_dense_trunk_and_resumes_bitwise(tiny, tmp_path):
    from test_checkpoints import crash_then_resume
    from test_progressive import grown

    from stackwise.model.moe import MoEFeedForward
    from stackwise.pipeline import train_from_config

    def cfg(name, **train):
        out = {"save_steps": 2, "output_dir": str(tmp_path / name), **train}
        return grown(
            tiny, 2, {"steps_per_stack": 4}, model={"moe": {**MOE, "stacks": [1]}}, train=out
        )

    full = train_from_config(cfg("full"), quiet=True)
    kinds = [type(s.blocks[0].ffn) is MoEFeedForward for s in full.rack.stacks]
    assert kinds == [False, True]
    resumed = crash_then_resume(cfg, 1, 2)
    wa, wb = full.rack.state_dict(), resumed.rack.state_dict()
    assert [k for k in wa if not torch.equal(wa[k], wb[k])] == []


def test_router_and_experts_train_in_the_blocks_group(tiny):
    from stackwise.train import build_rack
    from stackwise.train.adapters import RackAdapter

    groups = RackAdapter().named_groups(build_rack(tiny(model=moe_model()), 300))
    names = {n: g for g, params in groups.items() for n, _ in params}
    assert names["stacks.0.blocks.0.ffn.router.weight"] == "blocks"
    assert names["stacks.1.blocks.0.ffn.experts.3.down_proj.weight"] == "blocks"


@pytest.mark.parametrize(
    ("model", "sections", "words"),
    [
        ({"moe": {"num_experts": 1}}, {}, "num_experts 1"),
        ({"moe": {"num_experts": 2, "top_k": 3}}, {}, "exceeds num_experts"),
        ({"moe": {"num_experts": 4, "stacks": [5]}}, {}, "names stack 5"),
        ({"moe": {"top_k": 1}}, {}, "needs experts"),
        ({"moe": {"num_experts": 4}}, {"lora": {"enabled": True}}, "lora.enabled"),
        ({"moe": {"num_experts": 4, "capacity_factor": 0}}, {}, "capacity_factor"),
        ({"moe": {"num_experts": 4}}, {"train": {"compile": True}}, "train.compile"),
        (
            {"moe": {"num_experts": 4}},
            {"progressive": {"end_to_end_scope": "stackwise"}},
            "end_to_end_scope stackwise",
        ),
        (
            {"moe": {"num_experts": 4, "stacks": [1]}},
            {"progressive": {"strategy": "progressive", "building_mode": "prepend"}},
            "building_mode prepend",
        ),
    ],
)
def test_moe_settings_that_cannot_work_are_refused(model, sections, words):
    from stackwise.config import from_dict
    from stackwise.errors import StackWiseError

    with pytest.raises(StackWiseError, match=words):
        from_dict({"model": {"n_stacks": 2, **model}, **sections})


def test_an_moe_rack_does_not_export_to_llama(tiny, tmp_path):
    from stackwise.errors import StackWiseError
    from stackwise.model.hf import export_llama
    from stackwise.train import build_rack

    with pytest.raises(StackWiseError, match="cannot hold"):
        export_llama(build_rack(tiny(model=moe_model()), 300), tmp_path / "hf")


def test_every_moe_setting_reaches_the_layers(tiny):
    from stackwise.model.moe import moe_layers
    from stackwise.train import build_rack

    moe = {"expert_hidden": 24, "router_jitter": 0.1, "auxiliary_coef": 0.3, "z_loss_coef": 0.2}
    moe |= {"load_balance_coef": 0.05, "capacity_factor": 2.0, "top_k": 1}
    layer = moe_layers(build_rack(tiny(model=moe_model(**moe)), 300))[0]
    assert layer.experts[0].gate_proj.out_features == 24 and layer.shared is not None
    assert (layer.jitter, layer.capacity_factor, layer.top_k) == (0.1, 2.0, 1)
    assert layer.loss_coefs == (0.05, 0.3, 0.2)
