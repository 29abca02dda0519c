"""`ReasoningDataset`: one file of formatted chat/instruction examples as the training rows a
fine-tune reads, built by the same steps as a run's own data (stackwise.chat)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from stackwise.spec import DataSpec


class ReasoningDataset(Dataset):
    """The examples of `data_file` (.json, .jsonl or .parquet; rows of `messages`, `prompt` with
    `response`/`completion`, or `instruction`/`input`/`output`), rendered with the tokenizer's
    chat template (or `chat_template`, or StackWise's default), tokenized with the assistant's
    tokens as targets, cut at `max_seq_length`. `collate` pads a batch (labels -100 off target);
    `stats` counts what became of the rows."""

    def __init__(
        self,
        data_file: str | Path,
        tokenizer: Any,
        max_seq_length: int = 2048,
        chat_template: str | None = None,
    ) -> None:
        from stackwise.chat.data import ChatStats, examples_of, to_rows
        from stackwise.chat.sources import load_rows
        from stackwise.chat.template import use_template
        from stackwise.data.plain_tokenizer import as_transformers

        spec = DataSpec(
            mode="instruction",
            files=(str(data_file),),
            seq_len=max_seq_length,
            chat_template=chat_template,
        )
        self.tokenizer = tokenizer = as_transformers(tokenizer)  # renders the template
        self.template = use_template(tokenizer, spec.chat_template)
        rows, _ = load_rows(spec)
        self.stats = ChatStats()
        examples = examples_of(rows, tokenizer, spec, self.stats)
        pad = tokenizer.pad_token_id
        self.rows = to_rows(examples, tokenizer.eos_token_id if pad is None else pad, False, 0)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self.rows[i]

    def collate(self, items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        return self.rows.collate(items)
