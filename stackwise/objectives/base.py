"""What every objective produces: corrupted inputs, targets and per-token loss weights.

Objectives are the only place that corrupts inputs. The trainer never looks inside; it calls
`prepare` then `loss`, and `eval_sums` for evaluation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

IGNORE = -100
Batch = dict[str, torch.Tensor]  # a collated batch: input_ids, labels, masks, cache keys


@dataclass(frozen=True)
class Specials:
    vocab_size: int
    pad_id: int
    mask_id: int
    bos_id: int | None = None
    eos_id: int | None = None


@dataclass
class Prepared:
    inputs: torch.Tensor  # (B, L) what the model sees
    targets: torch.Tensor  # (B, L) token to predict, IGNORE elsewhere
    weights: torch.Tensor  # (B, L) training loss weight per position
    normalizer: torch.Tensor  # scalar: the loss is sum(weights * CE) / normalizer
    attention_mask: torch.Tensor | None = None
    t: torch.Tensor | None = None  # (B,) diffusion time, when the objective has one
    elbo_weights: torch.Tensor | None = None  # diffusion: NELBO weights even if training uniform
    bounded: torch.Tensor | None = None  # (B, L) tokens the NELBO covers, when not every real one

    @classmethod
    def for_batch(
        cls,
        batch: dict[str, torch.Tensor],
        inputs: torch.Tensor,
        targets: torch.Tensor,
        weights: torch.Tensor,
        normalizer: torch.Tensor,
        **extra: torch.Tensor,
    ) -> Prepared:
        """Every objective keeps the batch's padding mask; only what it changes is passed."""
        return cls(inputs, targets, weights, normalizer, batch.get("attention_mask"), **extra)


def token_ce(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-position cross entropy in fp32, 0 where the target is IGNORE."""
    flat = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(),
        targets.reshape(-1),
        ignore_index=IGNORE,
        reduction="none",
    )
    return flat.view(targets.shape)


class Objective:
    """Base: subclasses implement `prepare`; the weighted loss is shared."""

    name = "base"
    causal = False

    def __init__(self, specials: Specials) -> None:
        self.specials = specials

    @classmethod
    def from_spec(cls, objective: Any, masking: Any, specials: Specials) -> Objective:
        """The objective `objective` and `masking` describe (anything with the fields of the
        config's objective/masking sections). Subclasses that read settings override it."""
        return cls(specials)

    def prepare(self, batch: dict[str, torch.Tensor], gen: torch.Generator) -> Prepared:
        raise NotImplementedError

    def loss(self, logits: torch.Tensor, prep: Prepared) -> torch.Tensor:
        ce = token_ce(logits, prep.targets)
        return (ce * prep.weights).sum() / prep.normalizer.clamp_min(1)

    @torch.no_grad()
    def eval_sums(self, logits: torch.Tensor, prep: Prepared) -> dict[str, float]:
        """Additive statistics; the trainer sums them over eval batches."""
        ce = token_ce(logits, prep.targets)
        scored = prep.targets != IGNORE
        correct = (logits.argmax(-1) == prep.targets) & scored
        sums = {
            "loss_sum": float((ce * prep.weights).sum()),
            "norm": float(prep.normalizer),
            "nll_sum": float(ce[scored].sum()),
            "scored": float(scored.sum()),
            "correct": float(correct.sum()),
        }
        if prep.elbo_weights is not None:
            sums["nelbo_sum"] = float((ce * prep.elbo_weights).sum())
        return sums


def random_lengths(
    batch: dict[str, torch.Tensor], ratio: float, pad_id: int, gen: torch.Generator
) -> dict[str, torch.Tensor]:
    """Cut a `ratio` share of the rows to a length drawn uniformly from 1..L: the rest becomes
    padding, which no objective scores or counts, and which attention skips."""
    ids = batch["input_ids"]
    b, length = ids.shape
    cut = torch.rand(b, generator=gen, device=ids.device) < ratio
    lengths = torch.randint(1, length + 1, (b,), generator=gen, device=ids.device)
    lengths = torch.where(cut, lengths, length)
    keep = torch.arange(length, device=ids.device)[None, :] < lengths[:, None]
    if "attention_mask" in batch:
        keep = keep & batch["attention_mask"].bool()
    return {**batch, "input_ids": ids.masked_fill(~keep, pad_id), "attention_mask": keep.long()}
