"""Replies from a fine-tuned Hugging Face model: the question rendered with the run's chat
template, then transformers' generate, stopping at EOS or the end-of-turn token."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def reply(
    model: nn.Module,
    tokenizer: Any,
    question: str | list[dict],
    sample: Any,
    seed: int = 0,
) -> str:
    """One assistant reply to `question` (text, or a conversation so far) under the sampling
    settings `sample` (the run's sample.*, with any generate flags already applied)."""
    from stackwise.chat.labels import prompt_ids
    from stackwise.hf.outputs import generation_config

    messages = [{"role": "user", "content": question}] if isinstance(question, str) else question
    ids = torch.tensor([prompt_ids(tokenizer, messages)])
    device = next(model.parameters()).device
    gen = generation_config(model, tokenizer)
    gen.max_new_tokens, gen.use_cache = sample.max_new_tokens, True
    gen.do_sample = sample.temperature > 0
    if gen.do_sample:
        gen.temperature, gen.top_p = sample.temperature, sample.top_p
        gen.top_k = sample.top_k or None
    else:
        gen.temperature = gen.top_p = gen.top_k = None
    torch.manual_seed(seed)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        out = model.generate(
            input_ids=ids.to(device),
            attention_mask=torch.ones_like(ids).to(device),
            generation_config=gen,
        )
    model.train(was_training)
    return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


def questions(data: Any, n: int, prompt: str) -> list[list[dict]]:
    """What to ask at the end of a run: sample.prompt, else the evaluation rows' conversations
    up to their last reply."""
    if prompt:
        return [[{"role": "user", "content": prompt}]] * n
    stats = getattr(data, "eval_chat", None)
    return list(stats.prompts[:n]) if stats is not None else []
