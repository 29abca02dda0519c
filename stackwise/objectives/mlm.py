"""Masked LM: a fixed or ranged mask ratio, with BERT's 80/10/10 rule as an option."""

from __future__ import annotations

import torch

from stackwise.objectives.base import IGNORE, Objective, Prepared, Specials, real_tokens


class MLM(Objective):
    name = "mlm"

    def __init__(
        self, specials: Specials, ratio: float | tuple[float, float], bert_mix: bool
    ) -> None:
        super().__init__(specials)
        self.lo, self.hi = (ratio, ratio) if isinstance(ratio, float | int) else ratio
        self.bert_mix = bert_mix

    def prepare(self, batch: dict[str, torch.Tensor], gen: torch.Generator) -> Prepared:
        ids = batch["input_ids"]
        b, n = ids.shape
        dev = ids.device
        real = real_tokens(batch, self.specials.pad_id)
        ratio = self.lo + (self.hi - self.lo) * torch.rand(b, 1, generator=gen, device=dev)
        chosen = (torch.rand(b, n, generator=gen, device=dev) < ratio) & real
        inputs = ids.clone()
        if self.bert_mix:
            u = torch.rand(b, n, generator=gen, device=dev)
            rand_tok = torch.randint(0, self.specials.vocab_size, (b, n), generator=gen, device=dev)
            inputs = torch.where(chosen & (u < 0.8), self.specials.mask_id, inputs)
            inputs = torch.where(chosen & (u >= 0.8) & (u < 0.9), rand_tok, inputs)
        else:
            inputs = torch.where(chosen, self.specials.mask_id, inputs)
        targets = torch.where(chosen, ids, IGNORE)
        weights = chosen.float()
        return Prepared(
            inputs=inputs,
            targets=targets,
            weights=weights,
            normalizer=weights.sum(),
            attention_mask=batch.get("attention_mask"),
            t=ratio.squeeze(1),
        )
