"""The causal LM loss over instruction targets, summed: the Trainer divides by the number of
targets in the whole accumulated batch on every rank, so every target weighs the same whatever
the batch size, accumulation, packing or world size."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from stackwise.objectives.blocked_ce import IGNORE, blocked_ce_sum, pays


def forward_logits(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    kwargs = {k: batch[k] for k in ("attention_mask", "position_ids") if k in batch}
    return model(input_ids=batch["input_ids"], use_cache=False, **kwargs).logits


def target_sums(
    logits: torch.Tensor, labels: torch.Tensor, hits: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(summed NLL, with `hits` the per-target correctness) of next-token targets."""
    targets = labels[:, 1:].reshape(-1)
    flat = logits[:, :-1].reshape(-1, logits.size(-1))
    if pays(flat):  # a large vocabulary on a CPU: a block of rows at a time
        nll = blocked_ce_sum(flat, targets)
    else:
        nll = F.cross_entropy(flat.float(), targets, ignore_index=IGNORE, reduction="sum")
    if not hits:
        return nll, None
    return nll, (flat.argmax(-1) == targets) & (targets != IGNORE)


def target_count(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return (batch["labels"][:, 1:] != IGNORE).sum()


@torch.no_grad()
def evaluate_targets(
    model: nn.Module, loader: Any, acc: Any, max_batches: int, lockstep: Any = None
) -> dict[str, float]:
    """Mean NLL per target token, perplexity and next-token accuracy over evaluation rows.
    `lockstep`: (forwards, filler batch) for a sharded model, whose every forward is a
    collective: a rank with fewer rows runs unscored forwards of the filler to that count."""
    import math

    sums = torch.zeros(3, dtype=torch.float64, device=acc.device)
    model.eval()
    done = 0
    for i, batch in enumerate(loader):
        if i >= max_batches:
            break
        done += 1
        batch = {k: v.to(acc.device) for k, v in batch.items()}
        with acc.autocast():
            logits = forward_logits(model, batch)
        nll, hit = target_sums(logits, batch["labels"], hits=True)
        assert hit is not None
        sums += torch.stack([nll.double(), target_count(batch).double(), hit.sum().double()])
    if lockstep is not None:
        forwards, filler = lockstep
        for _ in range(done, forwards):
            forward_logits(model, {k: v.to(acc.device) for k, v in filler.items()})
    total, n, correct = acc.reduce(sums, reduction="sum").tolist()
    if n == 0:
        return {}  # no target scored: no number, rather than a perfect 0.0
    loss = total / n
    return {"loss": loss, "ppl": math.exp(min(loss, 50.0)), "accuracy": correct / max(n, 1.0)}
