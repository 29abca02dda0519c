"""The masked sampler a SampleSpec describes for a plan's objective (mlm or diffusion)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from stackwise.model.rack import Rack
from stackwise.objectives import objective_from
from stackwise.objectives.diffusion import Diffusion
from stackwise.repeat_guard import WordRepeatGuard
from stackwise.samplers import MaskedSampler, MaskedSampling
from stackwise.spec import Plan, SampleSpec

if TYPE_CHECKING:
    from stackwise.data.plain_tokenizer import AnyTokenizer


def repeat_guard(tokenizer: AnyTokenizer, mask_id: int) -> WordRepeatGuard:
    """The guard that redraws a word repeating the one before it (sample.no_repeat_words)."""
    pieces = [tokenizer.decode([i], skip_special_tokens=True) for i in range(len(tokenizer))]
    return WordRepeatGuard.from_pieces(pieces, mask_id)


def masked_settings(s: SampleSpec) -> MaskedSampling:
    """The sample settings the masked sampler reads."""
    return MaskedSampling(
        sampler=s.sampler,
        remasking=s.remasking,
        steps=s.steps,
        block_length=s.block_length,
        temperature=s.temperature,
        top_k=s.top_k,
        top_p=s.top_p,
        remasking_set=s.changed("remasking"),
        confidence_threshold=s.confidence_threshold,
        remask_budget=s.remask_budget,
    )


def masked_sampler(
    plan: Plan,
    s: SampleSpec,
    rack: Rack,
    tokenizer: AnyTokenizer,
    gen: torch.Generator,
) -> MaskedSampler:
    """The masked sampler `s` describes for plan's objective, with the specials of `tokenizer`
    banned."""
    from stackwise.data.pack import specials_of

    specials = specials_of(tokenizer)
    obj = objective_from(plan.objective, plan.masking, specials)
    banned = [i for i in (specials.mask_id, specials.pad_id, specials.bos_id) if i is not None]
    return MaskedSampler(
        rack,
        masked_settings(s),
        specials.mask_id,
        banned,
        gen,
        obj.schedule if isinstance(obj, Diffusion) else None,
        specials.eos_id,
        guard=repeat_guard(tokenizer, specials.mask_id) if s.no_repeat_words else None,
    )
