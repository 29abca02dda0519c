"""Seed derivations are pinned: a change would make resumed runs draw what the uninterrupted
run did not. Distinct inputs give distinct seeds, all valid for torch generators."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from stackwise import seeds


def test_pinned_values():
    assert seeds.step_draws(42, 3, 0, 1) == 5_106_892_853_732_897_934
    assert seeds.epoch_order(7, 2) == 700_023
    assert seeds.loader_workers(7, 2) == 9
    assert seeds.eval_batch(0, 1, 0) == (99_991 * 1_000_003 + 131) % (2**63 - 1)
    assert seeds.eval_block(1, 2, 3) == (1_000_005) * 7919 + 3
    assert seeds.eval_offset(1, 2) == seeds.eval_block(1, 2, 104_729)
    assert seeds.stage(2**31 - 1, 1) == 0 and seeds.joint_tuning(5) == 10_005


@given(st.integers(0, 2**31 - 1), st.integers(0, 10_000), st.integers(0, 7))
def test_seeds_are_valid_and_tell_inputs_apart(seed, step, rank):
    a, b = seeds.step_draws(seed, step, 0, rank), seeds.step_draws(seed, step + 1, 0, rank)
    assert a != b and 0 <= a < 2**63 and 0 <= b < 2**63
    torch.Generator().manual_seed(seeds.eval_batch(seed, step, rank))  # accepted by torch
    assert seeds.eval_batch(seed, step, rank) != seeds.eval_batch(seed, step, rank + 1)
