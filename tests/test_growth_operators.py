"""Growth operators: how a new stack starts (progressive.growth.init) and the noise on top of it
(progressive.growth.noise). Each operator's rule on real ProgressiveRackBuilder growth, copies of
stored trunks (half floats, quantized, LoRA-adapted) against the source's forward, zero_out's
preserved function (in a builder and in a real run), resumes, time as depth, and refusals."""

from __future__ import annotations

import json

import pytest
import torch
from test_checkpoints import crash_then_resume
from test_progressive import grown
from torch import nn

from stackwise.config import from_dict
from stackwise.data.pack import build_data
from stackwise.errors import StackWiseError
from stackwise.growth import stack_all_source
from stackwise.pipeline import progressive_recipe, resolve_vocab, train_from_config
from stackwise.progressive import ProgressiveRackBuilder
from stackwise.quant.layers import dequantized_weight
from stackwise.registry import GROWTH_OPERATORS
from stackwise.spec import AdapterSpec

OPERATORS = ["random", "copy_last", "copy_middle", "stack_all", "zero_out"]
COPIES = ["copy_last", "copy_middle", "stack_all"]
VOCAB = 50
ADAPTER = AdapterSpec(4, 8.0)


def builder(tiny, op, mode="append", noise=0.0, causal=True, **model):
    cfg = tiny(model={"n_stacks": 8, "blocks_per_stack": 1, **model})
    return ProgressiveRackBuilder(
        cfg.model,
        VOCAB,
        causal,
        building_mode=mode,
        growth_operator=op,
        growth_noise=noise,
    )


def train_like(stack):
    """Move every weight off its initialisation (norms and LoRA B included), as training
    would, so that copies are told apart from fresh draws."""
    with torch.no_grad():
        for p in stack.parameters():
            if p.is_floating_point():
                p.add_(torch.randn_like(p) * 0.05)


def weights(stack):
    return {k: v.detach().float().clone() for k, v in stack.state_dict().items()}


def same(a, b):
    return list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)


def run_stack(rack, stack, h):
    with torch.no_grad():
        return stack(h, rack.rotary(h.shape[1]), None)


# -- each operator's rule ---------------------------------------------------------------------


def test_capabilities_say_which_operators_copy_and_which_preserve_the_function():
    caps = {op: GROWTH_OPERATORS.capabilities(op) for op in OPERATORS}
    assert [op for op in OPERATORS if caps[op].preserves_function] == ["zero_out"]
    assert [op for op in OPERATORS if caps[op].copies_trunk] == COPIES


@pytest.mark.parametrize("mode", ["append", "prepend"])
def test_copy_last_copies_the_trained_neighbour(tiny, mode):
    """Appended: the top stack; prepended: the bottom one, also when that one is not the last
    grown (two stacks appended, then one prepended)."""
    b = builder(tiny, "copy_last")
    for _ in range(2):
        train_like(b.add_stack())
    top, bottom = weights(b.rack.stacks[-1]), weights(b.rack.stacks[0])
    new = b.add_stack(mode=mode)
    assert b.position(new) == (2 if mode == "append" else 0)
    mine = weights(new)
    assert same(mine, top if mode == "append" else bottom)
    assert not same(mine, bottom if mode == "append" else top)


@pytest.mark.parametrize("mode", ["append", "prepend"])
def test_copy_middle_copies_the_middle_of_the_trunk_in_rack_order(tiny, mode):
    b = builder(tiny, "copy_middle", mode)
    train_like(b.add_stack())
    for n_trunk in (1, 2, 3, 4):
        middle = weights(b.rack.stacks[n_trunk // 2])
        others = [weights(s) for i, s in enumerate(b.rack.stacks) if i != n_trunk // 2]
        new = b.add_stack()
        assert same(weights(new), middle), n_trunk
        assert not any(same(weights(new), o) for o in others)
        train_like(new)


def test_stack_all_source_rule():
    assert [stack_all_source(g) for g in range(1, 8)] == [0, 0, 1, 0, 1, 2, 3]
    assert stack_all_source(8) == 0 and stack_all_source(13) == 5


@pytest.mark.parametrize("mode", ["append", "prepend"])
def test_stack_all_repeats_the_whole_trunk(tiny, mode):
    """Stack g starts as stack g - 2^floor(log2 g) ended: the trunk doubles, in rack order too."""
    b = builder(tiny, "stack_all", mode)
    start = {}
    for g in range(8):
        new = b.add_stack()
        start[g] = weights(new)
        train_like(new)
    final = [weights(s) for s in b.grown]
    for g in range(1, 8):
        assert same(start[g], final[stack_all_source(g)]), g
    # after 4 stacks, before any trains: [0, 0', 0'', 0'''] is stack 0 four times
    b4 = builder(tiny, "stack_all", mode)
    for _ in range(4):
        b4.add_stack()
        if len(b4.grown) == 1:
            train_like(b4.grown[0])
    first = weights(b4.grown[0])
    assert all(same(weights(s), first) for s in b4.rack.stacks)


def test_copies_start_random_without_a_trunk_and_random_draws_as_before(tiny):
    """Stack 0 has nothing to copy: each copy operator draws exactly what random draws."""
    draws = {}
    for op in ["random", *COPIES]:
        torch.manual_seed(11)
        draws[op] = weights(builder(tiny, op).add_stack())
    assert all(same(draws[op], draws["random"]) for op in COPIES)


def test_copies_repeat_blocks_cyclically_when_the_counts_differ(tiny):
    b = builder(tiny, "copy_last", blocks_per_stack=2)
    src = b.add_stack()
    train_like(src)
    new = b.add_stack(n_blocks=5)
    for i, block in enumerate(new.blocks):
        assert same(weights(block), weights(src.blocks[i % 2])), i


# -- noise ------------------------------------------------------------------------------------


def _noisy_copy(tiny, noise, seed=3):
    torch.manual_seed(seed)
    b = builder(tiny, "copy_last", noise=noise)
    src = b.add_stack()
    train_like(src)
    return b, weights(src), weights(b.add_stack())


def test_noise_zero_copies_exactly_and_noise_scales_with_init_std(tiny):
    b, src, exact = _noisy_copy(tiny, 0.0)
    assert same(exact, src)
    b, src, noisy = _noisy_copy(tiny, 0.5)
    std = 0.5 * b.spec.init_std
    diffs = [noisy[k] - src[k] for k in src if src[k].ndim >= 2]
    spread = torch.cat([d.flatten() for d in diffs]).std().item()
    assert std / 1.5 < spread < std * 1.5, (spread, std)
    assert all(torch.equal(noisy[k], src[k]) for k in src if src[k].ndim < 2)  # norms untouched
    _, _, again = _noisy_copy(tiny, 0.5)
    assert same(again, noisy)  # the same seed draws the same noise
    _, _, other = _noisy_copy(tiny, 0.5, seed=4)
    assert not same(other, noisy)


def test_noise_from_the_config_reaches_a_run(tiny):
    """progressive.growth.noise: stack 1 is stack 0 (as trained) plus noise of that scale."""
    for noise in (0.0, 0.3):
        cfg = grown(
            tiny,
            2,
            {"steps_per_stack": 2, "growth": {"init": "copy_last", "noise": noise}},
            train={"overwrite_output_dir": True},
        )
        data = build_data(cfg.data)
        cfg = resolve_vocab(cfg, len(data.tokenizer))
        tr = progressive_recipe(cfg, data, quiet=True)
        tr.train_stage(0, 2)
        trained = weights(tr.builder.rack.stacks[0])
        new = weights(tr.growing.grow(tr.plan.stages[1]))
        diffs = torch.cat([(new[k] - trained[k]).flatten() for k in new if new[k].ndim >= 2])
        if noise == 0:
            assert same(new, trained)
        else:
            std = noise * cfg.model.init_std
            assert std / 1.5 < diffs.std().item() < std * 1.5


def test_negative_noise_is_refused(tiny):
    with pytest.raises(StackWiseError, match="must be 0"):
        builder(tiny, "copy_last", noise=-0.1)
    with pytest.raises(StackWiseError, match=r"growth\.noise"):
        grown(tiny, 2, {"growth": {"noise": -1.0}})


# -- copies of stored trunks ------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "nf4", "fp8", "nvfp4"])
def test_a_copy_takes_the_stored_stacks_effective_weights(tiny, fmt):
    b = builder(tiny, "copy_last")
    src = b.add_stack()
    train_like(src)
    b.store_as(src, fmt)
    new = b.add_stack()
    assert all(p.dtype == torch.float32 for p in new.parameters())
    for name, m in new.named_modules():
        if isinstance(m, nn.Linear):
            assert torch.equal(m.weight, dequantized_weight(src.get_submodule(name))), name
    if fmt in ("nf4", "fp8", "nvfp4"):  # these run in fp32 from the dequantized weights
        h = torch.randn(2, 8, b.spec.d_model)
        torch.testing.assert_close(run_stack(b.rack, new, h), run_stack(b.rack, src, h))


@pytest.mark.parametrize("storage", ["full", "qlora"])
def test_a_copy_of_a_lora_adapted_stack_computes_what_it_computes(tiny, storage):
    """Its own adapter and a trunk adapter (both trained) are merged into the copy's weights."""
    b = builder(tiny, "copy_last")
    src = b.add_stack(precision=storage, adapter=ADAPTER)
    b.ensure_trunk_adapter(src, AdapterSpec(2, 4.0))
    train_like(src)
    src.eval()
    new = b.add_stack()
    assert not any("lora_" in n for n, _ in new.named_parameters())
    h = torch.randn(2, 8, b.spec.d_model)
    torch.testing.assert_close(
        run_stack(b.rack, new, h), run_stack(b.rack, src, h), atol=1e-5, rtol=0
    )


# -- zero_out preserves the function ----------------------------------------------------------


def _trunk(b, trunk):
    """Two trained stacks, as trunk strategy `trunk` leaves them (qlora: nf4 + trunk adapters)."""
    for _ in range(2):
        train_like(b.add_stack())
    if trunk == "qlora":
        for s in b.grown:
            b.store_as(s, "nf4")
            b.ensure_trunk_adapter(s, AdapterSpec(2, 4.0))
            train_like(s)  # the adapters trained: their deltas are not zero
        b.freeze_all_but_qlora()
    elif trunk == "frozen":
        b.freeze_trunk()


@pytest.mark.parametrize("new_precision", ["full", "qlora"])
@pytest.mark.parametrize("trunk", ["frozen", "full", "qlora"])
@pytest.mark.parametrize("objective", ["clm", "diffusion"])
@pytest.mark.parametrize("mode", ["append", "prepend"])
def test_zero_out_growth_leaves_the_racks_logits_unchanged(
    tiny, mode, objective, trunk, new_precision
):
    diffusion = objective == "diffusion"
    extra = {"time_conditioning": "sinusoidal"} if diffusion else {}
    cfg_objective = {"objective": {"name": objective}}
    cfg = tiny(model={"n_stacks": 4, "blocks_per_stack": 1, **extra}, **cfg_objective)
    b = ProgressiveRackBuilder(
        cfg.model, VOCAB, not diffusion, building_mode=mode, growth_operator="zero_out"
    )
    _trunk(b, trunk)
    ids = torch.randint(0, VOCAB, (3, 12))
    t = torch.tensor([0.1, 0.5, 0.9]) if diffusion else None
    with torch.no_grad():
        before = b.rack.eval()(ids, None, t)
        new = b.add_stack(
            precision=new_precision, adapter=ADAPTER if new_precision != "full" else None
        )
        after = b.rack.eval()(ids, None, t)
    assert len(b.rack.stacks) == 3 and b.position(new) == (2 if mode == "append" else 0)
    torch.testing.assert_close(after, before, atol=1e-6, rtol=0)


def test_zero_out_zeroes_nf4_output_projections_without_nan(tiny, bnb_cpu_path):
    b = builder(tiny, "zero_out")
    train_like(b.add_stack())
    new = b.add_stack(precision="qlora", adapter=ADAPTER)
    for name, m in new.named_modules():
        if name.endswith(("o_proj.base_layer", "down_proj.base_layer")):
            w = dequantized_weight(m)
            assert torch.isfinite(w).all() and not w.any(), name
    with torch.no_grad():
        out = b.rack.eval()(torch.randint(0, VOCAB, (2, 8)))
    assert torch.isfinite(out).all()
    b.set_trainable(new, True)  # a packed stack trains through its adapter
    new.train()
    loss = b.rack(torch.randint(0, VOCAB, (2, 8))).float().logsumexp(-1).mean()
    loss.backward()  # the adapters on the zeroed projections get gradients
    grads = [p.grad for n, p in new.named_parameters() if "lora_B" in n and "o_proj" in n]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("objective", ["clm", "diffusion"])
def test_a_zero_out_run_shows_no_jump_in_val_loss_at_the_growth_step(tiny, tmp_path, objective):
    """Stage 1's first evaluation (before its first step) equals stage 0's last one."""
    cfg = grown(
        tiny,
        2,
        {"steps_per_stack": 4, "growth": {"init": "zero_out"}},
        objective={"name": objective},
        train={"eval_every": 2, "output_dir": str(tmp_path / objective)},
    )
    res = train_from_config(cfg, quiet=True)

    def val_losses(stage):
        rows = (res.output_dir / f"stack_{stage}" / "metrics.jsonl").read_text().splitlines()
        return [r["val/loss"] for r in map(json.loads, rows) if "val/loss" in r]

    first, second = val_losses(0), val_losses(1)
    assert len(first) >= 2 and len(second) >= 2
    assert abs(second[0] - first[-1]) < 1e-4, (first, second)
    assert second[-1] != second[0]  # and stage 1 then trains


# -- runs: resume, time as depth, MoE, the old key ----------------------------------------------


@pytest.mark.parametrize(("stage", "step"), [(1, 2), (0, None)], ids=["mid-stack", "between"])
def test_a_resumed_copy_run_ends_as_the_uninterrupted_one(tiny, tmp_path, stage, step):
    def cfg(name, **train):
        return grown(
            tiny,
            3,
            {"steps_per_stack": 4, "growth": {"init": "copy_last", "noise": 0.2}},
            train={"save_steps": 2, "output_dir": str(tmp_path / name), **train},
        )

    full = train_from_config(cfg("full"), quiet=True)
    resumed = crash_then_resume(cfg, stage, step)
    wa, wb = full.rack.state_dict(), resumed.rack.state_dict()
    assert [k for k in wa if not torch.equal(wa[k], wb[k])] == []
    assert full.progressive.final_eval == resumed.progressive.final_eval


QLORA = {"lora": {"enabled": True, "trunk_adapters": True}, "quant": {"enabled": True}}


@pytest.mark.parametrize(
    ("op", "prog", "sections"),
    [
        ("copy_last", {"building_mode": "prepend", "trunk_strategy": "qlora"}, QLORA),
        ("copy_middle", {"trunk_strategy": "qlora", "new_stack_precision": "qlora"}, QLORA),
        ("stack_all", {}, {"quant": {"enabled": True, "type": "fp8"}}),
    ],
    ids=["prepend-qlora-trunk", "qlora-trunk-and-stacks", "fp8-trunk"],
)
def test_copies_grow_runs_on_quantized_and_adapted_trunks(tiny, op, prog, sections):
    cfg = grown(tiny, 3, {"steps_per_stack": 2, "growth": {"init": op}, **prog}, **sections)
    res = train_from_config(cfg, quiet=True)
    assert [r.steps for r in res.progressive.stacks] == [2, 2, 2]
    assert torch.isfinite(torch.tensor(res.progressive.final_eval["nelbo"]))


@pytest.mark.parametrize("order", ["low_to_high", "high_to_low"])
@pytest.mark.parametrize("op", OPERATORS)
def test_time_as_depth_grows_and_trains_with_every_operator(tiny, op, order):
    cfg = grown(
        tiny,
        3,
        {
            "time_interpretation": "depth",
            "depth_order": order,
            "steps_per_stack": 2,
            "growth": {"init": op},
        },
    )
    res = train_from_config(cfg, quiet=True)
    assert [r.steps for r in res.progressive.stacks] == [2, 2, 2]
    assert len(res.rack.stacks) == 3 and res.progressive.final_eval["nelbo"] < float("inf")


MOE = {"num_experts": 2, "top_k": 1}


def test_moe_stacks_copy_and_zero_out(tiny):
    copied = builder(tiny, "copy_last", moe=MOE)
    src = copied.add_stack()
    train_like(src)
    assert same(weights(copied.add_stack()), weights(src))
    zeroed = builder(tiny, "zero_out", moe={**MOE, "shared_expert": True})
    train_like(zeroed.add_stack())
    ids = torch.randint(0, VOCAB, (2, 8))
    with torch.no_grad():
        before = zeroed.rack.eval()(ids)
        new = zeroed.add_stack()
        after = zeroed.rack.eval()(ids)
    torch.testing.assert_close(after, before, atol=1e-6, rtol=0)
    downs = [p for n, p in new.named_parameters() if n.endswith("down_proj.weight")]
    assert len(downs) == 3 and not any(p.any() for p in downs)  # two experts and the shared one


def test_copying_across_dense_and_moe_stacks_is_refused(tiny):
    b = builder(tiny, "copy_last", moe={**MOE, "stacks": [0]})
    b.add_stack()
    with pytest.raises(StackWiseError, match=r"MoE stack and the other dense") as err:
        b.add_stack()
    assert "\n" not in str(err.value)
    prog = {"strategy": "progressive", "growth": {"init": "stack_all"}}
    with pytest.raises(StackWiseError, match=r"model\.moe\.stacks gives experts to some"):
        tiny(model={"n_stacks": 2, "moe": {**MOE, "stacks": [0]}}, progressive=prog)
    every = {"n_stacks": 2, "moe": {**MOE, "stacks": [0, 1]}}
    assert tiny(model=every, progressive=prog).progressive.growth.init == "stack_all"
    zero = {"strategy": "progressive", "growth": {"init": "zero_out"}}
    assert tiny(model={"n_stacks": 2, "moe": {**MOE, "stacks": [0]}}, progressive=zero)


def test_stack_all_refuses_a_stack_whose_source_was_never_grown(tiny):
    with pytest.raises(StackWiseError, match="only 0 stack"):
        builder(tiny, "stack_all").create_stack(3)


def test_the_old_key_still_names_the_operator(tiny):
    cfg = from_dict(
        {
            "model": {"n_stacks": 2},
            "progressive": {"strategy": "progressive", "growth_operator": "zero_out"},
        }
    )
    assert cfg.progressive.growth.init == "zero_out"
    with pytest.raises(StackWiseError, match="copy_middle"):
        grown(tiny, 2, {"growth": {"init": "copy_midle"}})


def test_train_all_layers_refuses_growth_that_would_change_the_layers_given(tiny):
    """The seeds' UnifiedTrainer trains the layers it is given, as given: no operator, no noise."""
    from torch.utils.data import DataLoader

    from stackwise.fronts.unified import UnifiedTrainer

    rows = DataLoader([{"input_ids": torch.arange(16) % 5} for _ in range(8)], batch_size=4)
    for growth, named in (({"init": "copy_last"}, "init"), ({"noise": 0.1}, "noise")):
        cfg = tiny(
            model={"n_stacks": 2, "blocks_per_stack": 1},
            progressive={"strategy": "progressive", "growth": growth},
        )
        with pytest.raises(StackWiseError, match=rf"growth\.{named} .*as given"):
            UnifiedTrainer(cfg, quiet=True).train_all_layers(rows)
