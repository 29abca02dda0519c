"""Causal LM: predict token i+1 from tokens <= i."""

from __future__ import annotations

import torch

from stackwise.objectives.base import IGNORE, Objective, Prepared
from stackwise.objectives.positions import real_tokens
from stackwise.registry import register_objective


@register_objective("clm", causal=True, instruction_rows=True, hf_models=True)
class CLM(Objective):
    name = "clm"
    causal = True

    def prepare(self, batch: dict[str, torch.Tensor], gen: torch.Generator) -> Prepared:
        ids = batch["input_ids"]
        real = real_tokens(batch, self.specials.pad_id)
        targets = torch.full_like(ids, IGNORE)
        nxt_ok = real[:, 1:] & real[:, :-1]
        # instruction rows mark their targets (the replies); pretraining rows are all targets
        nxt = batch["labels"][:, 1:] if "labels" in batch else ids[:, 1:]
        targets[:, :-1] = torch.where(nxt_ok, nxt, IGNORE)
        weights = (targets != IGNORE).float()
        return Prepared.for_batch(batch, ids, targets, weights, weights.sum())
