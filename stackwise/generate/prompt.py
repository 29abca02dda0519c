"""Text in and out: a prompt's ids (checked against the vocabulary and the context), and the
first sample's text written as it grows."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from stackwise.errors import StackWiseError

if TYPE_CHECKING:
    from stackwise.data.plain_tokenizer import AnyTokenizer


def unknown_characters(tokenizer: AnyTokenizer, prompt: str, ids: list[int]) -> None:
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


def prompt_ids(after_token: bool, tokenizer: AnyTokenizer, prompt: str, context: int) -> list[int]:
    """The prompt's ids (an EOS for an empty prompt of a rack that predicts each token from
    the one before, `after_token`); refused if it fills the context."""
    prefix = tokenizer(prompt, add_special_tokens=False)["input_ids"] if prompt else []
    unknown_characters(tokenizer, prompt, prefix)
    if after_token and not prefix:
        prefix = [tokenizer.eos_token_id]  # training text follows an EOS document boundary
    if len(prefix) >= context:
        raise StackWiseError(
            f"The prompt is {len(prefix)} tokens long and this rack's context is {context}: "
            "nothing would be left to generate, and a prompt is never cut silently. Shorten it."
        )
    return prefix


class TextStream:
    """Writes the first row's text as it grows: only what extends what was already written,
    so a piece that decodes differently once the next token arrives is held back, and the
    finished text (cut at EOS) ends it."""

    def __init__(
        self,
        tokenizer: AnyTokenizer,
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
