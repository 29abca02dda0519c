"""What every objective produces: corrupted inputs, targets and per-token loss weights.

Objectives are the only place that corrupts inputs. The trainer never looks inside; it calls
`prepare` then `loss`, and `eval_sums` for evaluation.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from stackwise.objectives.blocked_ce import IGNORE, blocked_ce_sum, blocked_token_ce, pays
from stackwise.origin import stackwise_code

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
    """Per-position cross entropy in fp32 (whatever the logits' dtype), 0 where the target is
    IGNORE."""
    if pays(logits) and not (torch.is_grad_enabled() and logits.requires_grad):
        return blocked_token_ce(logits, targets)
    flat = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(),
        targets.reshape(-1),
        ignore_index=IGNORE,
        reduction="none",
    )
    return flat.view(targets.shape)


def weighted_ce_sum(
    logits: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    """sum(weights * cross entropy) over positions, in fp32: the training loss's numerator.
    Large logits on a CPU go a block of rows at a time (stackwise.objectives.blocked_ce)."""
    if pays(logits, weights):
        return blocked_ce_sum(logits, targets, weights)
    return (token_ce(logits, targets) * weights).sum()


@functools.cache
def compiled_ce_sum(fallback: bool = False) -> Callable[..., torch.Tensor]:
    """weighted_ce_sum compiled: the upcast, log-softmax, pick and weighting fused into a
    few kernels that read the logits in their own dtype and never write an fp32 copy. On an
    H200 at GPT-2's 12x1024x50304 bf16 logits, forward and backward take 1.8 ms against 8.0
    eager (benchmarks/RESULTS.md, gpu_loss_paths). `fallback`: eager if the compiler fails."""
    from stackwise.compiling import CompiledOrEager

    return CompiledOrEager(weighted_ce_sum, fallback)


def fp32_logits(method: Callable[..., Any]) -> Callable[..., Any]:
    """`method(self, logits, prep)` given fp32 logits: a loss written outside stackwise gets
    them as Accelerate hands them over (stackwise's own upcast inside their kernel)."""

    @functools.wraps(method)
    def upcast(self: Any, logits: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        return method(self, logits.float(), *args, **kwargs)

    return upcast


class Objective:
    """Base: subclasses implement `prepare`; the weighted loss is shared."""

    name = "base"
    causal = False
    # the training loss's numerator, private: `fused()` swaps in the compiled one
    _ce_sum: Callable[..., torch.Tensor] = staticmethod(weighted_ce_sum)

    def __init__(self, specials: Specials) -> None:
        self.specials = specials

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A `loss` or `eval_sums` defined outside stackwise receives fp32 logits."""
        super().__init_subclass__(**kwargs)
        for name in ("loss", "eval_sums"):
            method = cls.__dict__.get(name)
            if method is not None and not stackwise_code(method):
                setattr(cls, name, fp32_logits(method))

    def fused(self, fallback: bool = False) -> Objective:
        """This objective with its training loss compiled (train.compile on a GPU; with
        `fallback`, auto's, eager again if the compiler fails). An objective whose loss is
        not stackwise's own is returned as it is."""
        if type(self).loss is not Objective.loss:
            return self
        twin = copy.copy(self)
        twin._ce_sum = compiled_ce_sum(fallback)
        return twin

    @classmethod
    def from_spec(cls, objective: Any, masking: Any, specials: Specials) -> Objective:
        """The objective `objective` and `masking` describe (anything with the fields of the
        config's objective/masking sections). Subclasses that read settings override it."""
        return cls(specials)

    def prepare(self, batch: dict[str, torch.Tensor], gen: torch.Generator) -> Prepared:
        raise NotImplementedError

    def loss(self, logits: torch.Tensor, prep: Prepared) -> torch.Tensor:
        """sum(weights * CE) / normalizer, in fp32; the logits may be in the autocast dtype."""
        return self._ce_sum(logits, prep.targets, prep.weights) / prep.normalizer.clamp_min(1)

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
