"""Masked samplers: ancestral with logit reuse, remasking rules, blocks, filtering, EOS, and the
config rules that keep sampling settings from doing nothing."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from stackwise.errors import StackWiseError
from stackwise.samplers import MaskedSampler, MaskedSampling, draw, split_steps, truncate_at_eos

MASK, EOS, V = 0, 1, 8


class Fixed(nn.Module):
    """A 'rack' whose logits are fixed per position: the sampler's choices are predictable."""

    uses_time = False

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.table = logits  # (L, V)
        self.cfg = SimpleNamespace(max_seq_len=logits.shape[0])
        self.calls = 0
        self.seen: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor, attention_mask=None, t=None) -> torch.Tensor:
        self.calls += 1
        self.seen.append(x.clone())
        return self.table[None].expand(x.shape[0], -1, -1).clone()


def reveal_order(rack: Fixed, prompt_len: int) -> list[int]:
    """Positions in the order they stopped being masked, from the inputs the rack saw."""
    order: list[int] = []
    for before, after in zip(rack.seen, [*rack.seen[1:], None], strict=True):
        if after is None:
            break
        newly = ((before[0] == MASK) & (after[0] != MASK)).nonzero().flatten().tolist()
        order += newly
    return [p - prompt_len for p in order]


def run(rack: Fixed, length: int, gen_seed: int = 0, **kw) -> torch.Tensor:
    settings = MaskedSampling(**kw)
    gen = torch.Generator().manual_seed(gen_seed)
    sampler = MaskedSampler(rack, settings, MASK, [MASK], gen, eos_id=EOS)
    prompt = torch.full((1, 1), 5)
    out = sampler.run(prompt, length)
    rack.sampler = sampler  # type: ignore[attr-defined]
    return out


def peaked(confidences: list[float], token: int = 3) -> torch.Tensor:
    """Position i (after a 1-token prompt) puts probability conf_i on `token`."""
    rows = [torch.full((V,), -30.0)]
    for c in confidences:
        row = torch.full((V,), math.log((1 - c) / (V - 2)))
        row[token] = math.log(c)
        row[MASK] = -math.inf
        rows.append(row)
    return torch.stack(rows)


CONF = [0.3, 0.9, 0.5, 0.99, 0.7, 0.2]


def test_low_confidence_reveals_the_most_confident_first():
    rack = Fixed(peaked(CONF))
    run(rack, 6, sampler="remask", remasking="low_confidence", steps=6, temperature=0)
    assert reveal_order(rack, 1) == [3, 1, 4, 2, 0]  # the last one is revealed without a pass


def test_margin_and_entropy_follow_their_rules():
    # position 0: two strong candidates (small margin, low entropy); position 1: flat-ish but
    # one clear winner (larger margin, higher entropy)
    table = torch.full((3, V), -30.0)
    table[1, 3], table[1, 4] = 0.0, -0.05
    table[2] = torch.linspace(0, -1.5, V)
    table[:, MASK] = -math.inf
    probs = table[1:].softmax(-1)
    top2 = probs.topk(2).values
    margin_first = int((top2[:, 0] - top2[:, 1]).argmax())
    entropy_first = int((-(probs * probs.clamp_min(1e-30).log()).sum(-1)).argmin())
    assert margin_first != entropy_first  # the two rules disagree on this table
    for rule, first in (("margin", margin_first), ("entropy", entropy_first)):
        rack = Fixed(table)
        run(rack, 2, sampler="remask", remasking=rule, steps=2, temperature=0)
        assert reveal_order(rack, 1)[0] == first, rule


def test_random_remasking_ignores_confidence():
    orders = set()
    for seed in range(6):
        rack = Fixed(peaked(CONF))
        run(rack, 6, gen_seed=seed, sampler="remask", remasking="random", steps=6, temperature=0)
        orders.add(tuple(reveal_order(rack, 1)))
    assert len(orders) > 1  # the seed decides, not the confidences


def test_ancestral_reuses_logits_when_a_step_reveals_nothing():
    table = peaked([0.6] * 8)
    cached = Fixed(table)
    a = run(cached, 8, gen_seed=3, sampler="ancestral", steps=256)
    plain = Fixed(table)
    settings = MaskedSampling(sampler="ancestral", steps=256)
    gen = torch.Generator().manual_seed(3)
    sampler = MaskedSampler(plain, settings, MASK, [MASK], gen, eos_id=EOS, reuse_logits=False)
    b = sampler.run(torch.full((1, 1), 5), 8)
    assert torch.equal(a, b)  # reuse changes nothing in the result
    assert plain.calls == sampler.stats.steps  # without reuse: one pass per step
    assert cached.calls <= 8 < plain.calls  # with it: one pass per step that revealed something
    assert (a[0, 1:] != MASK).all()


def test_ancestral_reveal_probability_follows_the_schedule():
    """From t to s the linear schedule reveals each masked token with prob (t - s) / t."""
    table = peaked([0.6] * 64)
    rack = Fixed(table)
    run(rack, 64, gen_seed=1, sampler="ancestral", steps=4)
    masked_counts = [int((x[0, 1:] == MASK).sum()) for x in rack.seen]
    # after step 1 of 4 (t: 1 -> 0.75) about a quarter is revealed
    assert 36 <= masked_counts[1] <= 60


def test_blocks_are_filled_left_to_right():
    rack = Fixed(peaked(CONF * 2))
    run(rack, 12, sampler="remask", steps=12, block_length=4, temperature=0)
    order = reveal_order(rack, 1)
    blocks = [p // 4 for p in order]
    assert blocks == sorted(blocks)  # never a later block before an earlier one is full
    assert split_steps(12, 3) == [4, 4, 4] and split_steps(5, 3) == [2, 2, 1]


def test_top_k_one_is_greedy_and_draws_are_float64(monkeypatch):
    logits = torch.tensor([[2.0, 1.9, -1.0, 0.5]])
    gen = torch.Generator().manual_seed(0)
    assert all(int(draw(logits, 1.0, 1, 1.0, gen)) == 0 for _ in range(20))
    seen = {}
    real = torch.multinomial

    def spy(probs, *a, **k):
        seen["dtype"] = probs.dtype
        return real(probs, *a, **k)

    monkeypatch.setattr(torch, "multinomial", spy)
    draw(logits, 0.05, 0, 1.0, gen)
    assert seen["dtype"] == torch.float64
    # top_p keeps the smallest set reaching p: here only the two leading tokens
    picks = {int(draw(logits, 1.0, 0, 0.6, gen)) for _ in range(50)}
    assert picks <= {0, 1}


def test_eos_in_every_row_stops_later_blocks_and_truncates():
    table = peaked([0.99] * 8, token=EOS)
    rack = Fixed(table)
    out = run(rack, 8, sampler="remask", steps=8, block_length=4, temperature=0)
    assert rack.calls <= 4  # the second block was never generated
    cut = truncate_at_eos(out, 1, EOS, MASK)
    assert int((cut[0, 1:] == EOS).sum()) == 1


@pytest.mark.parametrize(
    ("objective", "sample", "match"),
    [
        ("clm", {"steps": 8}, "only applies to masked"),
        ("clm", {"sampler": "remask"}, "only applies to masked"),
        ("clm", {"block_length": 4}, "only applies to masked"),
        ("diffusion", {"remasking": "margin"}, "only applies to sampler: remask"),
    ],
)
def test_sampling_settings_a_rack_would_ignore_are_refused(tiny, objective, sample, match):
    with pytest.raises(StackWiseError, match=match):
        tiny(objective={"name": objective}, sample=sample)


def test_every_sampler_runs_on_a_trained_rack(tiny):
    from stackwise.generate import generate
    from stackwise.pipeline import train_from_config

    cfg = tiny(objective={"name": "diffusion"}, train={"max_steps": 2})
    res = train_from_config(cfg, quiet=True)
    outs = {}
    for kw in (
        {"sampler": "ancestral"},
        {"sampler": "remask", "remasking": "low_confidence"},
        {"sampler": "remask", "remasking": "entropy", "block_length": 4},
        {"sampler": "ancestral", "top_k": 1},
    ):
        got = generate(res.config, res.rack, res.data.tokenizer, n=2, **kw)
        assert len(got.texts) == 2 and got.stats.forward_passes > 0
        outs[str(kw)] = got.ids
    from stackwise.cli.commands import check_sampling  # the door generate's flags pass

    with pytest.raises(StackWiseError, match="only applies to sampler: remask"):
        check_sampling(cfg, {"remasking": "margin"})


def test_only_rows_that_changed_run_again():
    table = peaked([0.6] * 16)
    outs, stats = [], []
    for reuse in (True, False):
        rack = Fixed(table)
        settings = MaskedSampling(sampler="ancestral", steps=64)
        gen = torch.Generator().manual_seed(7)
        s = MaskedSampler(rack, settings, MASK, [MASK], gen, eos_id=EOS, reuse_logits=reuse)
        outs.append(s.run(torch.full((4, 1), 5), 16))
        stats.append(s.stats)
    assert torch.equal(outs[0], outs[1])  # exact: the same samples either way
    assert stats[1].row_passes == 4 * stats[1].steps
    assert stats[0].row_passes < stats[1].row_passes / 2  # most rows reveal nothing per step
