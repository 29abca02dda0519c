"""Validation during training: fixed masks per batch, so every evaluation scores the same inputs,
and bits per character beside the per-token numbers, so tokenizers compare."""

from __future__ import annotations

import math
from typing import Any

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, Dataset

from stackwise import seeds
from stackwise.objectives.base import IGNORE, Objective
from stackwise.objectives.positions import real_tokens
from stackwise.registry import OBJECTIVES
from stackwise.train.sampler import EpochSampler

SUMS = ("loss_sum", "norm", "nll_sum", "scored", "correct", "nelbo_sum", "bytes", "bytes_all")


def eval_generator(gen: torch.Generator, seed: int, batch: int, rank: int) -> torch.Generator:
    """The generator for validation batch `batch`: the same masks at every evaluation."""
    return gen.manual_seed(seeds.eval_batch(seed, batch, rank))


@torch.no_grad()
def evaluate_model(
    model: nn.Module,
    objective: Objective,
    val_data: Dataset | None,
    acc: Accelerator,
    tc: Any,
    uses_time: bool,
    seed_gen: Any,
) -> dict[str, float]:
    """Loss, perplexity (or the NELBO bound) and masked-token accuracy on fixed batches.

    The masks come from `seed_gen(batch_index)`, so every evaluation scores the same inputs.
    """
    if val_data is None or len(val_data) == 0:
        return {}
    model.eval()
    loader = DataLoader(
        val_data,
        batch_size=tc.batch_size,
        sampler=EpochSampler(len(val_data), 0, acc.process_index, acc.num_processes, False),
        collate_fn=getattr(val_data, "collate", None),  # rows of their own lengths
    )
    table = getattr(val_data, "bytes_per_token", None)  # text length of each token id
    if table is not None:
        table = table.to(acc.device)
    sums = torch.zeros(len(SUMS), dtype=torch.float64, device=acc.device)
    for i, batch in enumerate(loader):
        if i >= tc.eval_batches:
            break
        batch = {k: v.to(acc.device) for k, v in batch.items()}
        prep = objective.prepare(batch, seed_gen(i))
        t = prep.t if uses_time else None
        with acc.autocast():
            logits = model(prep.inputs, prep.attention_mask, t)
        part = objective.eval_sums(logits, prep)
        if table is not None:
            part.update(text_bytes(table, batch, prep, objective.specials.pad_id))
        sums += torch.tensor(
            [part.get(k, 0.0) for k in SUMS], dtype=torch.float64, device=acc.device
        )
    sums = acc.reduce(sums, reduction="sum")
    return eval_metrics(dict(zip(SUMS, sums.tolist(), strict=True)), objective, table is not None)


def eval_metrics(s: dict[str, float], objective: Objective, has_text: bool) -> dict[str, float]:
    """The metrics from the summed counts: loss, accuracy, and perplexity or the NELBO bound,
    with bits per character where the text length of each token is known."""
    out = {
        "loss": s["loss_sum"] / max(s["norm"], 1.0),
        "accuracy": s["correct"] / max(s["scored"], 1.0),
    }
    if OBJECTIVES.capabilities_of(objective).nelbo:
        nelbo = s["nelbo_sum"] / max(s["norm"], 1.0)
        out["nelbo"] = nelbo
        out["ppl_bound"] = math.exp(min(nelbo, 50.0))
        if has_text:  # a bound on the whole text's log-likelihood, per character
            out["bpc"] = s["nelbo_sum"] / math.log(2) / max(s["bytes_all"], 1.0)
    else:
        out["ppl"] = math.exp(min(s["nll_sum"] / max(s["scored"], 1.0), 50.0))
        if has_text:  # the scored tokens' log-likelihood, per character they spell
            out["bpc"] = s["nll_sum"] / math.log(2) / max(s["bytes"], 1.0)
    return out


def text_bytes(
    table: torch.Tensor, batch: dict[str, torch.Tensor], prep: Any, pad_id: int | None
) -> dict[str, float]:
    """Characters (UTF-8 bytes) spelled by the scored targets, and by all real tokens."""
    targets = prep.targets
    scored = targets != IGNORE
    ids = batch["input_ids"]
    real = real_tokens(batch, pad_id if pad_id is not None else -1)
    if getattr(prep, "bounded", None) is not None:
        real = prep.bounded  # the tokens the bound covers (block diffusion: all but the first)
    return {
        "bytes": float(table[targets.clamp_min(0)][scored].sum()),
        "bytes_all": float(table[ids][real].sum()),
    }


def score_model(
    model: nn.Module, objective: Objective, val_data: Dataset | None, acc: Accelerator, config: Any
) -> dict[str, float]:
    """A model outside any Trainer, scored exactly as a Trainer of `config` scores it (the same
    batches and masks, seeded by train.seed): a grown rack's final score is comparable with
    its stages'."""
    gen = torch.Generator(device=acc.device)
    seed = config.train.seed
    out = evaluate_model(
        model,
        objective,
        val_data,
        acc,
        config.train,
        bool(getattr(model, "uses_time", False)),
        lambda i: eval_generator(gen, seed, i, acc.process_index),
    )
    model.train()
    return out


class Evaluator:
    """A run's validation: its data, the objective it scores (a depth-mapped stage trains on
    part of the noise range and is scored on all of it) and the seed of its masks (the stages
    of one run share it, so they score the same inputs). The model adapter may evaluate its
    own way (an HF model with labels)."""

    def __init__(
        self, val_data: Dataset | None, objective: Objective, seed: int, adapter: Any, train: Any
    ) -> None:
        self.val_data, self.objective, self.seed = val_data, objective, seed
        self.adapter, self.train = adapter, train

    def evaluate(self, model: nn.Module, acc: Accelerator, uses_time: bool) -> dict[str, float]:
        own = self.adapter.evaluate(model, self.val_data, acc, self.train)
        if own is None:
            gen = torch.Generator(device=acc.device)
            own = evaluate_model(
                model,
                self.objective,
                self.val_data,
                acc,
                self.train,
                uses_time,
                seed_gen=lambda i: eval_generator(gen, self.seed, i, acc.process_index),
            )
        model.train()
        return own
