"""Instruction data: conversations -> token ids with target marks -> (optionally packed) rows.

Rows keep their own lengths; the collate function pads each batch to its longest row and masks
padding by position (never by token id, so pad = eos is safe). Packed rows hold several
examples back to back, with `position_ids` restarting at each, and no attention mask: the model
then attends within each example only (transformers builds a block-diagonal mask from the
position restarts on every backend). The first token of every example is never a target, so
packed and unpacked batches score exactly the same tokens.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import Dataset

from stackwise.chat.formats import READS, detect_format, to_messages
from stackwise.chat.labels import tokenize_conversation
from stackwise.chat.sources import ORIGIN
from stackwise.data.sources import text_field_given
from stackwise.errors import StackWiseError

IGNORE = -100


UNKNOWN_SHARE = 0.01  # from this share of unknown target tokens on, the run header says so


@dataclass
class ChatStats:
    format: str = ""
    examples: int = 0
    truncated: int = 0
    dropped: int = 0
    tokens: int = 0
    supervised: int = 0
    unknown: int = 0  # target tokens the tokenizer could only write as its unknown token
    prompts: list[list[dict]] = field(default_factory=list)  # a few, to sample replies to

    def line(self) -> str:
        """What became of the data, for the run header."""
        parts = [f"{self.examples:,} {self.format} examples", f"{self.supervised:,} target tokens"]
        if self.truncated:
            parts.append(f"{self.truncated:,} cut at data.seq_len")
        if self.dropped:
            parts.append(f"{self.dropped:,} dropped with no target token")
        if self.supervised and self.unknown / self.supervised >= UNKNOWN_SHARE:
            parts.append(
                f"{self.unknown / self.supervised:.0%} of the target tokens unknown to the "
                "tokenizer (it learns to write its unknown token there; a tokenizer trained "
                "on text with these characters, or data.tokenizer: byte, knows them)"
            )
        return ", ".join(parts)


class ChatRows(Dataset):
    """Rows of token ids with labels (IGNORE where not a target); packed rows also carry
    position_ids. `collate` pads a batch to its longest row; with `padding_free` it first lays
    the batch's rows end to end in as few rows as that longest one holds, so a step sees the
    same examples and targets, and only the padding shrinks."""

    def __init__(
        self,
        rows: list[dict[str, torch.Tensor]],
        pad_id: int,
        packed: bool,
        padding_free: bool = False,
    ) -> None:
        self.rows, self.pad_id, self.packed = rows, pad_id, packed
        self.padding_free = padding_free

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self.rows[i]

    def collate(self, items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        if self.padding_free and len(items) > 1:
            return self._padded([join_rows(items, m) for m in bins_of_batch(items)], True)
        return self._padded(items, self.packed)

    def _padded(
        self, items: list[dict[str, torch.Tensor]], packed: bool
    ) -> dict[str, torch.Tensor]:
        width = max(len(it["input_ids"]) for it in items)
        n = len(items)
        ids = torch.full((n, width), self.pad_id, dtype=torch.long)
        labels = torch.full((n, width), IGNORE, dtype=torch.long)
        lengths = torch.tensor([len(it["input_ids"]) for it in items])
        out: dict[str, torch.Tensor] = {"input_ids": ids, "labels": labels}
        if packed:  # padding continues as one more "example" of its own
            out["position_ids"] = torch.zeros((n, width), dtype=torch.long)
        for r, it in enumerate(items):
            k = len(it["input_ids"])
            ids[r, :k], labels[r, :k] = it["input_ids"], it["labels"]
            if packed:
                out["position_ids"][r, :k] = it["position_ids"]
                out["position_ids"][r, k:] = torch.arange(width - k)
        real = (torch.arange(width)[None] < lengths[:, None]).long()
        # packed rows attend by position_ids; their end padding is still marked, for routers
        out["real_tokens" if packed else "attention_mask"] = real
        return out


def examples_of(
    rows: list[dict], tokenizer: Any, cfg: Any, stats: ChatStats
) -> list[tuple[list[int], list[int]]]:
    """(ids, labels) per conversation; an example without a target token is an error, or with
    data.drop_unsupervised dropped and counted."""
    fmt = stats.format = _chat_format(rows, cfg)
    own = set(READS.get(fmt, ()))  # text_field may name the columns the format reads
    if fmt != "text" and text_field_given(cfg) and not set(cfg.text_fields) <= own:
        raise StackWiseError(
            f"data.text_field names the fields {', '.join(cfg.text_fields)}, but these rows "
            f"are '{fmt}' conversations, read from {', '.join(sorted(own))}, so it would do "
            "nothing. Remove it (or name those fields), or set data.chat_format: text to "
            "train on its fields joined."
        )
    examples = (_example(raw, index, fmt, tokenizer, cfg, stats) for index, raw in enumerate(rows))
    return [e for e in examples if e is not None]


def _chat_format(rows: list[dict], cfg: Any) -> str:
    """data.chat_format, detected from the first row's keys when auto."""
    if cfg.chat_format != "auto":
        return cfg.chat_format
    return detect_format(sorted(k for k in rows[0] if k != ORIGIN) if rows else [], cfg.text_fields)


def _example(
    raw: dict, index: int, fmt: str, tokenizer: Any, cfg: Any, stats: ChatStats
) -> tuple[list[int], list[int]] | None:
    """One row's (ids, labels), counted in `stats`; None when it is dropped for having no target
    token (an error unless data.drop_unsupervised)."""
    origin = raw.get(ORIGIN)
    row = {k: v for k, v in raw.items() if k != ORIGIN}
    where: int | str = f"{index} ({origin})" if origin else index
    messages = to_messages(row, fmt, where, cfg.text_fields)
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=0)
    if len(stats.prompts) < 8 and last > 0:
        stats.prompts.append(messages[:last])
    tok = tokenize_conversation(
        tokenizer, messages, where, cfg.train_on, cfg.train_on_eos, cfg.seq_len
    )
    labels = [
        t if s and k > 0 else IGNORE
        for k, (t, s) in enumerate(zip(tok.ids, tok.supervised, strict=True))
    ]
    n_targets = sum(x != IGNORE for x in labels)
    if n_targets == 0:
        if not cfg.drop_unsupervised:
            cut = " after data.seq_len cut it" if tok.truncated else ""
            raise StackWiseError(
                f"Example {where} has no target token{cut} under data.train_on: "
                f"{cfg.train_on}, so training on it would learn nothing. Fix the example, "
                "raise data.seq_len, or set data.drop_unsupervised: true to drop such "
                "examples (they are counted in the run header)."
            )
        stats.dropped += 1
        return None
    stats.examples += 1
    stats.truncated += tok.truncated
    stats.tokens += len(tok.ids)
    stats.supervised += n_targets
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is not None:
        stats.unknown += sum(x == unk for x in labels)
    return tok.ids, labels


def best_fit_bins(lengths: list[int], capacity: int) -> list[list[int]]:
    """Best-fit decreasing: indices grouped into bins of at most `capacity` tokens, each item
    into the fullest bin it still fits."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    bins: list[list[int]] = []
    free: list[tuple[int, int]] = []  # (room left, bin index), sorted
    for i in order:
        k = bisect.bisect_left(free, (lengths[i], -1))
        if k < len(free):
            room, b = free.pop(k)
        else:
            room, b = capacity, len(bins)
            bins.append([])
        bins[b].append(i)
        room -= lengths[i]
        if room > 0:
            bisect.insort(free, (room, b))
    return bins


def bins_of_batch(items: list[dict[str, torch.Tensor]]) -> list[list[int]]:
    """The batch's rows grouped into bins no longer than its longest row."""
    lengths = [len(it["input_ids"]) for it in items]
    return [sorted(b) for b in best_fit_bins(lengths, max(lengths))]


def join_rows(items: list[dict[str, torch.Tensor]], members: list[int]) -> dict[str, torch.Tensor]:
    """Rows end to end, positions restarting at each (a packed row's own positions kept)."""
    parts = [items[m] for m in members]
    pos = [it.get("position_ids", torch.arange(len(it["input_ids"]))) for it in parts]
    return {
        "input_ids": torch.cat([it["input_ids"] for it in parts]),
        "labels": torch.cat([it["labels"] for it in parts]),
        "position_ids": torch.cat(pos),
    }


def to_rows(
    examples: list[tuple[list[int], list[int]]],
    pad_id: int,
    packing: bool,
    capacity: int,
    padding_free: bool = False,
) -> ChatRows:
    if not packing:
        rows = [
            {"input_ids": torch.tensor(ids), "labels": torch.tensor(lab)} for ids, lab in examples
        ]
        return ChatRows(rows, pad_id, packed=False, padding_free=padding_free)
    rows = []
    for members in best_fit_bins([len(ids) for ids, _ in examples], capacity):
        members.sort()  # the data order inside a bin: deterministic, and close to the file's
        ids = [t for m in members for t in examples[m][0]]
        labels = [t for m in members for t in examples[m][1]]
        pos = [p for m in members for p in range(len(examples[m][0]))]
        rows.append(
            {
                "input_ids": torch.tensor(ids),
                "labels": torch.tensor(labels),
                "position_ids": torch.tensor(pos),
            }
        )
    return ChatRows(rows, pad_id, packed=True, padding_free=padding_free)
