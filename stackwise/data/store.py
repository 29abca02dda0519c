"""The token store: a corpus tokenized once into a flat array on disk, then memory-mapped.

One store per (corpus fingerprint, tokenizer, EOS id) lives under `<cache>/token-stores/<key>/`:
`tokens.bin` (uint16 when every id fits, else uint32) and `manifest.json`, written last. A
later run maps the array instead of tokenizing again, so its start does not grow with the
corpus, and only the pages it reads are in memory. A store is trusted only when its manifest
matches: the key, the dtype, the file size, and a checksum of the whole file (of 256 evenly
spread 64 KB samples past 64 MB); anything else (a build cut short, a damaged file) is rebuilt.
Building holds a lock, so DDP ranks build once and the others wait for it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from stackwise.data.documents import Corpus
from stackwise.data.tokenize import plain_backend, token_chunks
from stackwise.paths import build_lock, cache_root

STORE_VERSION = 1
TOKENS, MANIFEST = "tokens.bin", "manifest.json"
WHOLE_LIMIT = 64 << 20  # bytes hashed whole; past it, SAMPLES spread samples
SAMPLES, SAMPLE_BYTES = 256, 64 << 10


@dataclass
class TokenStore:
    tokens: torch.Tensor  # 1-D, over the memory-mapped file
    n_documents: int


def tokenizer_fingerprint(tok: Any) -> str:
    backend = plain_backend(tok)  # what encodes the store, whatever state the tokenizer is in
    spec = backend.to_str() if backend is not None else json.dumps(sorted(tok.get_vocab().items()))
    return hashlib.sha256(f"{spec}|{len(tok)}".encode()).hexdigest()[:20]


def store_key(corpus: Corpus, tok: Any) -> str:
    parts = f"v{STORE_VERSION}|{corpus.fingerprint}|{tokenizer_fingerprint(tok)}|{tok.eos_token_id}"
    return hashlib.sha256(parts.encode()).hexdigest()[:24]


def checksum(path: Path) -> str:
    size = path.stat().st_size
    h = hashlib.blake2b(str(size).encode(), digest_size=16)
    with path.open("rb") as fh:
        if size <= WHOLE_LIMIT:
            while block := fh.read(1 << 20):
                h.update(block)
        else:
            step = (size - SAMPLE_BYTES) // (SAMPLES - 1)
            for i in range(SAMPLES):
                fh.seek(i * step)
                h.update(fh.read(SAMPLE_BYTES))
    return h.hexdigest()


def _dtype(vocab: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab <= 1 << 16 else np.dtype(np.uint32)


def _open(folder: Path, key: str) -> tuple[TokenStore | None, str]:
    """The store in `folder` if its manifest vouches for it; else (None, why not)."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except FileNotFoundError:
        return None, "no complete store yet" if not folder.exists() else "an unfinished build"
    except (OSError, ValueError):
        return None, "its manifest is unreadable"
    path = folder / TOKENS
    named = manifest.get("dtype")
    dtype = np.dtype(named) if named in ("uint16", "uint32") else None
    if manifest.get("key") != key or dtype is None:
        return None, "its manifest belongs to another corpus or tokenizer"
    n = int(manifest.get("n_tokens", -1))
    if not path.is_file() or path.stat().st_size != n * dtype.itemsize:
        return None, "its token file is missing or has the wrong size"
    if checksum(path) != manifest.get("checksum"):
        return None, "its token file does not match its checksum"
    array = np.memmap(path, dtype=dtype, mode="c", shape=(n,))  # copy-on-write: never written
    return TokenStore(torch.from_numpy(array), int(manifest["n_documents"])), ""


def build_store(folder: Path, corpus: Corpus, tok: Any, key: str) -> None:
    """Tokenize the corpus into `folder` (replacing whatever is there), chunk by chunk."""
    dtype = _dtype(len(tok))
    tmp = folder.with_name(f"{folder.name}.building-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    n_tokens, ends = 0, [0]

    def counted() -> Iterator[tuple[str, bool]]:
        for piece, end in corpus.pieces():
            ends[0] += end
            yield piece, end

    try:
        with (tmp / TOKENS).open("wb") as fh:
            for chunk in token_chunks(tok, counted(), tok.eos_token_id, corpus.total_bytes):
                array = chunk.numpy()
                if array.size and int(array.max()) > np.iinfo(dtype).max:
                    raise ValueError(f"token id {int(array.max())} does not fit {dtype.name}")
                fh.write(array.astype(dtype).tobytes())
                n_tokens += array.size
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:  # a failed or interrupted build leaves nothing behind
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    manifest = {
        "version": STORE_VERSION,
        "key": key,
        "dtype": dtype.name,
        "n_tokens": n_tokens,
        "n_documents": ends[0],
        "checksum": checksum(tmp / TOKENS),
        "vocab_size": len(tok),
    }
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)


def _note(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def token_store(corpus: Corpus, tok: Any, cache_dir: str | None, log: Any = _note) -> TokenStore:
    """The corpus's store, built first when there is none to trust."""
    key = store_key(corpus, tok)
    folder = cache_root(cache_dir) / "token-stores" / key
    store, why = _open(folder, key)
    if store is not None:
        return store
    with build_lock(folder):
        store, why = _open(folder, key)  # another rank may have built it meanwhile
        if store is not None:
            return store
        log(f"building the token store ({why}): {folder}")
        build_store(folder, corpus, tok, key)
    store, why = _open(folder, key)
    if store is None:
        raise RuntimeError(f"the token store just built in {folder} does not open: {why}")
    return store
