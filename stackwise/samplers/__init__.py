"""Samplers for masked racks (mlm and diffusion): start from masks after the prompt, unmask.

- `ancestral`: the MDLM reverse process. Going from t to s < t, each masked position is revealed
  with probability (m(t) - m(s)) / m(t), m being the schedule's mask fraction, with a token drawn
  from the model. A step that reveals nothing in a row leaves that row unchanged, so its logits
  are reused instead of recomputed (exact: the time input is derived from the masked fraction);
  only the rows that changed run through the rack.
- `remask` (LLaDA/Dream style): each step reveals its share of the still-masked positions, the
  ones ranked first by `remasking`: `low_confidence` (highest probability of the drawn token),
  `random`, `entropy` (lowest predictive entropy) or `margin` (largest top-1 minus top-2).

- `confidence`: each step reveals every masked position whose drawn token is at least
  `confidence_threshold` likely, and at least the likeliest one per row (Fast-dLLM's rule).
- `remdm` (ReMDM, capped schedule): the ancestral step, and tokens revealed earlier in the
  block are masked again with a probability capped by `remask_budget`, so a poor early choice
  can be redrawn; the reveal probability is raised to keep the process's marginals.

- `block`: a rack trained with objective block_diffusion writes its blocks left to right, each
  by ancestral steps that score that block only, against a KV cache of the finished blocks;
  `block_remask` reveals each step's share of the block ranked by `remasking` instead.

- `single_pass`: a rack grown as a denoising chain (time as depth, high noise to low) runs once:
  stack g takes the sequence from its noise level to the next one, revealing each masked
  position with the ancestral probability (or that many positions ranked by `remasking`), and
  the revealed tokens' embeddings join the hidden state before stack g + 1.

The first two can be semi-autoregressive: with `block_length`, blocks are filled left to right,
each with its share of the steps, and later blocks stay masked. Draws are made in float64, so a low
temperature stays a low temperature. Sampling stops once every row holds an EOS.
Each is registered with `@register_sampler` (stackwise.registry): a `Stepwise` subclass with its
own `reveal` rule, or a `Method` that fills the whole generation itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from stackwise.objectives.schedules import Linear, Schedule, time_for_fraction
from stackwise.registry import SAMPLERS
from stackwise.repeat_guard import WordRepeatGuard
from stackwise.samplers.draws import (
    REMASKING,
    Progress,
    draw,
    filter_logits,
    rank_scores,
    split_steps,
    truncate_at_eos,
)


@dataclass(frozen=True)
class MaskedSampling:
    sampler: str = "ancestral"  # a name registered with @register_sampler
    remasking: str = "low_confidence"
    steps: int = 32
    block_length: int = 0  # 0: the whole generation is one block
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    remasking_set: bool = False  # single_pass: rank reveals by `remasking` instead of at random
    confidence_threshold: float = 0.9  # confidence: reveal every position this sure
    remask_budget: float = 0.05  # remdm: the most a revealed token's chance to be masked again


@dataclass
class SampleStats:
    forward_passes: int = 0  # calls of the rack (a batch of rows each)
    steps: int = 0
    tokens: int = 0
    row_passes: int = 0  # rows computed over all calls: the work done


class MaskedSampler:
    """One sampling run: holds the rack, the running sequence and the logits cache."""

    def __init__(
        self,
        rack: torch.nn.Module,
        settings: MaskedSampling,
        mask_id: int,
        banned: list[int],
        gen: torch.Generator,
        schedule: Schedule | None = None,
        eos_id: int | None = None,
        reuse_logits: bool = True,
        guard: WordRepeatGuard | None = None,
    ) -> None:
        self.rack, self.s, self.mask_id, self.banned = rack, settings, mask_id, banned
        self.gen, self.eos_id, self.reuse_logits = gen, eos_id, reuse_logits
        self.guard, self.prompt_len = guard, 0
        self.schedule = schedule or Linear()
        self.stats = SampleStats()
        self._cache: tuple[torch.Tensor, torch.Tensor] | None = None

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """The rack's logits for x; rows unchanged since the last pass reuse theirs."""
        rows = torch.ones(x.shape[0], dtype=torch.bool, device=x.device)
        if self.reuse_logits and self._cache is not None and self._cache[0].shape == x.shape:
            rows = (self._cache[0] != x).any(1)
            if not bool(rows.any()):
                return self._cache[1]  # nothing was revealed since the last pass
        sub = x[rows]
        t = None
        if getattr(self.rack, "uses_time", False):
            frac = (sub == self.mask_id).float().sum(1) / x.shape[1]
            t = time_for_fraction(self.schedule, frac)
        fresh = self.rack(sub, t=t).float()
        fresh[..., self.banned] = -math.inf
        self.stats.forward_passes += 1
        self.stats.row_passes += int(rows.sum())
        if bool(rows.all()):
            out = fresh
        else:
            assert self._cache is not None
            out = self._cache[1].clone()
            out[rows] = fresh
        self._cache = (x.clone(), out)
        return out

    def run(self, prompt: Tensor, length: int, on_block: Progress | None = None) -> Tensor:
        """`on_block(ids)` sees the tokens up to the end of each block as it is finished."""
        b, p = prompt.shape
        self.prompt_len = p
        if self.guard is not None:
            self.guard.bans.clear()  # bans are per run: (row, position) of this run's rows
        x = torch.cat([prompt, prompt.new_full((b, length), self.mask_id)], dim=1)
        x = SAMPLERS.create(self.s.sampler, self, where="sampler").fill(x, p, length, on_block)
        self.stats.tokens += int((x[:, p:] != self.mask_id).sum())
        return x

    def remask(self, masked: Tensor, logits: Tensor, tokens: Tensor, left: float) -> Tensor:
        """Reveal a 1/`left` share of each row's masked positions, ranked by `remasking`."""
        scores = rank_scores(self.s.remasking, logits, tokens, self.gen)
        scores = scores.masked_fill(~masked, -math.inf)
        reveal = torch.zeros_like(masked)
        for row in range(masked.shape[0]):
            n = int(masked[row].sum())
            k = min(n, math.ceil(n / left - 1e-9)) if n else 0
            if k:
                reveal[row, scores[row].topk(k).indices] = True
        return reveal & masked


from stackwise.samplers.blockwise import BlockRemask, BlockSampler  # noqa: E402
from stackwise.samplers.methods import (  # noqa: E402  (registers the built-ins)
    REDRAW_STEPS,
    Ancestral,
    Confidence,
    Method,
    Remask,
    ReMDM,
    SinglePass,
    Stepwise,
)

__all__ = [
    "REDRAW_STEPS",
    "REMASKING",
    "Ancestral",
    "BlockRemask",
    "BlockSampler",
    "Confidence",
    "MaskedSampler",
    "MaskedSampling",
    "Method",
    "Progress",
    "ReMDM",
    "Remask",
    "SampleStats",
    "SinglePass",
    "Stepwise",
    "draw",
    "filter_logits",
    "rank_scores",
    "split_steps",
    "truncate_at_eos",
]
