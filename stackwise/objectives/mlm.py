"""Masked LM: a fixed or ranged mask ratio, with BERT's 80/10/10 rule as an option."""

from __future__ import annotations

from typing import Any

import torch

from stackwise.objectives.base import Objective, Prepared, Specials
from stackwise.objectives.positions import masked_targets, real_tokens, uniforms
from stackwise.registry import register_objective


@register_objective("mlm", masked=True, masking_fields=("mask_ratio", "bert_mix"))
class MLM(Objective):
    name = "mlm"

    def __init__(
        self, specials: Specials, ratio: float | tuple[float, float], bert_mix: bool
    ) -> None:
        super().__init__(specials)
        self.lo, self.hi = (ratio, ratio) if isinstance(ratio, float | int) else ratio
        self.bert_mix = bert_mix

    @classmethod
    def from_spec(cls, objective: Any, masking: Any, specials: Specials) -> MLM:
        return cls(specials, masking.mask_ratio, masking.bert_mix)

    def prepare(self, batch: dict[str, torch.Tensor], gen: torch.Generator) -> Prepared:
        ids = batch["input_ids"]
        n = ids.shape[1]
        real = real_tokens(batch, self.specials.pad_id)
        ratio = self.lo + (self.hi - self.lo) * uniforms(batch, gen, 1, stream=0)
        chosen = (uniforms(batch, gen, n, stream=1) < ratio) & real
        inputs = ids.clone()
        if self.bert_mix:
            u = uniforms(batch, gen, n, stream=2)
            rand_tok = (uniforms(batch, gen, n, stream=3) * self.specials.vocab_size).long()
            inputs = torch.where(chosen & (u < 0.8), self.specials.mask_id, inputs)
            inputs = torch.where(chosen & (u >= 0.8) & (u < 0.9), rand_tok, inputs)
        else:
            inputs = torch.where(chosen, self.specials.mask_id, inputs)
        weights = chosen.float()
        targets = masked_targets(ids, chosen)
        return Prepared.for_batch(
            batch, inputs, targets, weights, weights.sum(), t=ratio.squeeze(1)
        )
