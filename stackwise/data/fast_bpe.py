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
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import pairwise
from typing import Any

import numpy as np

GPT2_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
PLAIN_BPE = {  # every option a BPE model may carry, at the value tiktoken's result needs
    "type": "BPE",
    "dropout": None,
    "continuing_subword_prefix": None,
    "end_of_word_suffix": None,
    "byte_fallback": False,
    "ignore_merges": False,
}
FREE_BPE = {"vocab", "merges", "unk_token", "fuse_unk"}  # unk never fires: every byte is a token
GPT2_PRE = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}
FREE_PRE = {"trim_offsets"}  # offsets only
TASK_CHARS = 1 << 14  # a thread's task: enough text that handing it over costs little


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
    pairs = _merge_pairs(model["merges"])
    joined = {a + b for a, b in pairs}  # an added token a merge makes is an ordinary one too
    vocab: dict[str, int] = {
        s: i for s, i in model["vocab"].items() if s not in added or s in joined
    }
    if any(c not in to_byte for s in vocab for c in s):  # a token outside the byte alphabet
        return None
    ranks = {bytes(to_byte[c] for c in s): i for s, i in vocab.items()}
    made = [
        (bytes(to_byte[c] for c in a), bytes(to_byte[c] for c in b), vocab.get(a + b))
        for a, b in pairs
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
        self.encoding, self.original = encoding, original
        longest_first = sorted(specials, key=len, reverse=True)
        self.specials = re.compile("|".join(map(re.escape, longest_first))) if specials else None
        self.threads = encoder_threads()

    def _one(self, text: str) -> np.ndarray:
        if self.specials is not None and self.specials.search(text):
            ids = self.original.encode(text, add_special_tokens=False).ids
            return np.asarray(ids, dtype=np.int32)
        return self.encoding.encode_to_numpy(text).astype(np.int32, copy=False)

    def _group(self, texts: list[str]) -> list[np.ndarray]:
        return [self._one(t) for t in texts]

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        """Runs of texts go to the threads as they free up (a run per task: one per long
        piece, many short rows together); tiktoken releases the GIL while it encodes."""
        runs = runs_of(texts, TASK_CHARS)
        if self.threads == 1 or len(runs) < 2:
            return self._group(texts)
        with ThreadPoolExecutor(min(self.threads, len(runs))) as pool:
            return [ids for run in pool.map(self._group, runs) for ids in run]


def runs_of(texts: list[str], chars: int) -> list[list[str]]:
    """`texts` as consecutive runs of at least `chars` characters (the last may be shorter): a
    long piece is a run alone, short rows go together."""
    runs: list[list[str]] = []
    run: list[str] = []
    size = 0
    for text in texts:
        run.append(text)
        size += len(text)
        if size >= chars:
            runs.append(run)
            run, size = [], 0
    if run:
        runs.append(run)
    return runs


PARALLELISM_OFF = ("", "off", "false", "f", "no", "n", "0")  # as `tokenizers` reads it


def encoder_threads() -> int:
    """The CPUs this process may use; 1 where TOKENIZERS_PARALLELISM is off (as the library
    it stands in for would run) or in a DataLoader worker (its siblings share the CPUs)."""
    setting = os.environ.get("TOKENIZERS_PARALLELISM")
    if setting is not None and setting.lower() in PARALLELISM_OFF:
        return 1
    from torch.utils.data import get_worker_info

    if get_worker_info() is not None:
        return 1
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)


def _only(part: dict[str, Any], fixed: dict[str, Any], free: set[str]) -> bool:
    """`part` holds the `fixed` values (a missing optional one counts as its default) and no
    key outside `fixed` and `free`: an option a later library adds is not assumed harmless."""
    if not part or part.keys() - fixed.keys() - free:
        return False
    return all(part.get(key, value) == value for key, value in fixed.items())


def tiktoken_twin(backend: Any) -> TiktokenTwin | None:
    """The tiktoken twin of a `tokenizers.Tokenizer` (truncation and padding off), or None when
    it is not a plain byte-level BPE whose ids tiktoken reproduces."""
    spec = json.loads(backend.to_str())
    model, pre = spec.get("model") or {}, spec.get("pre_tokenizer") or {}
    if spec.get("normalizer") is not None:
        return None
    if not _only(model, PLAIN_BPE, FREE_BPE) or not _only(pre, GPT2_PRE, FREE_PRE):
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
