"""Samplers for masked racks (mlm and diffusion): start from masks after the prompt, unmask.

- `ancestral`: the MDLM reverse process. Going from t to s < t, each masked position is revealed
  with probability (m(t) - m(s)) / m(t), m being the schedule's mask fraction, with a token drawn
  from the model. A step that reveals nothing in a row leaves that row unchanged, so its logits
  are reused instead of recomputed (exact: the time input is derived from the masked fraction);
  only the rows that changed run through the rack.
- `remask` (LLaDA/Dream style): each step reveals its share of the still-masked positions, the
  ones ranked first by `remasking`: `low_confidence` (highest probability of the drawn token),
  `random`, `entropy` (lowest predictive entropy) or `margin` (largest top-1 minus top-2).

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
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from stackwise.objectives.schedules import Linear, Schedule, time_for_fraction
from stackwise.registry import SAMPLERS, register_sampler
from stackwise.repeat_guard import WordRepeatGuard

REMASKING = ("low_confidence", "random", "entropy", "margin")
Progress = Callable[[torch.Tensor], None]  # sees (B, n) tokens generated so far, for streaming
REDRAW_STEPS = 8  # a block's extra steps for words the repeat guard masked again


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


@dataclass
class SampleStats:
    forward_passes: int = 0  # calls of the rack (a batch of rows each)
    steps: int = 0
    tokens: int = 0
    row_passes: int = 0  # rows computed over all calls: the work done


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Keep the top_k logits, then the smallest set whose probability reaches top_p."""
    if top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[..., -1:]
        logits = logits.masked_fill(logits < kth, -math.inf)
    if top_p < 1.0:
        sorted_logits, idx = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(-1)
        drop = probs.cumsum(-1) - probs > top_p
        sorted_logits = sorted_logits.masked_fill(drop, -math.inf)
        logits = torch.full_like(logits, -math.inf).scatter(-1, idx, sorted_logits)
    return logits


def draw(
    logits: torch.Tensor, temperature: float, top_k: int, top_p: float, gen: torch.Generator
) -> torch.Tensor:
    """Tokens from softmax(logits / temperature), filtered, drawn in float64; argmax at T=0."""
    logits = filter_logits(logits.double(), top_k, top_p)
    if temperature == 0:
        return logits.argmax(-1)
    probs = (logits / temperature).softmax(-1)
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=gen).view(probs.shape[:-1])


def rank_scores(rule: str, logits: Tensor, tokens: Tensor, gen: torch.Generator) -> Tensor:
    """Higher = reveal first."""
    if rule == "random":
        return torch.rand(tokens.shape, generator=gen, device=tokens.device, dtype=torch.float64)
    probs = logits.double().softmax(-1)
    if rule == "low_confidence":
        return probs.gather(-1, tokens[..., None]).squeeze(-1)
    if rule == "entropy":
        return (probs * probs.clamp_min(1e-30).log()).sum(-1)  # minus the entropy
    if rule == "margin":
        top2 = probs.topk(2, dim=-1).values
        return top2[..., 0] - top2[..., 1]
    raise ValueError(f"unknown remasking rule {rule!r}; use one of {REMASKING}")


def split_steps(steps: int, blocks: int) -> list[int]:
    """Each block's share of the steps (at least one each)."""
    base, extra = divmod(max(steps, blocks), blocks)
    return [base + (1 if i < extra else 0) for i in range(blocks)]


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


class Method:
    """A registered sampler: fills the masked part of `x` for one run (`self.run`)."""

    def __init__(self, run: MaskedSampler) -> None:
        self.run = run

    def fill(self, x: torch.Tensor, p: int, length: int, on_block: Progress | None) -> torch.Tensor:
        raise NotImplementedError


class Stepwise(Method):
    """Blocks left to right over their share of the steps; `reveal` picks each step's."""

    def reveal(self, masked: Tensor, logits: Tensor, tokens: Tensor, j: int, steps: int) -> Tensor:
        raise NotImplementedError

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
        for j in range(budget):
            masked = (x == run.mask_id) & in_block
            if not bool(masked.any()):
                break
            run.stats.steps += 1
            logits = run.logits(x)
            if run.guard is not None:
                logits = run.guard.apply_bans(logits)
            tokens = draw(logits, s.temperature, s.top_k, s.top_p, run.gen)
            reveal = self.reveal(masked, logits, tokens, min(j, steps - 1), steps)
            x = torch.where(reveal, tokens, x)
            if run.guard is not None and j < budget - 1:
                x, in_block = run.guard.mend(x, run.prompt_len, in_block)
        return x


@register_sampler("ancestral")
class Ancestral(Stepwise):
    """Each masked position is revealed with probability (m(t) - m(s)) / m(t)."""

    def reveal(self, masked: Tensor, logits: Tensor, tokens: Tensor, j: int, steps: int) -> Tensor:
        grid = torch.tensor([1 - j / steps, 1 - (j + 1) / steps], dtype=torch.float32)
        m_t, m_s = self.run.schedule.mask_fraction(grid.clamp_min(0.0)).double().tolist()
        p = 1.0 if j == steps - 1 or m_t <= 0 else (m_t - m_s) / m_t
        gen = self.run.gen
        u = torch.rand(masked.shape, generator=gen, device=masked.device, dtype=torch.float64)
        return masked & (u < p)


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


def truncate_at_eos(x: torch.Tensor, start: int, eos_id: int | None, fill: int) -> torch.Tensor:
    """Everything after the first EOS of the generated part becomes `fill` (dropped on decode)."""
    if eos_id is None:
        return x
    gen_part = x[:, start:]
    seen = (gen_part == eos_id).int().cumsum(1)
    after = (seen - (gen_part == eos_id).int()) > 0
    out = x.clone()
    out[:, start:] = gen_part.masked_fill(after, fill)
    return out
