"""Likelihood of a run's validation split: the NELBO on a fixed t grid (masked racks) or the
exact NLL (causal racks), and the conditional likelihood of each block's second half given its
first. Masks are seeded by (seed, block, t point), so two runs differ only by their weights."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.nn import functional as F

from stackwise import seeds
from stackwise.data.pack import PreparedData
from stackwise.evaluate.settings import EvalSettings
from stackwise.objectives import build_objective
from stackwise.objectives.diffusion import Diffusion
from stackwise.objectives.schedules import Linear, Schedule, time_for_fraction
from stackwise.spec import Plan

LN2 = math.log(2)


@dataclass
class NoiseTally:
    """Per point of a shared t grid, summed over the blocks scored: the tokens masked, their
    cross-entropy, the weighted NELBO term and the mask rate. It shows where the bound's nats
    come from: a loss-vs-mask-rate curve (the report's noise plot)."""

    masked: list[float] = field(default_factory=list)
    ce: list[float] = field(default_factory=list)
    weighted: list[float] = field(default_factory=list)
    rate: list[float] = field(default_factory=list)
    blocks: list[int] = field(default_factory=list)

    def add(
        self,
        point: int,
        masked: torch.Tensor,
        ce: torch.Tensor,
        weighted: torch.Tensor,
        frac: torch.Tensor,
    ) -> None:
        if point == len(self.masked):
            for column in (self.masked, self.ce, self.weighted, self.rate, self.blocks):
                column.append(0)
        self.masked[point] += float(masked.sum())
        self.ce[point] += float((ce * masked).sum())
        self.weighted[point] += float(weighted.sum())
        self.rate[point] += float(frac.double().sum())
        self.blocks[point] += int(frac.numel())

    def rows(self, scored_tokens: float) -> list[dict[str, float]]:
        """One row per t point; the `nelbo_share`s add up to the NELBO per token."""
        points = len(self.masked)
        return [
            {
                "mask_rate": self.rate[i] / max(self.blocks[i], 1),
                "loss_per_masked": self.ce[i] / max(self.masked[i], 1.0),
                "nelbo_share": self.weighted[i] / points / max(scored_tokens, 1.0),
            }
            for i in range(points)
        ]


def t_grid(points: int, eps: float) -> torch.Tensor:
    """Midpoints of `points` equal cells of (eps, 1]: deterministic and evenly spread."""
    return eps + (1 - eps) * (torch.arange(points, dtype=torch.float64) + 0.5) / points


def stratified_ts(points: int, eps: float, rows: torch.Tensor, seed: int) -> torch.Tensor:
    """(points, blocks): for each validation block one draw in each of `points` equal cells of
    (eps, 1], shifted by an offset seeded by (seed, block index). Unbiased like i.i.d. draws;
    the NELBO integrand climbs steeply with t, so one offset shared by every block moved an
    8-point estimate by 0.3 nats, and i.i.d. draws bunched (5 of 8 above t=0.6) by more."""
    offsets = torch.empty(len(rows), dtype=torch.float64)
    for j, row in enumerate(rows.tolist()):
        gen = torch.Generator().manual_seed(seeds.eval_offset(seed, row))
        offsets[j] = torch.rand(1, generator=gen, dtype=torch.float64)
    cells = torch.arange(points, dtype=torch.float64)[:, None]
    return eps + (1 - eps) * (cells + offsets[None]) / points


def _masks(
    rows: torch.Tensor, length: int, frac: torch.Tensor, seed: int, point: int, device: torch.device
) -> torch.Tensor:
    """One mask per validation block (masking the fraction `frac[j]` of block j), seeded by
    (seed, block index, t point): the same masks whatever the batch size or the order blocks
    are scored in."""
    out = torch.empty(len(rows), length, dtype=torch.bool)
    for j, row in enumerate(rows.tolist()):
        gen = torch.Generator().manual_seed(seeds.eval_block(seed, row, point))
        out[j] = torch.rand(length, generator=gen, dtype=torch.float64) < float(frac[j])
    return out.to(device)


def _rack_t(rack: torch.nn.Module, masked: torch.Tensor, schedule: Schedule) -> torch.Tensor | None:
    """The time input a sampler would give this input: from the fraction actually masked."""
    if not getattr(rack, "uses_time", False):
        return None
    frac = masked.float().sum(1) / masked.shape[1]
    return time_for_fraction(schedule, frac)


@torch.no_grad()
def masked_nll_sums(
    rack: torch.nn.Module,
    ids: torch.Tensor,
    scorable: torch.Tensor,
    schedule: Schedule,
    ts: torch.Tensor,
    mask_id: int,
    seed: int,
    rows: torch.Tensor | None = None,
    tally: NoiseTally | None = None,
) -> torch.Tensor:
    """(B,) estimate of -log p(scorable tokens | the rest): the mean over `ts` of
    w(t) * sum of CE over the scorable positions masked at t (the NELBO integrand). `ts` is
    (points,), shared by every block, or (points, B). `rows` are the blocks' indices in the
    validation set, which seed their masks; `tally` collects the terms point by point."""
    b = ids.shape[0]
    rows = torch.arange(b) if rows is None else rows
    grid = (ts[:, None] if ts.dim() == 1 else ts).expand(-1, b)
    total = torch.zeros(b, dtype=torch.float64, device=ids.device)
    for i in range(grid.shape[0]):
        tt = grid[i].float()
        frac = schedule.mask_fraction(tt)
        masked = _masks(rows, ids.shape[1], frac, seed, i, ids.device) & scorable
        inputs = torch.where(masked, mask_id, ids)
        ce = _masked_ce(rack, inputs, ids, _rack_t(rack, masked, schedule))
        weight = schedule.weight(tt).double().to(ids.device)
        term = weight * (ce * masked).sum(1)
        total += term
        if tally is not None:
            tally.add(i, masked, ce, term, frac)
    return total / grid.shape[0]


def _masked_ce(
    rack: torch.nn.Module, inputs: torch.Tensor, ids: torch.Tensor, t: torch.Tensor | None
) -> torch.Tensor:
    """(B, L) CE of each position's token; a block-diffusion rack reads [noised; clean] and,
    shifted, predicts token j at position j - 1 (the first token is given: 0 there)."""
    blocks = getattr(rack, "block_size", None) is not None
    logits = rack(torch.cat([inputs, ids], dim=1) if blocks else inputs, t=t).float()
    if not blocks or not rack.block_shift:
        return F.cross_entropy(logits.transpose(1, 2), ids, reduction="none").double()
    ce = torch.zeros(ids.shape, dtype=torch.float64, device=ids.device)
    ce[:, 1:] = F.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")
    return ce


@torch.no_grad()
def causal_nll_sums(
    rack: torch.nn.Module, ids: torch.Tensor, scorable: torch.Tensor
) -> torch.Tensor:
    """(B,) exact -log p of the scorable tokens (positions 1..), each given all before it."""
    logits = rack(ids[:, :-1]).float()
    ce = F.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none").double()
    return (ce * scorable[:, 1:]).sum(1)


def _val_blocks(data: PreparedData, s: EvalSettings) -> torch.Tensor:
    blocks = data.val.blocks
    return blocks[: s.max_blocks].long()


def likelihood(
    config: Plan, rack: torch.nn.Module, data: PreparedData, s: EvalSettings
) -> dict[str, Any]:
    """NELBO (grid) or exact NLL over validation blocks, per token and per character."""
    ids = _val_blocks(data, s)
    table = data.val.bytes_per_token
    dev = next(rack.parameters()).device
    ids = ids.to(dev)
    real = ids != data.specials.pad_id if data.specials.pad_id is not None else ids >= 0
    nll = torch.zeros((), dtype=torch.float64)
    scored_tokens = scored_bytes = 0.0
    bs = config.train.batch_size
    sched, eps = _schedule(config, data)
    ts, mask_id = t_grid(s.t_points, eps), data.specials.mask_id
    tally = NoiseTally()
    table = table.to(dev) if table is not None else None
    for start in range(0, ids.shape[0], bs):
        chunk, ok = ids[start : start + bs], real[start : start + bs]
        if config.objective.causal:
            nll += causal_nll_sums(rack, chunk, ok).sum().cpu()
            scored = ok.clone()
            scored[:, 0] = False
        else:
            rows = torch.arange(start, start + chunk.shape[0])
            scored = ok.clone()
            if getattr(rack, "block_size", None) is not None and rack.block_shift:
                scored[:, 0] = False  # given: each token is predicted from the one before
            sums = masked_nll_sums(rack, chunk, scored, sched, ts, mask_id, s.seed, rows, tally)
            nll += sums.sum().cpu()
        scored_tokens += float(scored.sum())
        scored_bytes += float(table[chunk][scored].sum()) if table is not None else 0.0
    kind = "nll" if config.objective.causal else "nelbo"
    out: dict[str, Any] = {
        "kind": "exact NLL" if config.objective.causal else f"NELBO, {s.t_points}-point t grid",
        "blocks": int(ids.shape[0]),
        f"{kind}_per_token": float(nll) / max(scored_tokens, 1.0),
    }
    if scored_bytes:
        out["bpc"] = float(nll) / LN2 / scored_bytes
    if tally.masked:
        out["by_noise"] = tally.rows(scored_tokens)
    return out


def _schedule(config: Plan, data: PreparedData) -> tuple[Schedule, float]:
    obj = build_objective(config, data.specials)
    if isinstance(obj, Diffusion):
        return obj.schedule, obj.eps
    return Linear(), 1e-3  # mlm racks: the linear path, as their sampler uses


def conditional_likelihood(
    config: Plan, rack: torch.nn.Module, data: PreparedData, s: EvalSettings
) -> dict[str, Any]:
    """-log p(second half | first half) per continuation token, and per character."""
    dev = next(rack.parameters()).device
    ids = _val_blocks(data, s).to(dev)
    half = ids.shape[1] // 2
    cont = torch.zeros_like(ids, dtype=torch.bool)
    cont[:, half:] = True
    table = data.val.bytes_per_token
    if config.objective.causal:
        nll = causal_nll_sums(rack, ids, cont).sum()
        how = "exact"
    else:
        sched, eps = _schedule(config, data)
        ts = stratified_ts(s.mc_num, eps, torch.arange(ids.shape[0]), s.seed)
        nll = masked_nll_sums(rack, ids, cont, sched, ts, data.specials.mask_id, s.seed).sum()
        how = f"Monte Carlo, {s.mc_num} stratified noise levels"
    n_tok = float(cont.sum())
    out: dict[str, Any] = {"estimate": how, "nats_per_token": float(nll) / n_tok}
    if table is not None:
        out["bpc"] = float(nll) / LN2 / float(table.to(dev)[ids][cont].sum())
    return out
