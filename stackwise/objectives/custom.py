"""Custom targets: the batch carries `labels` (-100 = ignored), inputs are left untouched."""

from __future__ import annotations

from typing import Any

import torch

from stackwise.errors import StackWiseError
from stackwise.objectives.base import IGNORE, Objective, Prepared, Specials
from stackwise.registry import register_objective


@register_objective("custom", causal=True, labels_from_batch=True)
class Custom(Objective):
    name = "custom"

    def __init__(self, specials: Specials, causal: bool) -> None:
        super().__init__(specials)
        self.causal = causal

    @classmethod
    def from_spec(cls, objective: Any, masking: Any, specials: Specials) -> Custom:
        return cls(specials, objective.causal)

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
