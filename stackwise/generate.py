"""Sampling from a trained rack: left to right for causal racks, by unmasking for masked ones.

The masked samplers live in `stackwise.samplers`; this module picks one from the plan's
SampleSpec (plan.sample), with any setting given by keyword recorded as the caller's. Keyword
settings are not validated here: the door that takes them from a user checks them first
(`stackwise generate` through the config's rules).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from stackwise.errors import StackWiseError
from stackwise.model.layers import KVCache
from stackwise.model.rack import Rack
from stackwise.objectives import objective_from
from stackwise.objectives.diffusion import Diffusion
from stackwise.repeat_guard import WordRepeatGuard
from stackwise.samplers import (
    MaskedSampler,
    MaskedSampling,
    Progress,
    SampleStats,
    draw,
    truncate_at_eos,
)
from stackwise.spec import Plan, SampleSpec


@torch.no_grad()
def generate_clm(
    rack: Rack,
    ids: torch.Tensor,
    max_new: int,
    s: SampleSpec,
    gen: torch.Generator,
    eos_id: int | None = None,
    stats: SampleStats | None = None,
    use_cache: bool = True,
    on_token: Progress | None = None,
) -> torch.Tensor:
    """Token by token with a KV cache (each token costs one position's compute); the context is
    the last max_seq_len tokens. Stops once every row has produced EOS."""
    stats = stats if stats is not None else SampleStats()
    done = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
    start, window = ids.shape[1], rack.cfg.max_seq_len
    cache: KVCache | None = None
    for _ in range(max_new):
        if not use_cache:
            logits = rack(ids[:, -window:])[:, -1].float()
        elif cache is not None and cache.length < window:  # room for the newest token
            logits = rack(ids[:, -1:], cache=cache)[:, -1].float()
        else:  # the first pass, or the window moved on: fill the cache afresh
            cache = KVCache()
            logits = rack(ids[:, -window:], cache=cache)[:, -1].float()
        stats.forward_passes += 1
        nxt = draw(logits, s.temperature, s.top_k, s.top_p, gen)
        ids = torch.cat([ids, nxt[:, None]], dim=1)
        if on_token is not None:
            on_token(ids)
        stats.tokens += int((~done).sum())
        if eos_id is not None:
            done |= nxt == eos_id
            if bool(done.all()):
                break
    return truncate_at_eos(ids, start, eos_id, eos_id if eos_id is not None else 0)


@dataclass
class Samples:
    texts: list[str]
    ids: torch.Tensor
    prompt_len: int
    stats: SampleStats = field(default_factory=SampleStats)


def repeat_guard(tokenizer: PreTrainedTokenizerBase, mask_id: int) -> WordRepeatGuard:
    pieces = [tokenizer.decode([i], skip_special_tokens=True) for i in range(len(tokenizer))]
    return WordRepeatGuard.from_pieces(pieces, mask_id)


def sample_spec(plan: Plan, overrides: dict[str, Any]) -> SampleSpec:
    """plan.sample with `overrides` (those not None) applied and recorded as asked for."""
    updates = {k: v for k, v in overrides.items() if v is not None}
    return plan.sample.with_changes(**updates) if updates else plan.sample


def masked_settings(s: SampleSpec) -> MaskedSampling:
    return MaskedSampling(
        sampler=s.sampler,
        remasking=s.remasking,
        steps=s.steps,
        block_length=s.block_length,
        temperature=s.temperature,
        top_k=s.top_k,
        top_p=s.top_p,
        remasking_set=s.changed("remasking"),
    )


def masked_sampler(
    plan: Plan,
    s: SampleSpec,
    rack: Rack,
    tokenizer: PreTrainedTokenizerBase,
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


def unknown_characters(tokenizer: PreTrainedTokenizerBase, prompt: str, ids: list[int]) -> None:
    """Say on stderr which characters of a prompt the vocabulary lacks: they become <unk>,
    which the shown text leaves out, so they would vanish without a word."""
    unk = tokenizer.unk_token_id
    if unk is None or unk not in ids:
        return
    lost = [
        c
        for c in dict.fromkeys(prompt)
        if unk in tokenizer(c, add_special_tokens=False)["input_ids"]
    ]
    named = f"characters {' '.join(map(repr, lost))} are" if lost else "text is partly"
    print(
        f"stackwise: warning: the prompt's {named} not in the tokenizer's vocabulary (the "
        "training text never had them), so the rack reads them as <unk> and the output "
        "leaves them out.",
        file=sys.stderr,
    )


def prompt_ids(
    causal: bool, tokenizer: PreTrainedTokenizerBase, prompt: str, context: int
) -> list[int]:
    """The prompt's ids (an EOS for an empty causal prompt); refused if it fills the context."""
    prefix = tokenizer(prompt, add_special_tokens=False)["input_ids"] if prompt else []
    unknown_characters(tokenizer, prompt, prefix)
    if causal and not prefix:
        prefix = [tokenizer.eos_token_id]  # training text follows an EOS document boundary
    if len(prefix) >= context:
        raise StackWiseError(
            f"The prompt is {len(prefix)} tokens long and this rack's context is {context}: "
            "nothing would be left to generate, and a prompt is never cut silently. Shorten it."
        )
    return prefix


def generate(
    plan: Plan,
    rack: Rack,
    tokenizer: PreTrainedTokenizerBase,
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

    s, causal = sample_spec(plan, overrides), plan.objective.causal
    n = s.num_samples if n is None else n
    if n < 1:
        raise StackWiseError(f"The number of samples must be at least 1 (got {n}).")
    dev = next(rack.parameters()).device
    gen = torch.Generator(device=dev).manual_seed(seed)
    prefix = prompt_ids(
        causal, tokenizer, s.prompt if prompt is None else prompt, rack.cfg.max_seq_len
    )
    room = rack.cfg.max_seq_len - len(prefix)
    asked = overrides.get("max_new_tokens") is not None
    if not causal and asked and s.max_new_tokens > room:
        raise StackWiseError(
            f"max_new_tokens={s.max_new_tokens} does not fit: a masked rack fills its whole "
            f"context ({rack.cfg.max_seq_len} tokens) at once, and the prompt takes "
            f"{len(prefix)}. Ask for at most {room} new tokens."
        )
    ids = torch.tensor([prefix] * n, device=dev, dtype=torch.long).view(n, len(prefix))
    specials = specials_of(tokenizer)
    stats = SampleStats()
    was_training = rack.training
    rack.eval()
    shown = TextStream(tokenizer, stream, specials.eos_id, len(prefix)) if stream else None
    progress = shown.update if shown else None
    with torch.no_grad():
        if causal:
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
    texts = [tokenizer.decode(row.tolist(), skip_special_tokens=True) for row in out]
    if shown is not None:
        shown.finish(texts[0])
    return Samples(texts, out, ids.shape[1], stats)


class TextStream:
    """Writes the first row's text as it grows: only what extends what was already written,
    so a piece that decodes differently once the next token arrives is held back, and the
    finished text (cut at EOS) ends it."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        write: Callable[[str], None],
        eos: int | None,
        prompt_len: int,
    ) -> None:
        self.tokenizer, self.write, self.eos, self.written = tokenizer, write, eos, ""
        self.prompt_len = prompt_len  # EOS counts only after the prompt, as truncate_at_eos

    def update(self, ids: torch.Tensor) -> None:
        row = ids[0].tolist()
        if self.eos is not None and self.eos in row[self.prompt_len :]:
            row = row[: row.index(self.eos, self.prompt_len)]
        text = self.tokenizer.decode(row, skip_special_tokens=True)
        if text.startswith(self.written) and not text.endswith("\ufffd"):
            self.write(text[len(self.written) :])
            self.written = text

    def finish(self, text: str) -> None:
        if text.startswith(self.written):
            self.write(text[len(self.written) :])
        else:  # the end changed what was already shown: show the whole text again
            self.write("\n" + text)
        self.written = text


def chat_reply(
    plan: Plan,
    rack: Rack,
    tokenizer: PreTrainedTokenizerBase,
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
