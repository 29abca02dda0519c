"""Streamed pretraining data (data.streaming): blocks cut from the corpus as it is read.

Nothing is stored: each epoch reads the source in order (text files a megabyte at a time, rows
of json/parquet files or a save_to_disk folder from their memory-mapped Arrow tables, or a
named dataset through `load_dataset(streaming=True)`), tokenizes a megabyte at a time and cuts
blocks of seq_len. The first `stream_val_blocks` blocks validate; training starts after them.
Every rank reads the whole stream and rank r of w keeps block g when g % w == r, so each rank
runs the same number of batches and no block is seen twice.

The position a checkpoint records is three integers: pieces read whole, tokens of the next
piece already used, and training blocks cut so far. A resumed run reads past those pieces
without tokenizing them, so resuming costs a read, not a re-tokenization.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset

from stackwise.data.blocks import PreparedData, TokenBlocks
from stackwise.data.documents import Corpus
from stackwise.data.sources import hub_rows
from stackwise.data.token_bytes import bytes_per_token
from stackwise.data.tokenize import piece_token_batches
from stackwise.data.tokenizer import make_tokenizer
from stackwise.errors import StackWiseError
from stackwise.spec import DataSpec

Position = tuple[int, int, int]  # (pieces read whole, tokens of the next one used, blocks cut)


def _pieces(cfg: DataSpec) -> Iterator[tuple[str, bool]]:
    return hub_rows(cfg) if cfg.dataset_name else Corpus(cfg).pieces()


def cut_blocks(
    tokens: Iterator[tuple[int, np.ndarray]], seq_len: int, offset: int
) -> Iterator[tuple[np.ndarray, int, int]]:
    """(block, piece, token) for consecutive blocks of `tokens` ((piece index, its tokens)
    pairs, the first one read from `offset` on): where the stream goes on after each block."""
    carry = np.empty(0, dtype=np.int32)
    first = True
    for k, ids in tokens:
        base = offset if first else 0
        first = False
        ids = ids[base:]
        pos = 0
        if carry.size:
            need = seq_len - carry.size
            if ids.size < need:
                carry = np.concatenate([carry, ids])
                continue
            block, carry, pos = np.concatenate([carry, ids[:need]]), carry[:0], need
            yield block, *_after(k, base + pos, base + ids.size)
        while ids.size - pos >= seq_len:
            pos += seq_len
            yield ids[pos - seq_len : pos], *_after(k, base + pos, base + ids.size)
        carry = ids[pos:]


def _after(piece: int, used: int, length: int) -> tuple[int, int]:
    """The position after `used` tokens of a piece of `length`: the next piece when all are."""
    return (piece + 1, 0) if used == length else (piece, used)


class StreamedBlocks(IterableDataset):
    """This rank's training blocks, from `start` (a Position; None: the epoch's start) on,
    each with the position after its group of world-size blocks, for the checkpoint."""

    def __init__(self, cfg: DataSpec, tokenizer: Any, begin: Position) -> None:
        self.cfg, self.tokenizer, self.begin = cfg, tokenizer, begin
        self.start: Position | None = None
        self.rank, self.world = 0, 1

    def blocks(self, at: Position) -> Iterator[tuple[np.ndarray, Position]]:
        """Every training block of the stream from `at` on, with the position after it."""
        piece, offset, count = at
        tokens = _tokens(self.cfg, self.tokenizer, piece)
        for block, k, j in cut_blocks(tokens, self.cfg.seq_len, offset):
            count += 1
            yield block, (k, j, count)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        cap = self.cfg.num_samples
        group: list[np.ndarray] = []
        for block, pos in self.blocks(self.start or self.begin):
            if cap is not None and pos[2] > cap - cap % self.world:
                return
            group.append(block)
            if len(group) == self.world:
                mine = torch.from_numpy(group[self.rank].astype(np.int64))
                yield {"input_ids": mine, "stream_pos": torch.tensor(pos)}
                group = []


def _tokens(cfg: DataSpec, tokenizer: Any, skip: int) -> Iterator[tuple[int, np.ndarray]]:
    """(piece index, tokens) from piece `skip` on; the pieces before it are read, not encoded."""
    pieces = islice(_pieces(cfg), skip, None)
    k = skip
    # no bar: training reads the stream as it goes, and its own bar shows the progress
    for arrays in piece_token_batches(tokenizer, pieces, tokenizer.eos_token_id, progress=False):
        for ids in arrays:
            yield k, ids
            k += 1


def build_streamed(cfg: DataSpec) -> PreparedData:
    """The validation blocks (the stream's first ones, read now) and the training stream."""
    tok = make_tokenizer(cfg.tokenizer, [], cfg.bpe_vocab_size, cfg.cache_dir)
    probe = StreamedBlocks(cfg, tok, (0, 0, 0))
    head = list(islice(probe.blocks((0, 0, 0)), cfg.stream_val_blocks + 1))
    if len(head) <= cfg.stream_val_blocks:
        raise StackWiseError(
            f"The streamed data gives {len(head)} blocks of data.seq_len={cfg.seq_len} tokens: "
            f"too few for data.stream_val_blocks={cfg.stream_val_blocks} validation blocks "
            "and training. Add text, or lower data.stream_val_blocks or data.seq_len."
        )
    val = torch.from_numpy(np.stack([b for b, _ in head[:-1]]))
    k, j, _ = head[-2][1]
    table = bytes_per_token(tok)
    return PreparedData(
        tokenizer=tok,
        train=StreamedBlocks(cfg, tok, (k, j, 0)),  # type: ignore[arg-type]
        val=TokenBlocks(val, table),
        n_documents=0,
        n_tokens=0,
        describe=f"a streamed corpus / {len(val):,} val sequences of {cfg.seq_len} tokens",
    )
