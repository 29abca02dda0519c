"""The seeds' progressive batches: a dataloader that masks each batch for one stack, and a loss.

`ProgressiveDataLoader` wraps a dataloader: each batch comes back with what a stack trains on,
made by a masking strategy (stackwise.fronts.progressive_time.TimeStepMasking): the inputs the
model sees, the targets, the masked positions, the time step, and the seeds' `clm_mask` /
`combined_masks` / `training_objective` keys; with `trunk_activations` (a TrunkActivations),
also the hidden states entering the stack, read from or streamed into an activation cache.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

from stackwise.errors import StackWiseError
from stackwise.objectives.base import IGNORE, Prepared, token_ce
from stackwise.progressive.stage import KeyedSamples
from stackwise.progressive.trunk import TrunkActivations


def compute_loss(
    logits: torch.Tensor, targets: torch.Tensor, loss_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Mean cross entropy over the positions `loss_mask` keeps (and targets not IGNORE)."""
    if loss_mask is not None:
        targets = targets.masked_fill(~loss_mask.bool(), IGNORE)
    ce = token_ce(logits, targets)
    return ce.sum() / (targets != IGNORE).sum().clamp_min(1)


def time_steps(t: torch.Tensor, num_time_steps: int) -> torch.Tensor:
    """Discrete steps 0..T-1 of times t: step k covers t in (k/T, (k+1)/T]."""
    k = torch.ceil(t.float() * num_time_steps) - 1
    return k.clamp(0, num_time_steps - 1).long()


def seed_batch(
    batch: dict[str, Any],
    prep: Prepared,
    objective: str,
    stack_idx: int | None,
    num_time_steps: int | None,
    timed: bool = True,
) -> dict[str, Any]:
    """`batch` with what its stack trains on, under the seeds' names (`timed`: the objective
    draws time steps, so t and time_steps are part of it)."""
    loss_mask = prep.targets != IGNORE
    # what was masked: the scored positions of a masked objective; a causal one masks nothing.
    # Block diffusion: `inputs` is [noised; clean] (2L) and, shifted, position j's mask and
    # target are token j + 1's (the prediction made at j)
    masks = loss_mask if objective != "clm" else torch.zeros_like(loss_mask)
    out = dict(batch)
    out.update(
        inputs=prep.inputs,
        targets=prep.targets,
        masks=masks,
        loss_weights=prep.weights,
        combined_masks=loss_mask,
        training_objective=objective,
        stack_idx=stack_idx,
    )
    if objective == "clm":  # every position but the last has a next token to predict
        clm = torch.ones_like(loss_mask)
        clm[:, -1] = False
        out["clm_mask"] = clm
    if prep.t is not None and timed:
        out["t"] = prep.t
        if num_time_steps is not None:
            out["time_steps"] = time_steps(prep.t, num_time_steps)
    return out


def keyed_loader(base: DataLoader, seed: int) -> DataLoader:
    """`base`'s batches in its own order, each item with its sample's cache and mask keys."""
    data = getattr(base, "dataset", None)
    if data is None or not hasattr(data, "__getitem__") or not hasattr(data, "__len__"):
        raise StackWiseError(
            "Trunk activations are cached per sample, so the dataloader must read a dataset "
            "with a length and indexed items (a map-style torch Dataset); this one streams. "
            "Pass a DataLoader over such a dataset, or leave trunk_activations out."
        )
    keyed = KeyedSamples(data, 1, seed)
    if base.batch_size is None:  # a batch sampler of its own
        return DataLoader(keyed, batch_sampler=base.batch_sampler, collate_fn=base.collate_fn)
    return DataLoader(
        keyed,
        batch_size=base.batch_size,
        sampler=base.sampler,
        drop_last=base.drop_last,
        collate_fn=base.collate_fn,
        num_workers=base.num_workers,
    )


class ProgressiveDataLoader:
    def __init__(
        self,
        base_dataloader: DataLoader,
        masking_strategy: Any,
        stack_idx: int = 0,
        trunk_activations: TrunkActivations | None = None,
        cache_activations: bool = False,
    ) -> None:
        """`masking_strategy`: anything with `generate_masks_for_stack(batch, stack_idx)` and a
        `seed` (a TimeStepMasking). `trunk_activations` (builder.cached_activations()): each
        batch also carries the hidden states entering stack `stack_idx` (its rack position),
        read from the cache where it holds them; `cache_activations` writes the ones streamed
        through the trunk back, so the next pass over the data reads them."""
        if trunk_activations is not None and not isinstance(trunk_activations, TrunkActivations):
            raise StackWiseError(
                "trunk_activations takes the trunk's activations as "
                "builder.cached_activations() makes them (a TrunkActivations: the rack and its "
                f"activation cache), not a {type(trunk_activations).__name__}."
            )
        if cache_activations and trunk_activations is None:
            raise StackWiseError(
                "cache_activations=True caches the trunk's activations, and no trunk was given: "
                "pass trunk_activations=builder.cached_activations()."
            )
        self.base, self.masking, self.stack_idx = base_dataloader, masking_strategy, stack_idx
        self.trunk, self.cache_activations = trunk_activations, cache_activations
        self.loader = base_dataloader
        if trunk_activations is not None:
            self.loader = keyed_loader(base_dataloader, masking_strategy.seed)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for batch in self.loader:
            out = self.masking.generate_masks_for_stack(batch, stack_idx=self.stack_idx)
            if self.trunk is not None:
                rack = self.trunk.rack
                out["trunk_activations"] = self.trunk(
                    out["inputs"],
                    self.stack_idx,
                    out["cache_key"],
                    out.get("t") if rack.time_embed is not None else None,
                    n_keys=len(self.loader.dataset),
                    write=self.cache_activations,
                )
            yield out
