"""Which tokens of a rendered conversation are training targets.

Each message covers a span of the rendered text: a header, its content, then the end of its
turn (the template's end-of-turn token and what follows). Assistant spans come from the
template's `{% generation %}` markers when it has them; otherwise from rendering the
conversation prefix by prefix, which needs no markers: message i spans from the end of the
first i messages (with the assistant header, for a reply) to the end of the first i + 1.
Tokens are then marked by the character where they start, so one tokenizer pass serves both
the ids and the labels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stackwise.chat.template import has_generation_spans, render
from stackwise.errors import StackWiseError

Span = tuple[int, int]


@dataclass
class Turn:
    role: str
    content: Span
    end: Span  # the end-of-turn marker(s) after the content


@dataclass
class Tokenized:
    ids: list[int]
    supervised: list[bool]
    truncated: bool


def _split(full: str, role: str, text: str, start: int, end: int) -> Turn:
    """A message's span cut where its content ends (the template may trim the content)."""
    body = text.strip()
    found = full.find(body, start, end) if body else -1
    stop = found + len(body) if found >= 0 else end
    return Turn(role, (start, stop), (stop, end))


def prefix_turns(tokenizer: Any, messages: list[dict], index: int | str) -> list[Turn]:
    """Every message's span by rendering prefixes; refuses a template that rewrites history."""
    full = render(tokenizer, messages)
    turns, before = [], render(tokenizer, [])
    for i, m in enumerate(messages):
        start = len(before)
        if m["role"] == "assistant":
            start = len(render(tokenizer, messages[:i], generation_prompt=True))
        after = render(tokenizer, messages[: i + 1])
        if not full.startswith(after) or start > len(after):
            raise StackWiseError(
                f"Example {index}: the chat template renders the first {i + 1} messages "
                "differently from the start of the whole conversation, so assistant turns "
                "cannot be located by prefix. Give data.chat_template a template with "
                "{% generation %} markers around assistant replies."
            )
        turns.append(_split(full, m["role"], m["content"], start, len(after)))
        before = after
    return turns


def marked_turns(
    tokenizer: Any, messages: list[dict], offsets: list[Span], index: int | str
) -> list[Turn]:
    """Assistant spans from `{% generation %}` markers, matched to the replies in order."""
    out = tokenizer.apply_chat_template(
        messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    mask = out["assistant_masks"]
    runs: list[Span] = []
    for t, on in enumerate(mask):
        if not on or t >= len(offsets):
            continue
        if runs and runs[-1][1] == t:
            runs[-1] = (runs[-1][0], t + 1)
        else:
            runs.append((t, t + 1))
    replies = [m for m in messages if m["role"] == "assistant"]
    if len(runs) != len(replies):
        raise StackWiseError(
            f"Example {index}: the chat template's {{% generation %}} markers give {len(runs)} "
            f"spans for {len(replies)} assistant replies. Fix the template's markers."
        )
    full = render(tokenizer, messages)
    return [
        _split(full, "assistant", m["content"], offsets[a][0], offsets[b - 1][1])
        for m, (a, b) in zip(replies, runs, strict=True)
    ]


def _turns(
    tokenizer: Any, messages: list[dict], offsets: list[Span], index: int | str, every_turn: bool
) -> list[Turn]:
    """Replies from the template's markers when it has them; the other turns (needed when every
    turn is trained, or every turn's end) by prefix rendering."""
    if not has_generation_spans(tokenizer):
        return prefix_turns(tokenizer, messages, index)
    replies = iter(marked_turns(tokenizer, messages, offsets, index))
    if not every_turn:
        return list(replies)
    return [
        next(replies) if t.role == "assistant" else t
        for t in prefix_turns(tokenizer, messages, index)
    ]


def chosen_spans(turns: list[Turn], train_on: str, train_on_eos: str) -> list[Span]:
    """The character spans trained on under data.train_on and data.train_on_eos."""
    replies = [t for t in turns if t.role == "assistant"]
    trained = {"all": turns, "last_turn": replies[-1:], "assistant": replies}[train_on]
    if train_on == "all" and turns:  # every token, headers included, less the turn ends
        body = _minus((0, turns[-1].end[1]), [t.end for t in turns])
    else:
        body = [t.content for t in trained]
    ends = {
        "turn": [t.end for t in trained],
        "last": [t.end for t in replies[-1:]],
        "all": [t.end for t in turns],
        "none": [],
    }[train_on_eos]
    return body + ends


def _minus(whole: Span, holes: list[Span]) -> list[Span]:
    out, pos = [], whole[0]
    for a, b in sorted(holes):
        if a > pos:
            out.append((pos, a))
        pos = max(pos, b)
    if pos < whole[1]:
        out.append((pos, whole[1]))
    return out


def tokenize_conversation(
    tokenizer: Any,
    messages: list[dict],
    index: int | str,
    train_on: str,
    train_on_eos: str,
    max_length: int,
) -> Tokenized:
    """Ids and target marks of one conversation: rendered and tokenized in one pass, with
    exactly one BOS (the template's, or the tokenizer's own when the template has none)."""
    full = render(tokenizer, messages)
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]
    turns = _turns(tokenizer, messages, offsets, index, train_on == "all" or train_on_eos == "all")
    spans = chosen_spans(turns, train_on, train_on_eos)
    supervised = [any(a <= s < b for a, b in spans) for s, _ in offsets]
    bos = tokenizer.bos_token_id
    if bos is not None and adds_bos(tokenizer) and (not ids or ids[0] != bos):
        ids, supervised = [bos, *ids], [False, *supervised]
    truncated = len(ids) > max_length
    return Tokenized(ids[:max_length], supervised[:max_length], truncated)


def adds_bos(tokenizer: Any) -> bool:
    """Whether this tokenizer puts BOS in front of plain text (so a model expects one)."""
    cached = getattr(tokenizer, "_stackwise_adds_bos", None)
    if cached is None:
        probe = tokenizer("a")["input_ids"]
        cached = bool(probe) and probe[0] == tokenizer.bos_token_id
        tokenizer._stackwise_adds_bos = cached
    return cached


def prompt_ids(tokenizer: Any, messages: list[dict]) -> list[int]:
    """The ids a reply is generated after: the conversation with the assistant header,
    tokenized exactly as training tokenized it (one pass, BOS as in training)."""
    ids = list(
        tokenizer(render(tokenizer, messages, generation_prompt=True), add_special_tokens=False)[
            "input_ids"
        ]
    )
    bos = tokenizer.bos_token_id
    if bos is not None and adds_bos(tokenizer) and (not ids or ids[0] != bos):
        ids = [bos, *ids]
    return ids
