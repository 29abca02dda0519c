"""Sampling from a trained rack: left to right for causal racks, by unmasking for masked ones.

The masked samplers live in `stackwise.samplers`; this package picks one from the plan's
SampleSpec (plan.sample), with any setting given by keyword recorded as the caller's. Keyword
settings are not validated here: the door that takes them from a user checks them first
(`stackwise generate` through the config's rules). `causal` samples token by token, `masked`
builds the masked sampler, `prompt` reads prompts in and streams text out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from stackwise.errors import StackWiseError
from stackwise.generate.causal import generate_clm
from stackwise.generate.masked import masked_sampler, masked_settings, repeat_guard
from stackwise.generate.prompt import TextStream, prompt_ids, unknown_characters
from stackwise.model.rack import Rack
from stackwise.objectives.base import Specials
from stackwise.registry import OBJECTIVES
from stackwise.samplers import Progress, SampleStats, truncate_at_eos
from stackwise.spec import Plan, SampleSpec

if TYPE_CHECKING:
    from stackwise.data.plain_tokenizer import AnyTokenizer

__all__ = [
    "Samples",
    "TextStream",
    "chat_reply",
    "generate",
    "generate_clm",
    "masked_sampler",
    "masked_settings",
    "prompt_ids",
    "repeat_guard",
    "sample_spec",
    "sample_texts",
    "unknown_characters",
]


@dataclass
class Samples:
    texts: list[str]
    ids: torch.Tensor
    prompt_len: int
    stats: SampleStats = field(default_factory=SampleStats)


def sample_spec(plan: Plan, overrides: dict[str, Any]) -> SampleSpec:
    """plan.sample with `overrides` (those not None) applied and recorded as asked for."""
    updates = {k: v for k, v in overrides.items() if v is not None}
    if updates.get("sampler") == "auto":  # as at the door: the objective's own sampler
        updates["sampler"] = OBJECTIVES.capabilities(plan.objective.name).default_sampler
    return plan.sample.with_changes(**updates) if updates else plan.sample


def generate(
    plan: Plan,
    rack: Rack,
    tokenizer: AnyTokenizer,
    *,
    prompt: str | None = None,
    seed: int = 0,
    n: int | None = None,
    stream: Callable[[str], None] | None = None,
    **overrides: object,
) -> Samples:
    """`n` samples with the settings of plan.sample (any of them overridable by keyword, taken
    as checked; every option is a keyword, so a value is never taken for the wrong one).
    With `stream`, the first sample's text is passed to it piece by piece as it is made:
    token by token from a causal rack, block by block (sample.block_length) from a masked one."""
    from stackwise.data.pack import specials_of

    s = sample_spec(plan, overrides)
    n = s.num_samples if n is None else n
    if n < 1:
        raise StackWiseError(f"The number of samples must be at least 1 (got {n}).")
    dev = next(rack.parameters()).device
    gen = torch.Generator(device=dev).manual_seed(seed)
    text = s.prompt if prompt is None else prompt
    asked = overrides.get("max_new_tokens") is not None
    ids, room = _prompt_rows(plan, rack, tokenizer, s, text, n, asked, dev)
    specials = specials_of(tokenizer)
    shown = TextStream(tokenizer, stream, specials.eos_id, ids.shape[1]) if stream else None
    progress = shown.update if shown else None
    out, stats = _completed(plan, rack, tokenizer, s, ids, room, gen, specials, progress)
    texts = [tokenizer.decode(row.tolist(), skip_special_tokens=True) for row in out]
    if shown is not None:
        shown.finish(texts[0])
    return Samples(texts, out, ids.shape[1], stats)


def _prompt_rows(
    plan: Plan,
    rack: Rack,
    tokenizer: AnyTokenizer,
    s: SampleSpec,
    text: str,
    n: int,
    asked: bool,
    dev: torch.device,
) -> tuple[torch.Tensor, int]:
    """The prompt's ids in `n` rows, and the room the context leaves after it; a masked rack
    fills the whole context at once, so max_new_tokens, when `asked`, must fit that room."""
    causal = plan.objective.causal
    # block diffusion (shifted) predicts each token from the one before, as a causal rack
    # does: an EOS opens an empty prompt (training text follows EOS boundaries either way)
    after_token = causal or rack.block_size is not None
    prefix = prompt_ids(after_token, tokenizer, text, rack.cfg.max_seq_len)
    room = rack.cfg.max_seq_len - len(prefix)
    if not causal and asked and s.max_new_tokens > room:
        raise StackWiseError(
            f"max_new_tokens={s.max_new_tokens} does not fit: a masked rack's generation stays "
            f"inside its context ({rack.cfg.max_seq_len} tokens), and the prompt takes "
            f"{len(prefix)}. Ask for at most {room} new tokens."
        )
    return torch.tensor([prefix] * n, device=dev, dtype=torch.long).view(n, len(prefix)), room


def _completed(
    plan: Plan,
    rack: Rack,
    tokenizer: AnyTokenizer,
    s: SampleSpec,
    ids: torch.Tensor,
    room: int,
    gen: torch.Generator,
    specials: Specials,
    progress: Progress | None,
) -> tuple[torch.Tensor, SampleStats]:
    """The rows completed in eval mode (the rack's mode restored after): token by token from a
    causal rack, else by the masked sampler over the room left."""
    stats = SampleStats()
    was_training = rack.training
    rack.eval()
    with torch.no_grad():
        if plan.objective.causal:
            out = generate_clm(
                rack, ids, s.max_new_tokens, s, gen, specials.eos_id, stats, on_token=progress
            )
        else:
            sampler = masked_sampler(plan, s, rack, tokenizer, gen)
            length = min(s.max_new_tokens, room)  # the run's own setting is fitted to the room
            out = sampler.run(ids, length, on_block=progress)
            out = truncate_at_eos(out, ids.shape[1], specials.eos_id, specials.mask_id)
            stats = sampler.stats
    rack.train(was_training)
    return out, stats


def chat_reply(
    plan: Plan,
    rack: Rack,
    tokenizer: AnyTokenizer,
    messages: list[dict],
    seed: int = 0,
    **overrides: object,
) -> str:
    """A rack trained on instruction rows answers `messages`: the conversation rendered with
    its chat template up to the assistant header is the prompt; the reply ends at EOS."""
    from stackwise.chat.template import render

    prompt = render(tokenizer, messages, generation_prompt=True)
    out = generate(plan, rack, tokenizer, prompt=prompt, n=1, seed=seed, **overrides)
    return tokenizer.decode(out.ids[0, out.prompt_len :].tolist(), skip_special_tokens=True)


def sample_texts(*args: Any, **kwargs: Any) -> list[str]:
    """The decoded texts of `generate` (same arguments)."""
    return generate(*args, **kwargs).texts
