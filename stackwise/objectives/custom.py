"""Custom targets: the batch carries `labels` (-100 = ignored), inputs are left untouched."""

from __future__ import annotations

import torch

from stackwise.errors import StackWiseError
from stackwise.objectives.base import IGNORE, Objective, Prepared, Specials


class Custom(Objective):
    name = "custom"

    def __init__(self, specials: Specials, causal: bool) -> None:
        super().__init__(specials)
        self.causal = causal

    def prepare(self, batch: dict[str, torch.Tensor], gen: torch.Generator) -> Prepared:
        if "labels" not in batch:
            raise StackWiseError(
                "objective 'custom' needs a 'labels' tensor in every batch (-100 where no loss); "
                "supply a dataset that yields it, or use objective clm/mlm/diffusion."
            )
        labels = batch["labels"]
        weights = (labels != IGNORE).float()
        return Prepared(
            inputs=batch["input_ids"],
            targets=labels,
            weights=weights,
            normalizer=weights.sum(),
            attention_mask=batch.get("attention_mask"),
        )
