"""The built-in masked samplers, each registered with `@register_sampler`: `ancestral`,
`remask`, `confidence` and `remdm` reveal step by step (a `Stepwise` with its own `reveal`
rule; `remdm` also masks revealed tokens again, its `hide` rule), `single_pass` runs a
denoising chain once (a `Method` that fills the whole generation itself)."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from stackwise.registry import register_sampler
from stackwise.samplers.draws import Progress, draw, rank_scores, split_steps

if TYPE_CHECKING:
    from stackwise.samplers import MaskedSampler

REDRAW_STEPS = 8  # a block's extra steps for words the repeat guard masked again


class Method(ABC):
    """A registered sampler: fills the masked part of `x` for one run (`self.run`)."""

    def __init__(self, run: MaskedSampler) -> None:
        self.run = run

    @abstractmethod
    def fill(self, x: torch.Tensor, p: int, length: int, on_block: Progress | None) -> torch.Tensor:
        """`x` with its masked positions after the prompt (`p` tokens) filled."""


class Stepwise(Method):
    """Blocks left to right over their share of the steps; `reveal` picks each step's."""

    @abstractmethod
    def reveal(self, masked: Tensor, logits: Tensor, tokens: Tensor, j: int, steps: int) -> Tensor:
        """Which masked positions step `j` of `steps` reveals (with `tokens` drawn for them)."""

    def hide(self, masked: Tensor, in_block: Tensor, j: int, steps: int) -> Tensor | None:
        """Which revealed positions of the block step `j` masks again (None: none)."""
        return None

    def fill(self, x: torch.Tensor, p: int, length: int, on_block: Progress | None) -> torch.Tensor:
        run = self.run
        block = run.s.block_length or length
        starts = list(range(p, p + length, block))
        for start, steps in zip(starts, split_steps(run.s.steps, len(starts)), strict=True):
            in_block = torch.zeros_like(x, dtype=torch.bool)
            in_block[:, start : min(start + block, p + length)] = True
            x = self.fill_block(x, in_block, steps)
            if on_block is not None:
                on_block(x[:, : min(start + block, p + length)])
            if run.eos_id is not None and bool((x[:, p:] == run.eos_id).any(1).all()):
                break  # every row has ended: later blocks are not generated
        return x

    def fill_block(self, x: torch.Tensor, in_block: torch.Tensor, steps: int) -> torch.Tensor:
        """`steps` steps; with a repeat guard, up to REDRAW_STEPS more redraw what it masked
        again (each extra step reveals everything still masked, as a last step does)."""
        run, s = self.run, self.run.s
        budget = steps + (REDRAW_STEPS if run.guard is not None else 0)
        lo, hi = self.window(x)
        for j in range(budget):
            masked = (x == run.mask_id) & in_block
            if not bool(masked.any()):
                break
            run.stats.steps += 1
            logits = self.logits(x)  # the window's positions
            if run.guard is not None:
                logits = run.guard.apply_bans(logits, offset=lo)
            tokens = draw(logits, s.temperature, s.top_k, s.top_p, run.gen)
            step = min(j, steps - 1)
            masked_here, block_here = masked[:, lo:hi], in_block[:, lo:hi]
            reveal = self.reveal(masked_here, logits, tokens, step, steps)
            hide = self.hide(masked_here, block_here, step, steps)  # among the earlier reveals
            part = torch.where(reveal, tokens, x[:, lo:hi])
            if hide is not None:
                part = part.masked_fill(hide, run.mask_id)
            x = torch.cat([x[:, :lo], part, x[:, hi:]], dim=1)
            if run.guard is not None and j < budget - 1:
                x, in_block = self.mend(x, in_block)
        return x

    def window(self, x: torch.Tensor) -> tuple[int, int]:
        """The positions [lo, hi) a step scores and draws: the whole sequence here (the block
        sampler scores its block alone)."""
        return 0, x.shape[1]

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """(B, hi - lo, V) logits of the window's positions for the running sequence."""
        return self.run.logits(x)

    def mend(self, x: torch.Tensor, in_block: torch.Tensor) -> tuple[Tensor, Tensor]:
        """The repeat guard's repairs: repeats masked again and joined to the block."""
        assert self.run.guard is not None
        return self.run.guard.mend(x, self.run.prompt_len, in_block)


@register_sampler("ancestral")
class Ancestral(Stepwise):
    """Each masked position is revealed with probability (m(t) - m(s)) / m(t)."""

    def fractions(self, j: int, steps: int) -> tuple[float, float]:
        """The schedule's masked fractions m(t), m(s) at step `j`'s two ends."""
        grid = torch.tensor([1 - j / steps, 1 - (j + 1) / steps], dtype=torch.float32)
        m_t, m_s = self.run.schedule.mask_fraction(grid.clamp_min(0.0)).double().tolist()
        return m_t, m_s

    def reveal_probability(self, j: int, steps: int) -> float:
        m_t, m_s = self.fractions(j, steps)
        return 1.0 if j == steps - 1 or m_t <= 0 else (m_t - m_s) / m_t

    def reveal(self, masked: Tensor, logits: Tensor, tokens: Tensor, j: int, steps: int) -> Tensor:
        p = self.reveal_probability(j, steps)
        gen = self.run.gen
        u = torch.rand(masked.shape, generator=gen, device=masked.device, dtype=torch.float64)
        return masked & (u < p)


@register_sampler("remdm", reads=("remask_budget",))
class ReMDM(Ancestral):
    """ReMDM with its capped schedule: the ancestral step, except that a token revealed at an
    earlier step of the block (never the prompt) is masked again with probability
    sigma = min(sample.remask_budget, (1 - a_s) / a_t), a being the unmasked fraction 1 - m,
    and a masked one is revealed with (a_s - (1 - sigma) a_t) / (1 - a_t), which keeps the
    marginals of the reverse process. A budget of 0 is the ancestral sampler, draw for draw;
    the last step masks nothing again and reveals the rest."""

    def sigma(self, j: int, steps: int) -> float:
        """0 at a block's first step (nothing is revealed yet, whatever m(1) says) and last."""
        m_t, m_s = self.fractions(j, steps)
        a_t, a_s = 1.0 - m_t, 1.0 - m_s
        if j == 0 or j == steps - 1 or a_t <= 0:
            return 0.0
        return min(self.run.s.remask_budget, (1.0 - a_s) / a_t)

    def reveal_probability(self, j: int, steps: int) -> float:
        m_t, m_s = self.fractions(j, steps)
        if j == steps - 1 or m_t <= 0:
            return 1.0
        a_t, a_s = 1.0 - m_t, 1.0 - m_s
        return min(1.0, (a_s - (1.0 - self.sigma(j, steps)) * a_t) / m_t)

    def hide(self, masked: Tensor, in_block: Tensor, j: int, steps: int) -> Tensor | None:
        sigma = self.sigma(j, steps)
        if sigma <= 0:
            return None  # no draw: a zero budget leaves the ancestral draws as they were
        gen = self.run.gen
        u = torch.rand(masked.shape, generator=gen, device=masked.device, dtype=torch.float64)
        return in_block & ~masked & (u < sigma)


@register_sampler("confidence", reads=("confidence_threshold",))
class Confidence(Stepwise):
    """Parallel decoding by confidence (Fast-dLLM's threshold rule): each step reveals every
    masked position whose drawn token has at least sample.confidence_threshold probability
    under the rack's own distribution (before temperature, top_k and top_p), and in each row
    at least its most confident one; the last step reveals the rest. Easy
    stretches take few steps, so a generation often needs fewer passes than sample.steps."""

    def reveal(self, masked: Tensor, logits: Tensor, tokens: Tensor, j: int, steps: int) -> Tensor:
        if j == steps - 1:
            return masked
        confidence = rank_scores("low_confidence", logits, tokens, self.run.gen)
        confidence = confidence.masked_fill(~masked, -1.0)
        reveal = masked & (confidence >= self.run.s.confidence_threshold)
        rows = masked.any(-1).nonzero().flatten()
        reveal[rows, confidence[rows].argmax(-1)] = True
        return reveal


@register_sampler("remask", uses_remasking=True)
class Remask(Stepwise):
    """Each step reveals its share of the still-masked positions, ranked by `remasking`."""

    def reveal(self, masked: Tensor, logits: Tensor, tokens: Tensor, j: int, steps: int) -> Tensor:
        return self.run.remask(masked, logits, tokens, steps - j)


@register_sampler("single_pass", needs_chain=True, uses_remasking=True)
class SinglePass(Method):
    """One pass through a rack grown as a denoising chain, revealing after each stack."""

    def fill(self, x: torch.Tensor, p: int, length: int, on_block: Progress | None) -> torch.Tensor:
        run, s, rack = self.run, self.run.s, self.run.rack
        chain = getattr(rack, "chain", None)
        if chain is None or rack.depth_ranges is None:
            raise ValueError(
                "sampler single_pass needs a rack grown as a denoising chain (time as depth with "
                "progressive.depth_order: high_to_low)"
            )
        levels = [r[2] for r in rack.depth_ranges] + [0.0]
        fractions = chain.mask_fraction(torch.tensor(levels)).double().tolist()
        h = rack.embed(x)
        for g, stack in enumerate(rack.stacks):
            if g:
                h = rack.chain_input(h, x)
            h = rack.run_stacks(h, None, [stack])
            masked = x == run.mask_id
            if not bool(masked.any()):
                break
            run.stats.steps += 1
            logits = rack.logits(h).float()
            logits[..., run.banned] = -math.inf
            tokens = draw(logits, s.temperature, s.top_k, s.top_p, run.gen)
            m_t, m_s = fractions[g], fractions[g + 1]
            share = 1.0 if g == len(rack.stacks) - 1 or m_t <= 0 else (m_t - m_s) / m_t
            if s.remasking_set:
                reveal = run.remask(masked, logits, tokens, 1.0 / max(share, 1e-12))
            else:
                u = torch.rand(masked.shape, generator=run.gen, dtype=torch.float64)
                reveal = masked & (u.to(masked.device) < share)
            x = torch.where(reveal, tokens, x)
        run.stats.forward_passes += 1
        run.stats.row_passes += x.shape[0]
        return x
