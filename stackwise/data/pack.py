"""Pretraining data: the corpus's token store cut into training and validation blocks."""

from __future__ import annotations

from stackwise.data.blocks import (
    PreparedData,
    TokenBlocks,
    pack_stream,
    specials_of,
    split_stream,
    to_blocks,
)
from stackwise.data.documents import Corpus
from stackwise.data.mix import build_mixed
from stackwise.data.store import token_store
from stackwise.data.token_bytes import bytes_per_token
from stackwise.data.tokenizer import corpus_data_tokenizer
from stackwise.spec import DataSpec

__all__ = ["PreparedData", "TokenBlocks", "build_data", "pack_stream", "specials_of", "to_blocks"]


def build_data(cfg: DataSpec) -> PreparedData:
    """The corpus's token store (built once, then memory-mapped) cut into blocks: the last
    val_fraction of the stream is validation. data.mix: stackwise.data.mix."""
    if cfg.mix:
        return build_mixed(cfg)
    if cfg.streaming:
        from stackwise.data.stream import build_streamed

        return build_streamed(cfg)
    corpus = Corpus(cfg)
    tok = corpus_data_tokenizer(cfg, corpus)
    store = token_store(corpus, tok, cfg.cache_dir)
    train_blocks, val_blocks = split_stream(store.tokens, corpus, cfg)
    if cfg.num_samples is not None:
        train_blocks = train_blocks[: cfg.num_samples]
    table = bytes_per_token(tok)
    return PreparedData(
        tokenizer=tok,
        train=TokenBlocks(train_blocks, table),
        val=TokenBlocks(val_blocks, table),
        n_documents=store.n_documents,
        n_tokens=int(store.tokens.numel()),
    )
