"""Which positions hold data, which are hidden, and the random draws that hide them."""

from __future__ import annotations

import torch

from stackwise.objectives.base import IGNORE
from stackwise.objectives.keyed import keyed_uniform


def uniforms(
    batch: dict[str, torch.Tensor], gen: torch.Generator, n: int, stream: int
) -> torch.Tensor:
    """(B, n) uniforms: from the batch's `mask_key` when present (reproducible per sample, which
    the activation cache needs), otherwise from the step's generator."""
    ids = batch["input_ids"]
    if "mask_key" in batch:
        return keyed_uniform(batch["mask_key"].to(ids.device), n, stream)
    return torch.rand(ids.shape[0], n, generator=gen, device=ids.device)


def real_tokens(batch: dict[str, torch.Tensor], pad_id: int) -> torch.Tensor:
    """(B, L) bool: positions that hold data, from attention_mask if given, else != pad."""
    ids = batch["input_ids"]
    if "attention_mask" in batch:
        return batch["attention_mask"].bool()
    return ids != pad_id


def masked_targets(ids: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
    """The original token where it was hidden, IGNORE where the model saw it."""
    return torch.where(masked, ids, IGNORE)
