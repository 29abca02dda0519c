"""Token blocks: fixed-length rows cut from a token stream, and what a run's data carries.

The split is deterministic: the last `val_fraction` of the stream is validation, so no block
straddles both sets and the same text never appears in both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import Dataset

from stackwise.errors import StackWiseError
from stackwise.objectives.base import Specials
from stackwise.spec import DataSpec

if TYPE_CHECKING:
    from stackwise.data.plain_tokenizer import AnyTokenizer


class TokenBlocks(Dataset):
    """Rows of a (N, L) token tensor as {'input_ids': ...}; the index is a stable sample id."""

    def __init__(self, blocks: torch.Tensor, bytes_per_token: torch.Tensor | None = None) -> None:
        self.blocks = blocks
        self.bytes_per_token = bytes_per_token  # lets evaluation report bits per character

    def __len__(self) -> int:
        return self.blocks.shape[0]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.blocks[i].long()}


@dataclass
class PreparedData:
    tokenizer: AnyTokenizer
    train: TokenBlocks
    val: TokenBlocks
    n_documents: int
    n_tokens: int
    describe: str = ""  # instruction data: what became of the rows, for the run header
    chat: Any = None  # instruction data: its ChatStats
    eval_chat: Any = None  # and the evaluation rows'

    @property
    def train_size(self) -> int:
        """Training rows; 0 for a stream (data.streaming), whose length is not known."""
        return len(self.train) if hasattr(self.train, "__len__") else 0

    @property
    def specials(self) -> Specials:
        return specials_of(self.tokenizer)


def specials_of(tok: AnyTokenizer) -> Specials:
    return Specials(
        vocab_size=len(tok),
        pad_id=tok.pad_token_id,
        mask_id=tok.mask_token_id,
        bos_id=tok.bos_token_id,
        eos_id=tok.eos_token_id,
    )


def pack_stream(token_lists: list[list[int]], eos_id: int) -> torch.Tensor:
    total = sum(len(t) + 1 for t in token_lists)
    out = torch.empty(total, dtype=torch.int32)
    pos = 0
    for ids in token_lists:
        n = len(ids)
        out[pos : pos + n] = torch.tensor(ids, dtype=torch.int32)
        out[pos + n] = eos_id
        pos += n + 1
    return out


def to_blocks(stream: torch.Tensor, seq_len: int) -> torch.Tensor:
    n = stream.numel() // seq_len
    return stream[: n * seq_len].view(n, seq_len)


def split_stream(stream: torch.Tensor, corpus: Any, cfg: DataSpec) -> tuple[Any, Any]:
    """(training blocks, validation blocks): the last val_fraction of the stream validates."""
    n_val = max(cfg.seq_len, int(stream.numel() * cfg.val_fraction))
    train_blocks = to_blocks(stream[:-n_val], cfg.seq_len)
    val_blocks = to_blocks(stream[-n_val:], cfg.seq_len)
    if train_blocks.shape[0] == 0 or val_blocks.shape[0] == 0:
        files = sorted({str(p) for p, _ in corpus.files})  # whole paths: never cut one
        names = ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
        raise StackWiseError(
            f"The data ({names}) gives {stream.numel()} tokens: too few for one training and one "
            f"validation block of data.seq_len={cfg.seq_len}. Add text or lower data.seq_len."
        )
    return train_blocks, val_blocks
