"""The store build's fast path: a byte-level BPE run by tiktoken, which encodes about 3-4x faster
than the `tokenizers` library here (ids only: no token strings, no offsets).

Only a tokenizer whose tiktoken twin gives the same ids takes it: no normalizer, the GPT-2
byte-level pre-tokenizer without a prefix space, and a plain BPE whose merges tiktoken's rank
order reproduces. tiktoken merges the adjacent pair whose joined bytes have the lowest id, while
`tokenizers` applies the listed merge of lowest rank; the two agree when each merge, in list
order, makes the next new token and is the split tiktoken itself reaches for that token from the
tokens before it (the check `transformers` relies on to turn tiktoken ranks into merges). Text
holding a special token's string goes to the original, which splits those out.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import pairwise
from typing import Any

import numpy as np

GPT2_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
PLAIN_BPE = {  # the BPE options that change what tiktoken would give, at their neutral values
    "dropout": None,
    "continuing_subword_prefix": None,
    "end_of_word_suffix": None,
    "byte_fallback": False,
    "ignore_merges": False,
}


def byte_of_symbol() -> dict[str, int]:
    """The byte-level alphabet: printable bytes stand for themselves, the other 68 are shifted
    to code points from 256 up, in byte order (the GPT-2 convention `tokenizers` follows)."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    symbols = {chr(b): b for b in printable}
    shifted = (b for b in range(256) if b not in set(printable))
    symbols.update((chr(256 + i), b) for i, b in enumerate(shifted))
    return symbols


def _merge_pairs(merges: Sequence[Any]) -> list[tuple[str, str]]:
    """Merges as pairs: `tokenizers` writes them as [left, right] lists or "left right"."""
    return [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1)) for m in merges]  # type: ignore[misc]


def rank_merge(ranks: dict[bytes, int], word: bytes, below: int) -> list[bytes]:
    """tiktoken's BPE on `word` with only the tokens of rank < `below`: join the adjacent pair of
    lowest rank (leftmost on ties) until none joins."""
    parts = [word[i : i + 1] for i in range(len(word))]
    while len(parts) > 1:
        best, at = below, -1
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1], below)
            if rank < best:
                best, at = rank, i
        if at < 0:
            break
        parts[at : at + 2] = [parts[at] + parts[at + 1]]
    return parts


def _ranks(model: dict[str, Any], added: set[str]) -> dict[bytes, int] | None:
    """Each token's bytes and id when tiktoken's rank order gives this BPE's merges, else None."""
    to_byte = byte_of_symbol()
    vocab: dict[str, int] = {s: i for s, i in model["vocab"].items() if s not in added}
    if any(c not in to_byte for s in vocab for c in s):  # a token outside the byte alphabet
        return None
    ranks = {bytes(to_byte[c] for c in s): i for s, i in vocab.items()}
    made = [
        (bytes(to_byte[c] for c in a), bytes(to_byte[c] for c in b), vocab.get(a + b))
        for a, b in _merge_pairs(model["merges"])
    ]
    ids = [i for _, _, i in made]
    if None in ids or any(x >= y for x, y in pairwise(ids)):  # new tokens, in id order
        return None
    bytes_and_made = {ranks.get(bytes([b])) for b in range(256)} | set(ids)
    if len(set(ranks.values())) != len(ranks) or bytes_and_made != set(ranks.values()):
        return None  # an id twice, a byte missing, or a token no merge makes
    if any(rank_merge(ranks, a + b, i) != [a, b] for a, b, i in made):  # type: ignore[arg-type]
        return None
    return ranks


class TiktokenTwin:
    """Encodes batches of text to int32 ids with tiktoken, on every core this process may use;
    a text that contains a special token's string is encoded by the original tokenizer."""

    def __init__(self, encoding: Any, specials: Sequence[str], original: Any) -> None:
        self.encoding, self.specials, self.original = encoding, tuple(specials), original
        self.threads = max(
            1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
        )

    def _one(self, text: str) -> np.ndarray:
        if any(s in text for s in self.specials):
            ids = self.original.encode(text, add_special_tokens=False).ids
            return np.asarray(ids, dtype=np.int32)
        return self.encoding.encode_to_numpy(text).astype(np.int32, copy=False)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        if self.threads == 1 or len(texts) < 2:
            return [self._one(t) for t in texts]
        with ThreadPoolExecutor(self.threads) as pool:  # tiktoken releases the GIL
            return list(pool.map(self._one, texts))


def tiktoken_twin(backend: Any) -> TiktokenTwin | None:
    """The tiktoken twin of a `tokenizers.Tokenizer` (truncation and padding off), or None when
    it is not a plain byte-level BPE whose ids tiktoken reproduces."""
    spec = json.loads(backend.to_str())
    model, pre = spec.get("model") or {}, spec.get("pre_tokenizer") or {}
    if spec.get("normalizer") is not None or model.get("type") != "BPE":
        return None
    if pre.get("type") != "ByteLevel" or pre.get("add_prefix_space") or not pre.get("use_regex"):
        return None
    if any(model.get(key, neutral) != neutral for key, neutral in PLAIN_BPE.items()):
        return None
    added = {a["content"] for a in spec.get("added_tokens") or []}
    ranks = _ranks(model, added)
    if ranks is None:
        return None
    import tiktoken

    encoding = tiktoken.Encoding(
        "stackwise-bpe", pat_str=GPT2_SPLIT, mergeable_ranks=ranks, special_tokens={}
    )
    return TiktokenTwin(encoding, sorted(added), backend)
