"""Every seed StackWise derives from train.seed, named in one place.

The values are pinned: changing a derivation changes which order, masks and draws a run makes,
so a run resumed with other code would no longer match the uninterrupted one.
"""

from __future__ import annotations

MOD = 2**63 - 1  # torch generators take seeds below 2**63
PRIME = 1_000_003


def step_draws(seed: int, *parts: int) -> int:
    """A training micro-step's corruption draws: (step, micro-batch, rank)."""
    for p in parts:
        seed = (seed * PRIME + p) % MOD
    return seed


def epoch_order(seed: int, epoch: int) -> int:
    """The permutation of the training set in `epoch`."""
    return seed * 100_003 + epoch


def loader_workers(seed: int, epoch: int) -> int:
    """The DataLoader's own generator (worker seeds), kept off the global RNG."""
    return seed + epoch


def eval_batch(seed: int, batch: int, rank: int) -> int:
    """The masks of validation batch `batch` during training: the same at every evaluation."""
    return ((seed * PRIME + 99_991) * PRIME + batch * 131 + rank) % MOD


def eval_block(seed: int, block: int, point: int) -> int:
    """`stackwise eval`'s masks of validation block `block` at noise point `point`."""
    return (seed * PRIME + block) * 7919 + point


def eval_offset(seed: int, block: int) -> int:
    """`stackwise eval`'s stratification offset of block `block` (conditional likelihood)."""
    return eval_block(seed, block, 104_729)


def stage(seed: int, index: int) -> int:
    """Progressive stage `index`'s train.seed."""
    return (seed + index) % 2**31


def joint_tuning(seed: int) -> int:
    """The fused mode's joint tuning stage."""
    return (seed + 10_000) % 2**31


def mask_key(seed: int, sample: int) -> int:
    """The key of a cached stage sample's masks and time step: its cache key (`sample`) with the
    seed folded in above bit 40, so other seeds draw other masks; stays inside int64."""
    return sample + (seed % (1 << 22)) * (1 << 40)


def growth_noise(seed: int, index: int) -> int:
    """The noise progressive.growth.noise adds to stack `index` as it is grown."""
    return ((seed % MOD) * PRIME + 65_537 + index) % MOD
