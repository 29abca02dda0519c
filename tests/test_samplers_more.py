"""The confidence-threshold and ReMDM samplers on a fixed-logit rack (their rules pinned as
tests/test_samplers.py pins the others'), and the settings only they read."""

from __future__ import annotations

import itertools

import pytest
import torch
from test_samplers import MASK, Fixed, peaked, run

from stackwise.config.loading import InvalidConfig, from_dict

CONF = [0.3, 0.9, 0.5, 0.99, 0.7, 0.2]


def revealed_per_pass(rack: Fixed, prompt_len: int) -> list[set[int]]:
    """The positions each pass revealed, from the inputs the rack saw (and the output)."""
    seen = [x[0] for x in rack.seen] + [rack.sampler.final[0]]  # type: ignore[attr-defined]
    return [
        {int(p) - prompt_len for p in ((a == MASK) & (b != MASK)).nonzero().flatten()}
        for a, b in itertools.pairwise(seen)
    ]


def sampled(rack: Fixed, length: int, **kw) -> torch.Tensor:
    out = run(rack, length, **kw)
    rack.sampler.final = out  # type: ignore[attr-defined]
    return out


def test_confidence_reveals_everything_sure_enough_and_at_least_one():
    rack = Fixed(peaked(CONF))
    out = sampled(rack, 6, sampler="confidence", confidence_threshold=0.8, steps=6, temperature=0)
    # pass 1: the two >= 0.8; then nothing is that sure: the likeliest one each pass
    assert revealed_per_pass(rack, 1) == [{1, 3}, {4}, {2}, {0}, {5}]
    assert (out[0, 1:] == 3).all()


def test_a_low_threshold_takes_fewer_passes_than_steps():
    rack = Fixed(peaked(CONF))
    sampled(rack, 6, sampler="confidence", confidence_threshold=0.25, steps=6, temperature=0)
    assert revealed_per_pass(rack, 1) == [{0, 1, 2, 3, 4}, {5}]
    assert rack.calls == 2  # 2 passes for a 6-step budget


def test_the_last_step_reveals_whatever_is_left():
    rack = Fixed(peaked(CONF))
    sampled(rack, 6, sampler="confidence", confidence_threshold=0.95, steps=2, temperature=0)
    assert revealed_per_pass(rack, 1) == [{3}, {0, 1, 2, 4, 5}]


def test_remdm_with_no_budget_is_the_ancestral_sampler_draw_for_draw():
    table = peaked([0.6] * 16)
    for seed in range(3):
        a = run(Fixed(table), 16, gen_seed=seed, sampler="ancestral", steps=8)
        b = run(Fixed(table), 16, gen_seed=seed, sampler="remdm", remask_budget=0.0, steps=8)
        assert torch.equal(a, b)


def test_remdm_masks_earlier_reveals_again_but_never_the_prompt():
    torch.manual_seed(0)
    table = torch.randn(65, 8)
    table[:, MASK] = -float("inf")
    rack = Fixed(table)
    out = run(rack, 64, gen_seed=2, sampler="remdm", remask_budget=0.5, steps=16, temperature=1)
    seen = torch.stack([x[0] for x in rack.seen])
    hidden_again = ((seen[:-1] != MASK) & (seen[1:] == MASK)).sum().item()
    assert hidden_again > 0
    assert (seen[:, 0] == 5).all()  # the prompt token is never masked
    assert (out[0] != MASK).all()


def test_remdm_never_masks_an_earlier_block_again():
    torch.manual_seed(1)
    table = torch.randn(33, 8)
    table[:, MASK] = -float("inf")
    rack = Fixed(table)
    run(rack, 32, gen_seed=4, sampler="remdm", remask_budget=0.5, steps=32, block_length=8)
    seen = torch.stack([x[0] for x in rack.seen])
    for before, after in itertools.pairwise(seen):
        hidden = ((before != MASK) & (after == MASK)).nonzero().flatten().tolist()
        current = (before == MASK).nonzero().flatten()
        block = (int(current.min()) - 1) // 8 if len(current) else 0
        assert all((p - 1) // 8 == block for p in hidden), (hidden, block)


def test_remdm_reveal_rule_keeps_the_schedule_marginals():
    """Over many rows, the masked share after each step follows the schedule (linear: j/steps
    revealed after step j) as the ancestral sampler's does, remasking included (without the
    raised reveal probability it would lag by up to 0.075 here)."""
    table = peaked([0.6] * 32)
    rack = Fixed(table)
    prompt = torch.full((64, 1), 5)
    from stackwise.samplers import MaskedSampler, MaskedSampling

    settings = MaskedSampling(sampler="remdm", remask_budget=0.3, steps=8, temperature=1.0)
    sampler = MaskedSampler(rack, settings, MASK, [MASK], torch.Generator().manual_seed(0))
    sampler.run(prompt, 32)
    for j, x in enumerate(rack.seen[1:], start=1):  # the input of pass j + 1: after step j
        share = float((x[:, 1:] == MASK).float().mean())
        assert abs(share - (1 - j / 8)) < 0.03, (j, share)


@pytest.mark.parametrize(
    ("sample", "said"),
    [
        ({"confidence_threshold": 0.5}, "only applies to sampler: confidence"),
        ({"remask_budget": 0.1, "sampler": "confidence"}, "only applies to sampler: remdm"),
    ],
)
def test_a_setting_the_chosen_sampler_does_not_read_is_refused(sample, said):
    with pytest.raises(InvalidConfig, match=said):
        from_dict({"objective": {"name": "diffusion"}, "sample": sample})


def test_the_samplers_settings_on_a_causal_rack_are_refused():
    with pytest.raises(InvalidConfig, match="only applies to masked"):
        from_dict({"sample": {"remask_budget": 0.1}})


def test_each_setting_reaches_its_sampler():
    config = from_dict(
        {
            "objective": {"name": "diffusion"},
            "sample": {"sampler": "confidence", "confidence_threshold": 0.7},
        }
    )
    from stackwise.generate.masked import masked_settings
    from stackwise.plan import sample_spec

    s = masked_settings(sample_spec(config))
    assert (s.sampler, s.confidence_threshold) == ("confidence", 0.7)


def test_confidence_reveals_per_row_and_leaves_finished_rows_alone():
    """Two rows of different confidences: the sure row finishes in one pass, the other goes on
    one position a pass, and the finished row is never changed again."""
    table = torch.stack([peaked([0.95] * 4), peaked([0.3] * 4)])

    class TwoRows(Fixed):
        def forward(self, x, attention_mask=None, t=None):
            self.calls += 1
            self.seen.append(x.clone())
            return table[: x.shape[0]].clone()

    rack = TwoRows(table[0])
    from stackwise.samplers import MaskedSampler, MaskedSampling

    settings = MaskedSampling(
        sampler="confidence", confidence_threshold=0.9, steps=4, temperature=0
    )
    sampler = MaskedSampler(rack, settings, MASK, [MASK], torch.Generator().manual_seed(0))
    out = sampler.run(torch.full((2, 1), 5), 4)
    masked = [(x[:, 1:] == MASK).sum(1).tolist() for x in rack.seen]
    assert masked[0] == [4, 4] and masked[1] == [0, 3]  # row 0 all at once, row 1 one
    assert (out[:, 1:] == 3).all()
