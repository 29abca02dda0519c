"""A weighted mixture of pretraining sources (data.mix).

Each source has its own token store and its own validation tail; one tokenizer is built over
all of them. An epoch is as many blocks as the sources hold together, split among them by
weight: a source with a larger share than its size repeats its blocks in order, a smaller one
uses its first blocks. The slots are interleaved evenly (each source's k-th slot sits at
(k + 1/2) / n_k of the epoch), so any stretch of training sees the weights; the schedule is a
fixed function of the sizes and weights, so the sampler's order and exact resume work as for
one source. Validation is every source's tail, unweighted.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from stackwise.data.blocks import PreparedData, TokenBlocks, split_stream
from stackwise.data.documents import Corpus
from stackwise.data.store import token_store
from stackwise.data.token_bytes import bytes_per_token
from stackwise.data.tokenizer import corpus_data_tokenizer
from stackwise.spec import DataSpec


class MixedBlocks(Dataset):
    """Blocks drawn from several (N_k, L) block tensors by weight; index i is slot i."""

    def __init__(
        self, parts: list[torch.Tensor], weights: list[float], bytes_per_token: Any, cap: int | None
    ) -> None:
        self.parts, self.bytes_per_token = parts, bytes_per_token
        n = sum(int(p.shape[0]) for p in parts)
        total = sum(weights)
        shares = [max(1, round(n * w / total)) for w in weights]
        times = np.concatenate([(np.arange(k) + 0.5) / k for k in shares])
        source = np.concatenate([np.full(k, s, dtype=np.int32) for s, k in enumerate(shares)])
        index = np.concatenate(
            [np.arange(k) % int(p.shape[0]) for k, p in zip(shares, parts, strict=True)]
        )
        order = np.argsort(times, kind="stable")
        self.source, self.index = source[order][:cap], index[order][:cap]

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.parts[self.source[i]][self.index[i]].long()}


class Sources:
    """Several corpora read one after the other (what the shared tokenizer trains on)."""

    def __init__(self, corpora: list[Corpus]) -> None:
        self.corpora = corpora
        key = "|".join(c.fingerprint for c in corpora)
        self.fingerprint = hashlib.sha256(key.encode()).hexdigest()[:20]

    @property
    def size_bytes(self) -> int:
        return sum(c.size_bytes for c in self.corpora)

    def __iter__(self) -> Iterator[str]:
        for corpus in self.corpora:
            yield from corpus


def build_mixed(cfg: DataSpec) -> PreparedData:
    sources = Sources([Corpus(cfg, m) for m in cfg.mix])
    tok = corpus_data_tokenizer(cfg, sources)
    stores = [token_store(c, tok, cfg.cache_dir) for c in sources.corpora]
    splits = [split_stream(s.tokens, c, cfg) for s, c in zip(stores, sources.corpora, strict=True)]
    table = bytes_per_token(tok)
    weights = [m.weight for m in cfg.mix]
    train = MixedBlocks([t for t, _ in splits], weights, table, cfg.num_samples)
    return PreparedData(
        tokenizer=tok,
        train=train,  # type: ignore[arg-type]
        val=TokenBlocks(torch.cat([v for _, v in splits]), table),
        n_documents=sum(s.n_documents for s in stores),
        n_tokens=sum(int(s.tokens.numel()) for s in stores),
    )
