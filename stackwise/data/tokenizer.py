"""Tokenizers: a local HF tokenizer dir, a byte-level BPE trained on the corpus, or a character-
or byte-level tokenizer (small corpora: no rare merges to learn). Built ones are cached.

Every tokenizer ends up with pad, bos, eos and mask tokens, since diffusion and mlm need a mask
id and packing needs eos.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stackwise.data.plain_tokenizer import (
    MODEL_FILES,
    PLAIN_CLASSES,
    PlainTokenizer,
    as_transformers,
)
from stackwise.data.tokenize import text_pieces
from stackwise.errors import StackWiseError
from stackwise.paths import build_lock, cache_root
from stackwise.spec import DataSpec

if TYPE_CHECKING:
    from stackwise.data.plain_tokenizer import AnyTokenizer

SPECIALS = {
    "pad_token": "<pad>",
    "bos_token": "<bos>",
    "eos_token": "<eos>",
    "mask_token": "<mask>",
}
BPE_VERSION = "bpe-v1"
CHAR_VERSION = "char-v1"
BYTE_VERSION = "byte-v1"
UNK = "<unk>"
SAMPLE_CHARS = 4096  # the grain of the BPE's sample of a large corpus
BUILT_IN = ("char", "byte")


def corpus_hash(texts: Iterable[str]) -> str:
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode("utf-8"))
        h.update(b"\x00")
    return h.hexdigest()[:16]


def ensure_specials(tok: AnyTokenizer) -> AnyTokenizer:
    missing = {k: v for k, v in SPECIALS.items() if getattr(tok, k) is None}
    if missing:
        tok = as_transformers(tok)
        tok.add_special_tokens(missing)
    return tok


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")
SAVED_WITH = "a folder written by save_pretrained (or data.tokenizer: char / byte)"


def load_tokenizer_dir(path: str | Path) -> AnyTokenizer:
    """The tokenizer saved in a folder: a PlainTokenizer where it reads the folder completely
    (every tokenizer we build, and run folders' tokenizer/), else transformers' class for it."""
    path = Path(path).expanduser()
    if path.is_file():
        raise StackWiseError(
            f"Tokenizer '{path}' is a file; a tokenizer is a folder. Pass the folder that holds "
            f"it: {SAVED_WITH}."
        )
    if not path.is_dir():
        raise StackWiseError(
            f"Tokenizer dir '{path}' does not exist. Point data.tokenizer at {SAVED_WITH}, or "
            "remove it to train a BPE on the corpus."
        )
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise StackWiseError(
            f"'{path}' holds no tokenizer (none of {', '.join(TOKENIZER_FILES)}). Point "
            f"data.tokenizer at {SAVED_WITH}."
        )
    try:
        tok = PlainTokenizer.from_folder(path) or _loader(path).from_pretrained(
            str(path), local_files_only=True, trust_remote_code=False
        )
    except Exception as err:  # a damaged file raises KeyError, TypeError, JSON errors, ...
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise StackWiseError(
            f"Could not load the tokenizer in '{path}' ({type(err).__name__}: {first[:160]}): "
            f"its files are damaged or not a tokenizer's. Use {SAVED_WITH}."
        ) from None
    return ensure_specials(tok)


def _loader(path: Path) -> Any:
    """transformers' plain fast class for a folder that holds a tokenizer.json saved as one and
    no model, else AutoTokenizer: its model registry costs seconds of start-up and some 6 MB per
    process. A model folder's config.json can make AutoTokenizer pick the model's own class
    over the saved one (qwen2's, say), and tekken.json Mistral's: those go to AutoTokenizer."""
    config = path / "tokenizer_config.json"
    try:
        saved_as = json.loads(config.read_text(encoding="utf-8")).get("tokenizer_class")
    except (OSError, ValueError, AttributeError):
        saved_as = None  # no or damaged config: AutoTokenizer decides (and names the problem)
    plain = saved_as in PLAIN_CLASSES and (path / "tokenizer.json").is_file()
    if plain and not any((path / name).exists() for name in MODEL_FILES):
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast
    from transformers import AutoTokenizer

    return AutoTokenizer


def corpus_size(texts: Iterable[str]) -> int:
    """Bytes of a corpus: its files' size on disk (the text itself for plain text; for row
    files an estimate, as other columns count and parquet is compressed); a list of texts (a
    re-iterable, not a one-shot iterator) is measured."""
    size = getattr(texts, "size_bytes", None)
    return size if size is not None else sum(len(t.encode("utf-8")) for t in texts)


def sample_stride(texts: Iterable[str], sample_mb: float | None) -> int:
    """k such that one piece in k of `texts` makes at most `sample_mb` MB, and more than half
    of it (1: all of it)."""
    if sample_mb is None:
        return 1
    return max(1, math.ceil(corpus_size(texts) / (sample_mb * 1e6)))


def train_bpe(texts: Iterable[str], vocab_size: int, every: int = 1) -> PlainTokenizer:
    """A byte-level BPE learnt from every `every`-th piece of the texts: when every > 1, a
    sample spread over the whole corpus in pieces of SAMPLE_CHARS, fine enough for a small one."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIALS.values()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=sys.stderr.isatty(),  # a bar for people, nothing in logs and pipes
    )
    # in pieces cut at word starts: the word counts are the same, the memory is bounded
    size = SAMPLE_CHARS if every > 1 else None
    pieces = itertools.islice((p for t in texts for p in text_pieces(t, size)), 0, None, every)
    tok.train_from_iterator(pieces, trainer=trainer)
    return PlainTokenizer(tok, SPECIALS)


def _cached(key: str, cache_dir: str | None, build: Callable[[], AnyTokenizer]) -> AnyTokenizer:
    """Build once per key; later runs (and other ranks) load the cached copy."""
    folder = cache_root(cache_dir) / "tokenizers" / key
    if (folder / "tokenizer.json").is_file():
        return load_tokenizer_dir(folder)
    with build_lock(folder):  # DDP ranks train one BPE, not one each
        if (folder / "tokenizer.json").is_file():
            return load_tokenizer_dir(folder)
        tok = build()
        tmp = Path(tempfile.mkdtemp(dir=folder.parent))
        tok.save_pretrained(str(tmp))
        try:
            tmp.rename(folder)
        except OSError:  # cached meanwhile by a process that does not take the lock
            shutil.rmtree(tmp, ignore_errors=True)
    return tok


def corpus_tokenizer(
    texts: Iterable[str],
    vocab_size: int,
    cache_dir: str | None = None,
    corpus_key: str | None = None,
    sample_mb: float | None = None,
) -> AnyTokenizer:
    """A BPE trained once per (corpus, vocab size, sample), on about `sample_mb` MB of it."""
    every = sample_stride(texts, sample_mb)
    key = f"{BPE_VERSION}-{corpus_key or corpus_hash(texts)}-{vocab_size}"
    key += f"-every{every}" if every > 1 else ""  # the whole corpus keeps the key it had

    def build() -> PlainTokenizer:
        if every > 1:
            mb = corpus_size(texts) / 1e6
            print(
                f"the BPE learns its merges from one piece in {every} of the corpus: about "
                f"{mb / every:.3g} of its {mb:.3g} MB (data.bpe_sample_mb: {sample_mb:g}; null "
                "reads all of it)",
                file=sys.stderr,
                flush=True,
            )
        return train_bpe(texts, vocab_size, every)

    return _cached(key, cache_dir, build)


def _unmerged(symbols: Sequence[str], extra: Sequence[str]) -> Any:
    """One token per symbol: a BPE model with no merges over `symbols`, specials first."""
    from tokenizers import Tokenizer, models

    names = [*SPECIALS.values(), *extra]
    vocab = {name: i for i, name in enumerate(names)}
    for sym in symbols:
        vocab.setdefault(sym, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK if UNK in extra else None))
    tok.add_special_tokens(names)
    return tok


def char_tokenizer(texts: Iterable[str]) -> PlainTokenizer:
    """Every character of the corpus is a token; unseen characters become <unk>."""
    from tokenizers import decoders

    tok = _unmerged(sorted(set().union(*map(set, texts))), [UNK])
    tok.decoder = decoders.Fuse()
    return PlainTokenizer(tok, {**SPECIALS, "unk_token": UNK})


def byte_tokenizer() -> PlainTokenizer:
    """Every UTF-8 byte is a token (256 + specials): nothing is ever unknown."""
    from tokenizers import decoders, pre_tokenizers

    tok = _unmerged(sorted(pre_tokenizers.ByteLevel.alphabet()), [])
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PlainTokenizer(tok, SPECIALS)


def make_tokenizer(
    name: str | None,
    texts: Iterable[str],
    bpe_vocab_size: int,
    cache_dir: str | None = None,
    corpus_key: str | None = None,
    bpe_sample_mb: float | None = None,
) -> AnyTokenizer:
    """`data.tokenizer`: None (BPE on the corpus), `char`, `byte`, or a tokenizer dir. Built
    ones are cached by `corpus_key` (e.g. the files' fingerprint: nothing is read) or else by
    a hash of the texts. `texts` may be re-iterable pieces of documents."""
    if name is None:
        return corpus_tokenizer(texts, bpe_vocab_size, cache_dir, corpus_key, bpe_sample_mb)
    if name == "char":
        key = f"{CHAR_VERSION}-{corpus_key or corpus_hash(texts)}"
        return _cached(key, cache_dir, lambda: char_tokenizer(texts))
    if name == "byte":
        return _cached(BYTE_VERSION, cache_dir, byte_tokenizer)
    return load_tokenizer_dir(name)


def corpus_data_tokenizer(cfg: DataSpec, corpus: Any) -> AnyTokenizer:
    """The data section's tokenizer for a corpus or mixture (anything with a fingerprint that
    iterates its texts): built from it when need be, cached under its fingerprint."""
    return make_tokenizer(
        cfg.tokenizer,
        corpus,
        cfg.bpe_vocab_size,
        cfg.cache_dir,
        corpus_key=corpus.fingerprint,
        bpe_sample_mb=cfg.bpe_sample_mb,
    )
