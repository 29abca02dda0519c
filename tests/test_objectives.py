"""Objectives: real corruption, exact losses, schedules, and no leak on i.i.d. tokens."""

from __future__ import annotations

import math

import pytest
import torch

from stackwise.config import from_dict
from stackwise.model import Rack
from stackwise.objectives import (
    CLM,
    IGNORE,
    MLM,
    Custom,
    Diffusion,
    Prepared,
    Specials,
    build_objective,
)
from stackwise.objectives.base import random_lengths
from stackwise.objectives.schedules import Cosine, Linear, LogLinear, Table, time_for_fraction
from stackwise.pipeline import trainer_for

SP = Specials(vocab_size=36, pad_id=0, mask_id=3, bos_id=1, eos_id=2)
N_REAL = 32  # ids 4..35 carry data


def uniform_tokens(n: int, length: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(4, SP.vocab_size, (n, length), generator=g)


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_diffusion_replaces_masked_tokens_with_the_mask_id():
    ids = uniform_tokens(8, 64)
    ids[:, -5:] = SP.pad_id
    obj = Diffusion(SP, Linear())
    prep = obj.prepare({"input_ids": ids}, gen())
    masked = prep.targets != IGNORE
    assert masked.any()
    assert (prep.inputs[masked] == SP.mask_id).all()
    assert torch.equal(prep.inputs[~masked], ids[~masked])
    assert torch.equal(prep.targets[masked], ids[masked])
    assert not masked[:, -5:].any()  # padding is never a target
    assert float(prep.normalizer) == 8 * 59


def test_diffusion_mask_rate_follows_the_schedule():
    ids = uniform_tokens(4, 4000)
    obj = Diffusion(SP, Cosine())
    t = torch.tensor([0.1, 0.4, 0.7, 1.0])
    prep = obj.corrupt({"input_ids": ids}, t, gen())
    rate = (prep.targets != IGNORE).float().mean(1)
    assert torch.allclose(rate, Cosine().mask_fraction(t), atol=0.03)


def test_mlm_masks_at_the_ratio_and_range():
    ids = uniform_tokens(64, 500)
    prep = MLM(SP, 0.25, bert_mix=False).prepare({"input_ids": ids}, gen())
    chosen = prep.targets != IGNORE
    assert abs(float(chosen.float().mean()) - 0.25) < 0.01
    assert (prep.inputs[chosen] == SP.mask_id).all()
    prep = MLM(SP, (0.1, 0.5), bert_mix=False).prepare({"input_ids": ids}, gen())
    rates = (prep.targets != IGNORE).float().mean(1)
    assert rates.min() > 0.05 and rates.max() < 0.55 and rates.std() > 0.05


def test_mlm_bert_mix_is_80_10_10():
    ids = uniform_tokens(64, 1000)
    prep = MLM(SP, 0.5, bert_mix=True).prepare({"input_ids": ids}, gen())
    chosen = prep.targets != IGNORE
    x, orig = prep.inputs[chosen], ids[chosen]
    masked = (x == SP.mask_id).float().mean()
    kept = (x == orig).float().mean()
    assert abs(float(masked) - 0.8) < 0.01
    # 10% kept on purpose, plus random picks that happen to hit the original token
    assert abs(float(kept) - (0.1 + 0.1 / SP.vocab_size)) < 0.01


def test_diffusion_loss_matches_a_direct_computation():
    torch.manual_seed(0)
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, SP.pad_id]])
    obj = Diffusion(SP, Linear())
    t = torch.tensor([0.5, 0.8])
    prep = obj.corrupt({"input_ids": ids}, t, gen(3))
    logits = torch.randn(2, 4, SP.vocab_size)
    total = 0.0
    for i in range(2):
        for j in range(4):
            if prep.targets[i, j] == IGNORE:
                continue
            logp = logits[i, j] - torch.logsumexp(logits[i, j], 0)
            total += (1.0 / float(t[i])) * -float(logp[ids[i, j]])
    expected = total / 7  # seven real (non-pad) tokens
    assert (prep.targets != IGNORE).sum() > 0
    assert float(obj.loss(logits, prep)) == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize(
    "schedule",
    [Linear(), LogLinear(1e-3), Cosine(), Table(10, {0: 0.15, 5: 0.5, 9: 0.9})],
    ids=["linear", "loglinear", "cosine", "table"],
)
def test_schedule_weight_is_minus_alpha_prime_over_one_minus_alpha(schedule):
    t = torch.tensor([0.13, 0.37, 0.52, 0.71, 0.93], dtype=torch.float64)
    h = 1e-6
    deriv = (schedule.mask_fraction(t + h) - schedule.mask_fraction(t - h)) / (2 * h)
    expected = deriv / schedule.mask_fraction(t)  # -alpha' = d(mask)/dt
    assert torch.allclose(schedule.weight(t), expected, rtol=1e-4)


def test_table_schedule_hits_its_listed_fractions_and_interpolates():
    table = Table(10, {0: 0.15, 5: 0.5, 9: 0.9})
    t = torch.tensor([0.1, 0.6, 1.0, 0.35])  # steps 0, 5, 9 and between 2 and 3
    frac = table.mask_fraction(t)
    assert torch.allclose(frac[:3], torch.tensor([0.15, 0.5, 0.9]))
    assert float(frac[3]) == pytest.approx(0.15 + (0.35 - 0.1) / 0.5 * 0.35, rel=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_table_weight_on_a_knot_is_the_left_segments(dtype):
    """A grid draw exactly on step k closes the interval to its left: w = slope_left / frac.
    In float32, 0.1 is 0.1000000015, which once took the right segment's slope (4.667, not 10)."""
    table = Table(10, {0: 0.15, 5: 0.5, 9: 0.9})
    t = torch.tensor([0.1, 0.6, 1.0], dtype=dtype)
    expected = torch.tensor([0.15 / 0.1, 0.35 / 0.5, 0.4 / 0.4]) / torch.tensor([0.15, 0.5, 0.9])
    assert torch.allclose(table.weight(t).double(), expected.double(), rtol=1e-2)
    assert float(table.weight(t)[0]) == pytest.approx(10.0, rel=1e-2)
    assert float(table.weight(t)[1]) == pytest.approx(1.4, rel=1e-2)


def test_antithetic_draws_are_evenly_spread_and_grid_draws_land_on_steps():
    obj = Diffusion(SP, Linear(), eps=1e-3, antithetic=True)
    t = torch.sort(obj.sample_t(8, gen(), torch.device("cpu"))).values
    gaps = t[1:] - t[:-1]
    assert torch.allclose(gaps, torch.full_like(gaps, (1 - 1e-3) / 8), atol=1e-5)
    grid = Diffusion(SP, Linear(), num_time_steps=5, antithetic=False)
    t = grid.sample_t(1000, gen(), torch.device("cpu"))
    assert set(torch.round(t * 5).long().tolist()) == {1, 2, 3, 4, 5}


def test_uniform_weighting_drops_the_elbo_weight_but_eval_keeps_the_nelbo():
    ids = uniform_tokens(4, 16)
    t = torch.tensor([0.2, 0.4, 0.6, 0.8])
    elbo = Diffusion(SP, Linear()).corrupt({"input_ids": ids}, t, gen())
    flat = Diffusion(SP, Linear(), uniform_weight=True).corrupt({"input_ids": ids}, t, gen())
    assert torch.equal(flat.weights, (flat.targets != IGNORE).float())
    assert torch.allclose(elbo.weights, flat.weights / t[:, None])
    assert torch.equal(flat.elbo_weights, elbo.weights)


def test_custom_uses_batch_labels_and_refuses_batches_without_them():
    from stackwise.errors import StackWiseError

    ids = uniform_tokens(2, 6)
    labels = torch.full_like(ids, IGNORE)
    labels[:, 2] = 7
    prep = Custom(SP, causal=True).prepare({"input_ids": ids, "labels": labels}, gen())
    assert torch.equal(prep.targets, labels) and float(prep.normalizer) == 2
    logits = torch.zeros(2, 6, SP.vocab_size)
    assert float(Custom(SP, True).loss(logits, prep)) == pytest.approx(math.log(SP.vocab_size))
    with pytest.raises(StackWiseError, match="labels"):
        Custom(SP, True).prepare({"input_ids": ids}, gen())


def test_clm_loss_matches_transformers_llama_with_the_same_weights():
    from transformers import LlamaForCausalLM

    from stackwise.config import ModelConfig
    from stackwise.model.hf import llama_config, llama_state_dict

    cfg = ModelConfig(
        d_model=32,
        n_heads=4,
        n_kv_heads=2,
        n_stacks=2,
        blocks_per_stack=1,
        max_seq_len=16,
        tie_embeddings=False,
    )
    torch.manual_seed(0)
    rack = Rack(cfg, SP.vocab_size, causal=True).eval()
    llama = LlamaForCausalLM(llama_config(rack)).eval()
    llama.load_state_dict(llama_state_dict(rack))
    ids = uniform_tokens(3, 16)
    prep = CLM(SP).prepare({"input_ids": ids}, gen())
    with torch.no_grad():
        ours = CLM(SP).loss(rack(ids), prep)
        theirs = llama(input_ids=ids, labels=ids).loss
    assert float(ours) == pytest.approx(float(theirs), abs=1e-5)


class LeakyDiffusion(Diffusion):
    """A broken objective for the control: it forgets to replace masked tokens."""

    def corrupt(self, batch, t, g) -> Prepared:
        prep = super().corrupt(batch, t, g)
        prep.inputs = batch["input_ids"]
        return prep


def _train_on_noise(objective, tmp_path, steps: int = 120) -> dict[str, float]:
    cfg = from_dict(
        {
            "model": {
                "d_model": 32,
                "n_heads": 2,
                "n_stacks": 1,
                "blocks_per_stack": 2,
                "max_seq_len": 32,
            },
            "data": {"seq_len": 32},
            "objective": {"name": "diffusion"},
            "train": {
                "max_steps": steps,
                "batch_size": 16,
                "lr": 3e-3,
                "eval_every": 1000,
                "eval_batches": 40,
                "mixed_precision": "no",
                "output_dir": str(tmp_path / "run"),
            },
            "logging": {
                "console": False,
                "tensorboard": False,
                "jsonl": False,
                "progress_bar": "never",
            },
        }
    )
    torch.manual_seed(0)
    rack = Rack(cfg.model, SP.vocab_size, causal=False)
    from stackwise.data.pack import TokenBlocks

    trainer = trainer_for(
        cfg,
        rack,
        objective,
        TokenBlocks(uniform_tokens(512, 32, 1)),
        TokenBlocks(uniform_tokens(640, 32, 2)),
    )
    state = trainer.train()
    return state.history[-1]


@pytest.mark.parametrize("kind", ["mlm", "diffusion"])
def test_no_leak_loss_stays_above_ln_v_on_iid_tokens(kind, tmp_path):
    obj = MLM(SP, (0.1, 0.9), False) if kind == "mlm" else Diffusion(SP, Linear())
    final = _train_on_noise(obj, tmp_path)
    ln_v = math.log(N_REAL)
    key = "nelbo" if kind == "diffusion" else "loss"
    assert final[key] > 0.97 * ln_v  # cannot beat chance on i.i.d. tokens
    assert final[key] < 1.3 * ln_v  # and it did learn the marginal


def test_no_leak_control_a_leaking_objective_is_caught(tmp_path):
    final = _train_on_noise(LeakyDiffusion(SP, Linear()), tmp_path)
    assert final["nelbo"] < 0.5 * math.log(N_REAL)


def test_build_objective_reads_the_config():
    cfg = from_dict(
        {
            "objective": {"name": "diffusion", "weighting": "uniform", "attention": "causal"},
            "masking": {"schedule": "cosine", "antithetic": False},
        }
    )
    obj = build_objective(cfg, SP)
    assert isinstance(obj, Diffusion) and isinstance(obj.schedule, Cosine)
    assert obj.uniform_weight and not obj.antithetic and obj.causal


def test_time_for_fraction_inverts_each_schedule():
    frac = torch.tensor([0.1, 0.5, 0.9])
    for sched in (Linear(), Cosine(), LogLinear(1e-3)):
        t = time_for_fraction(sched, frac)
        assert torch.allclose(sched.mask_fraction(t), frac, atol=1e-4)


def _objectives() -> list:
    return [
        CLM(SP),
        MLM(SP, 0.3, False),
        Diffusion(SP, Linear()),
    ]


@pytest.mark.parametrize("obj", _objectives(), ids=["clm", "mlm", "diffusion"])
def test_padding_never_enters_the_loss_or_the_normalizer(obj):
    ids = uniform_tokens(4, 24)
    cut = random_lengths({"input_ids": ids}, 1.0, SP.pad_id, gen(5))
    real = cut["attention_mask"].bool()
    assert not real.all() and real[:, 0].all()
    assert (cut["input_ids"][~real] == SP.pad_id).all()
    prep = obj.prepare(cut, gen(1))
    assert not (prep.targets[~real] != IGNORE).any()  # nothing scored on padding
    if obj.name == "diffusion":
        assert float(prep.normalizer) == float(real.sum())  # per real token, pads not counted
    else:
        assert float(prep.normalizer) == float((prep.targets != IGNORE).sum())
    # what the padding holds cannot change the loss: the model never sees it either
    torch.manual_seed(0)
    rack = Rack(
        from_dict({"model": {"d_model": 16, "n_heads": 2, "n_stacks": 1}}).model,
        SP.vocab_size,
        causal=obj.causal,
    )
    other = dict(cut)
    other["input_ids"] = torch.where(real, cut["input_ids"], uniform_tokens(4, 24, seed=9))
    losses = []
    for batch in (cut, other):
        p = obj.prepare(batch, gen(1))
        p.inputs = torch.where(real, p.inputs, batch["input_ids"])
        with torch.no_grad():
            losses.append(float(obj.loss(rack(p.inputs, p.attention_mask), p)))
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)


def test_random_length_ratio_cuts_that_share_of_rows():
    ids = uniform_tokens(2000, 16)
    none = random_lengths({"input_ids": ids}, 0.0, SP.pad_id, gen(0))
    assert torch.equal(none["input_ids"], ids)
    some = random_lengths({"input_ids": ids}, 0.3, SP.pad_id, gen(0))
    shortened = (~some["attention_mask"].bool()).any(1).float().mean()
    assert 0.25 < float(shortened) < 0.32  # 30%, less the rows whose draw was the full length


def test_random_length_ratio_trains_and_is_refused_with_the_cache(tiny):
    from stackwise.errors import StackWiseError
    from stackwise.pipeline import train_from_config

    cfg = tiny(objective={"name": "diffusion", "random_length_ratio": 0.5})
    res = train_from_config(cfg, quiet=True)
    assert res.state.step == cfg.train.max_steps
    with pytest.raises(StackWiseError, match="random_length_ratio cuts"):
        tiny(
            objective={"name": "diffusion", "random_length_ratio": 0.5},
            model={"n_stacks": 2, "blocks_per_stack": 1},
            progressive={"strategy": "progressive", "cache": {"enabled": True}},
        )
