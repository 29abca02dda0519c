"""What each token id spells, in UTF-8 bytes of text: the table that turns a loss in nats per
token into bits per byte, comparable across tokenizers."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from stackwise.data.plain_tokenizer import AnyTokenizer


def bytes_per_token(tok: AnyTokenizer) -> torch.Tensor:
    """(V,) UTF-8 bytes of text each token id spells: EOS counts 1 (it separates documents, like
    a newline), other specials 0. Bytes rather than characters so that every tokenizer agrees;
    for ASCII text, such as the default corpus, they are the same thing."""
    specials = set(tok.all_special_ids)
    table = torch.zeros(len(tok), dtype=torch.float64)
    byte_level = _is_byte_level(tok)
    for token, i in tok.get_vocab().items():
        if i >= len(table) or i in specials:
            continue
        if byte_level:  # each symbol of the ByteLevel alphabet stands for one byte
            table[i] = len(token)
        else:
            table[i] = _spelled_bytes(tok, token)
    if tok.eos_token_id is not None:
        table[tok.eos_token_id] = 1.0
    return table


def _is_byte_level(tok: AnyTokenizer) -> bool:
    backend = getattr(tok, "backend_tokenizer", None)
    pre = getattr(backend, "pre_tokenizer", None)
    return pre is not None and "ByteLevel" in type(pre).__name__


BYTE_FALLBACK = re.compile(r"^<0x[0-9A-Fa-f]{2}>$")


def _spelled_bytes(tok: AnyTokenizer, token: str) -> int:
    """Bytes one token spells in running text: SentencePiece's ▁ is a space, a byte-fallback
    token <0xNN> one byte, WordPiece's ## continuation marker nothing; else its own decoding."""
    if BYTE_FALLBACK.match(token):
        return 1
    if "▁" in token:
        return len(token.replace("▁", " ").encode("utf-8"))
    if token.startswith("##"):
        return len(token[2:].encode("utf-8"))
    return len(tok.convert_tokens_to_string([token]).encode("utf-8"))
