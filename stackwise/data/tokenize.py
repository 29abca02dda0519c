"""Documents to an EOS-separated int32 token stream, chunk by chunk, with progress.

A tokenizer handed one 20 MB line holds every token's offsets and Python ints at once (gigabytes);
here long documents are cut into pieces of about 64k characters and tokenized a megabyte at a
time, and ids go straight into int32 tensors. Pieces are cut just before a space that follows a
non-space, where the byte-level BPE, char and byte tokenizers start a new word anyway, so the
stream is the one the whole document gives; a tokenizer from a folder may differ by a token at
a cut, one cut per 64k characters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tqdm.auto import tqdm

if TYPE_CHECKING:
    from stackwise.data.plain_tokenizer import AnyTokenizer

PIECE_CHARS = 1 << 16
BATCH_CHARS = 1 << 20


def word_cut(text: str, lo: int, hi: int) -> int:
    """The last index in [lo, hi) where a word starts (a space or newline that follows a
    non-space: byte-level BPE, char and byte tokenizers split there anyway), or -1. Searched
    from the end, so that the usual cut costs a character or two, not a scan of the window;
    each character is looked at a bounded number of times, whatever the text."""
    last = {c: text.rfind(c, lo, hi) for c in " \n"}  # the latest space and newline left
    while (at := max(last.values())) > 0:
        if not text[at - 1].isspace():  # str.isspace is the \s of Python's re
            return at
        start = at - 1  # inside a run of whitespace: only its first character can qualify
        while start > lo and text[start - 1].isspace():
            start -= 1
        for c, found in last.items():
            if found > start:
                last[c] = text.rfind(c, lo, start + 1)
    return -1


def text_pieces(text: str, size: int | None = None) -> Iterator[str]:
    """`text` in consecutive pieces of at most `size` (default PIECE_CHARS) characters."""
    size = size or PIECE_CHARS
    start = 0
    while len(text) - start > size:
        cut = word_cut(text, start + size // 2, start + size)
        if cut <= start:  # no word boundary at all: cut anywhere
            cut = start + size
        yield text[start:cut]
        start = cut
    yield text[start:]


def plain_backend(tokenizer: AnyTokenizer) -> Any:
    """A copy of the Rust tokenizer with no truncation and no padding (a tokenizer.json may
    carry either; the usual call switches them off, a direct one would not), or None."""
    backend = getattr(tokenizer, "_tokenizer", None)
    if backend is None or not hasattr(backend, "encode_batch_fast"):
        return None
    from tokenizers import Tokenizer

    plain = Tokenizer.from_str(backend.to_str())
    plain.no_truncation()
    plain.no_padding()
    return plain


def batch_encoder(tokenizer: AnyTokenizer) -> Callable[[list[str]], list[Any]]:
    """Token ids of a batch of texts, without special tokens. A byte-level BPE that tiktoken
    reproduces goes through tiktoken (3-4x faster); another Rust tokenizer is called directly (no
    offsets, no BatchEncoding: about 1.3x faster than the usual call); anything else the usual
    way."""
    backend = plain_backend(tokenizer)
    if backend is None:
        return lambda texts: tokenizer(texts, add_special_tokens=False)["input_ids"]
    from stackwise.data.fast_bpe import tiktoken_twin

    twin = tiktoken_twin(backend)
    if twin is not None:
        return twin.encode_batch
    return lambda texts: [e.ids for e in backend.encode_batch_fast(texts, add_special_tokens=False)]


class _PieceEncoder:
    """Pieces queued for the encoder a batch at a time, and their tokens until each is whole."""

    def __init__(self, encode: Callable[[list[str]], list[Any]], eos_id: int, advance: Any) -> None:
        self.encode, self.advance = encode, advance  # advance: the progress bar's update
        self.batch: list[str] = []  # sub-pieces queued for the encoder (at most about BATCH_CHARS)
        self.owner: list[int] = []  # the index in `parts` of each one's piece
        self.parts: list[list[np.ndarray]] = []  # pieces not yet given out; the last may be partial
        self.ends: list[bool] = []  # whether each of those pieces is the last of its document
        self.pending = 0  # characters queued since the last encoding
        self.eos, self.empty = np.array([eos_id], dtype=np.int32), np.empty(0, dtype=np.int32)

    def add(self, text: str, end: bool) -> Iterator[list[np.ndarray]]:
        """Queue a piece; whenever about BATCH_CHARS are queued (a long document too), encode
        them and yield the pieces that are then whole."""
        self.parts.append([])
        self.ends.append(end)
        subs = list(text_pieces(text))
        for j, sub in enumerate(subs):
            self.batch.append(sub)
            self.owner.append(len(self.parts) - 1)
            self.pending += len(sub)
            if self.pending >= BATCH_CHARS:
                self.encode_queued()
                self.pending = 0
                if ready := self.complete(len(self.parts) - (j < len(subs) - 1)):
                    yield ready

    def encode_queued(self) -> None:
        """Encode the queued sub-pieces, adding their tokens to their pieces'."""
        for ids, i in zip(self.encode(self.batch), self.owner, strict=True):
            self.parts[i].append(np.asarray(ids, dtype=np.int32))
        self.advance(sum(len(p.encode("utf-8")) for p in self.batch))
        self.batch.clear()
        self.owner.clear()

    def complete(self, n: int) -> list[np.ndarray]:
        """The first n pieces' tokens (they are all encoded), given out and forgotten."""
        done = zip(self.parts[:n], self.ends[:n], strict=True)
        out = [np.concatenate(p + [self.eos] * e) if p or e else self.empty for p, e in done]
        del self.parts[:n], self.ends[:n]
        return out


def piece_token_batches(
    tokenizer: AnyTokenizer,
    pieces: Iterable[tuple[str, bool]],
    eos_id: int,
    total: int | None = None,
    progress: bool = True,
) -> Iterator[list[np.ndarray]]:
    """Each piece's int32 tokens (EOS after the last piece of a document), a list per about a
    megabyte of text: the batch the Rust tokenizer encodes at once. `total` (bytes) sizes the
    progress bar, shown on a terminal when `progress`."""
    quiet = None if progress else True  # None: a bar on a terminal only
    bar = tqdm(
        total=total, unit="B", unit_scale=True, desc="tokenizing", leave=False, disable=quiet
    )
    queue = _PieceEncoder(batch_encoder(tokenizer), eos_id, bar.update)
    with bar:
        for text, end in pieces:
            yield from queue.add(text, end)
        if queue.parts:
            queue.encode_queued()
            yield queue.complete(len(queue.parts))


def token_chunks(
    tokenizer: AnyTokenizer,
    pieces: Iterable[tuple[str, bool]],
    eos_id: int,
    total: int | None = None,
) -> Iterator[torch.Tensor]:
    """int32 tensors of tokens, about a megabyte of text each: the pieces' tokens end to end."""
    for arrays in piece_token_batches(tokenizer, pieces, eos_id, total):
        yield (
            torch.from_numpy(np.concatenate(arrays))
            if arrays
            else torch.empty(0, dtype=torch.int32)
        )


def token_stream(tokenizer: AnyTokenizer, texts: Sequence[str], eos_id: int) -> torch.Tensor:
    """Every document's tokens followed by EOS, as one int32 tensor (in memory)."""
    total = sum(len(t.encode("utf-8")) for t in texts)
    chunks = list(token_chunks(tokenizer, ((t, True) for t in texts), eos_id, total))
    return torch.cat(chunks) if chunks else torch.empty(0, dtype=torch.int32)
