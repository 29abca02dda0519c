"""Tokenizers: a local HF tokenizer dir, or a byte-level BPE trained on the corpus and cached.

Every tokenizer ends up with pad, bos, eos and mask tokens, since diffusion and mlm need a mask
id and packing needs eos.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from stackwise.errors import StackWiseError
from stackwise.paths import cache_root

SPECIALS = {
    "pad_token": "<pad>",
    "bos_token": "<bos>",
    "eos_token": "<eos>",
    "mask_token": "<mask>",
}
BPE_VERSION = "bpe-v1"


def corpus_hash(texts: Sequence[str]) -> str:
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode("utf-8"))
        h.update(b"\x00")
    return h.hexdigest()[:16]


def ensure_specials(tok: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    missing = {k: v for k, v in SPECIALS.items() if getattr(tok, k) is None}
    if missing:
        tok.add_special_tokens(missing)
    return tok


def load_tokenizer_dir(path: str | Path) -> PreTrainedTokenizerBase:
    path = Path(path).expanduser()
    if not path.is_dir():
        raise StackWiseError(
            f"Tokenizer dir '{path}' does not exist. Point data.tokenizer at a folder saved with "
            "save_pretrained, or remove it to train a BPE on the corpus."
        )
    try:
        tok = AutoTokenizer.from_pretrained(
            str(path), local_files_only=True, trust_remote_code=False
        )
    except (OSError, ValueError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise StackWiseError(f"Could not load the tokenizer in '{path}': {first}.") from None
    return ensure_specials(tok)


def train_bpe(texts: Sequence[str], vocab_size: int) -> PreTrainedTokenizerFast:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIALS.values()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, **SPECIALS)


def corpus_tokenizer(
    texts: Sequence[str], vocab_size: int, cache_dir: str | None = None
) -> PreTrainedTokenizerBase:
    """Train once per (corpus, vocab size); later runs load the cached copy."""
    key = f"{BPE_VERSION}-{corpus_hash(texts)}-{vocab_size}"
    folder = cache_root(cache_dir) / "tokenizers" / key
    if (folder / "tokenizer.json").is_file():
        return load_tokenizer_dir(folder)
    tok = train_bpe(texts, vocab_size)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent))
    tok.save_pretrained(str(tmp))
    try:
        tmp.rename(folder)
    except OSError:  # another process cached it first
        shutil.rmtree(tmp, ignore_errors=True)
    return tok
