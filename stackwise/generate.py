"""Sampling from a trained rack.

clm: autoregressive with temperature, top-k and top-p. mlm/diffusion: start from masks and
unmask the most confident predictions a few at a time, as in MDLM/LLaDA samplers.
"""

from __future__ import annotations

import math

import torch
from transformers import PreTrainedTokenizerBase

from stackwise.config import Config
from stackwise.model.rack import Rack
from stackwise.objectives import build_objective
from stackwise.objectives.diffusion import Diffusion
from stackwise.objectives.schedules import time_for_fraction


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    if top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[..., -1:]
        logits = logits.masked_fill(logits < kth, -math.inf)
    if top_p < 1.0:
        sorted_logits, idx = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(-1)
        drop = probs.cumsum(-1) - probs > top_p  # keep the smallest prefix reaching top_p
        sorted_logits = sorted_logits.masked_fill(drop, -math.inf)
        logits = torch.full_like(logits, -math.inf).scatter(-1, idx, sorted_logits)
    return logits


def _pick(logits: torch.Tensor, temperature: float, gen: torch.Generator) -> torch.Tensor:
    if temperature == 0:
        return logits.argmax(-1)
    probs = (logits / temperature).softmax(-1)
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=gen).view(probs.shape[:-1])


@torch.no_grad()
def generate_clm(
    rack: Rack,
    ids: torch.Tensor,
    max_new: int,
    temperature: float,
    top_k: int,
    top_p: float,
    gen: torch.Generator,
    eos_id: int | None = None,
) -> torch.Tensor:
    for _ in range(max_new):
        logits = rack(ids[:, -rack.cfg.max_seq_len :])[:, -1].float()
        nxt = _pick(filter_logits(logits, top_k, top_p), temperature, gen)
        ids = torch.cat([ids, nxt[:, None]], dim=1)
        if eos_id is not None and bool((nxt == eos_id).all()):
            break
    return ids


@torch.no_grad()
def generate_masked(
    rack: Rack,
    ids: torch.Tensor,
    length: int,
    steps: int,
    temperature: float,
    gen: torch.Generator,
    mask_id: int,
    banned: list[int],
    diffusion: Diffusion | None = None,
) -> torch.Tensor:
    """Fill `length` masks after the prompt, unmasking by confidence over `steps` rounds."""
    b = ids.shape[0]
    room = rack.cfg.max_seq_len - ids.shape[1]
    length = max(1, min(length, room))
    x = torch.cat([ids, torch.full((b, length), mask_id, device=ids.device)], dim=1)
    for s in range(steps):
        masked = x == mask_id
        remaining = int(masked.sum(1).max())
        if remaining == 0:
            break
        t = None
        if rack.uses_time:
            frac = masked.float().sum(1) / x.shape[1]
            sched = diffusion.schedule if diffusion is not None else None
            t = time_for_fraction(sched, frac) if sched is not None else frac
        logits = rack(x, t=t).float()
        logits[..., banned] = -math.inf
        tokens = _pick(logits, temperature, gen)
        conf = logits.softmax(-1).gather(-1, tokens[..., None]).squeeze(-1)
        conf = conf.masked_fill(~masked, -1.0)
        k = math.ceil(remaining / (steps - s))
        top = conf.topk(k, dim=1).indices
        chosen = torch.zeros_like(masked).scatter(1, top, True) & masked
        x = torch.where(chosen, tokens, x)
    return x


def sample_texts(
    config: Config,
    rack: Rack,
    tokenizer: PreTrainedTokenizerBase,
    prompt: str | None = None,
    n: int | None = None,
    seed: int = 0,
    **overrides: float | int,
) -> list[str]:
    """Decode `n` samples with the settings of config.sample (overridable by keyword)."""
    from stackwise.data.pack import specials_of

    s = config.sample.model_copy(update={k: v for k, v in overrides.items() if v is not None})
    n = s.num_samples if n is None else n
    prompt = s.prompt if prompt is None else prompt
    dev = next(rack.parameters()).device
    gen = torch.Generator(device=dev).manual_seed(seed)
    prefix = tokenizer(prompt, add_special_tokens=False)["input_ids"] if prompt else []
    if config.objective.causal and not prefix:
        prefix = [tokenizer.eos_token_id]  # training text follows an EOS document boundary
    ids = torch.tensor([prefix] * n, device=dev, dtype=torch.long).view(n, len(prefix))
    was_training = rack.training
    rack.eval()
    if config.objective.causal:
        out = generate_clm(
            rack, ids, s.max_new_tokens, s.temperature, s.top_k, s.top_p, gen, eos_id=None
        )
    else:
        specials = specials_of(tokenizer)
        obj = build_objective(config, specials)
        banned = [i for i in (specials.mask_id, specials.pad_id, specials.bos_id) if i is not None]
        out = generate_masked(
            rack,
            ids,
            s.max_new_tokens,
            s.steps,
            s.temperature,
            gen,
            specials.mask_id,
            banned,
            obj if isinstance(obj, Diffusion) else None,
        )
    rack.train(was_training)
    return [tokenizer.decode(row.tolist(), skip_special_tokens=True) for row in out]
