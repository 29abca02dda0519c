"""The store build's fast paths change nothing but speed: tiktoken gives the ids of the tokenizer
it stands in for (and only tokenizers whose ids it reproduces take it), and pieces are cut where
the old scan cut them."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

from stackwise.data import tokenize as tz
from stackwise.data.fast_bpe import byte_of_symbol, rank_merge, tiktoken_twin
from stackwise.data.tokenizer import byte_tokenizer, char_tokenizer, train_bpe
from tests.conftest import make_corpus

ODD_TEXT = [
    "a\u00a0b  c\u2028d\x85e\u3000f\t\tg\r\nh",
    "naïve café 日本語 テスト, ٣٤٥ ⅷ 12,345.67",
    "it's they'll I'M we'VE 'd''s",
    "emoji 😀👍🏽 ok\x0b\x0c\x1c end   \n\n\n  ",
    "a word <eos> in the text and <mask>",
]


@pytest.fixture(scope="module")
def bpe():
    return train_bpe([make_corpus(300, seed=5) + "".join(ODD_TEXT)], 420)


def _plain(tok):
    return tz.plain_backend(tok)


def _hf_ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def test_the_symbols_of_the_byte_alphabet_map_back_to_every_byte():
    symbols = byte_of_symbol()
    assert sorted(symbols.values()) == list(range(256))
    assert set(symbols) == set(pre_tokenizers.ByteLevel.alphabet())
    assert symbols["!"] == 33 and symbols["Ġ"] == 32 and symbols["Ċ"] == 10


def test_a_trained_bpe_takes_the_fast_path_and_gives_the_same_ids(bpe):
    twin = tiktoken_twin(_plain(bpe))
    assert twin is not None
    for text in [*ODD_TEXT, make_corpus(40, seed=9)]:
        (got,) = twin.encode_batch([text])
        assert got.dtype == np.int32 and got.tolist() == _hf_ids(bpe, text)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.sampled_from(["the", " the", "heart", " soul", "'s", "'ll", "<eos>", "<pad>"]),
            st.text(max_size=12),  # any code point, whitespace of every kind included
        ),
        max_size=30,
    )
)
def test_any_text_gets_the_ids_the_tokenizer_gives(bpe, words):
    text = "".join(words)
    twin = tiktoken_twin(_plain(bpe))
    assert twin is not None
    assert twin.encode_batch([text])[0].tolist() == _hf_ids(bpe, text)


@pytest.mark.parametrize("threads", [1, 2])
def test_batches_keep_their_order_on_one_thread_or_several(bpe, threads, monkeypatch):
    monkeypatch.setattr("stackwise.data.fast_bpe.TASK_CHARS", 64)  # a task per text or two
    twin = tiktoken_twin(_plain(bpe))
    assert twin is not None
    twin.threads = threads  # the count comes from the CPUs this process may use
    texts = [make_corpus(5, seed=s) for s in range(7)] + ["", "x <bos> y"]
    got = [a.tolist() for a in twin.encode_batch(texts)]
    assert got == [_hf_ids(bpe, t) for t in texts]


def _byte_level_bpe(merges: list[tuple[str, str]], **options) -> Tokenizer:
    """A byte-level BPE over the whole byte alphabet plus the tokens `merges` make."""
    vocab = {s: i for i, s in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, **options))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    return tok


def test_merges_tiktoken_would_reorder_keep_the_tokenizers_library():
    """b+c, then a+b, then ab+c: on "abc" the library stops at [a, bc], while tiktoken, which
    joins any pair whose bytes are a token, would go on to [abc]."""
    tok = _byte_level_bpe([("b", "c"), ("a", "b"), ("ab", "c")])
    assert tok.encode("abc").tokens == ["a", "bc"]
    ranks = {bytes([b]): b for b in range(256)} | {b"bc": 256, b"ab": 257, b"abc": 258}
    assert rank_merge(ranks, b"abc", 259) == [b"abc"]
    assert tiktoken_twin(tok) is None


def test_consistent_merges_take_the_fast_path():
    tok = _byte_level_bpe([("a", "b"), ("ab", "c"), ("Ġ", "abc")])
    twin = tiktoken_twin(tok)
    assert twin is not None
    text = "abc abcab cba"
    assert twin.encode_batch([text])[0].tolist() == tok.encode(text).ids


@pytest.mark.parametrize(
    "change",
    [
        "char",
        "byte",
        "dropout",
        "prefix",
        "normalizer",
        "out_of_order",
        "unmade_token",
        "ignore_merges",
        "byte_fallback",
        "continuing_subword_prefix",
        "unknown_option",
    ],
)
def test_tokenizers_tiktoken_cannot_reproduce_keep_the_library(change):
    if change == "char":
        backend = _plain(char_tokenizer(["abc"]))  # no byte-level pre-tokenizer
    elif change == "byte":
        backend = _plain(byte_tokenizer())  # byte-level without the word split
    elif change == "dropout":
        backend = _byte_level_bpe([("a", "b")], dropout=0.5)
    elif change == "out_of_order":  # the second merge's token has the lower id
        backend = _byte_level_bpe([("c", "d"), ("a", "b")])
        spec = json.loads(backend.to_str())
        vocab = spec["model"]["vocab"]
        vocab["ab"], vocab["cd"] = vocab["cd"], vocab["ab"]
        backend = Tokenizer.from_str(json.dumps(spec))
    elif change == "unmade_token":  # a token in the vocab that no merge makes
        spec = json.loads(_byte_level_bpe([("a", "b")]).to_str())
        spec["model"]["vocab"]["xyz"] = len(spec["model"]["vocab"])
        backend = Tokenizer.from_str(json.dumps(spec))
    elif change in ("ignore_merges", "byte_fallback"):
        backend = _byte_level_bpe([("a", "b")], **{change: True})
    elif change in ("continuing_subword_prefix", "unknown_option"):
        # the library would not build the first without "##"-tokens; the second is an option
        # a later library may add, not assumed harmless
        spec = json.loads(_byte_level_bpe([("a", "b")]).to_str())
        spec["model"]["continuing_subword_prefix" if change[0] == "c" else "new_option"] = "##"
        backend = _FromSpec(spec)
    else:
        backend = _byte_level_bpe([("a", "b")])
        if change == "prefix":
            backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
        else:
            backend.normalizer = normalizers.NFC()
    assert tiktoken_twin(backend) is None


class _FromSpec:
    """A stand-in for a Rust tokenizer whose JSON the installed library would not load."""

    def __init__(self, spec: dict) -> None:
        self.spec = spec

    def to_str(self) -> str:
        return json.dumps(self.spec)


def test_an_added_token_that_is_also_in_the_vocab_gives_the_same_ids():
    tok = _byte_level_bpe([("a", "b"), ("ab", "c")])
    tok.add_tokens(["abc", "zz"])  # one already a token, one new
    twin = tiktoken_twin(tok)
    assert twin is not None
    for text in ["abc abcab", "zzabc", "a zz b", "plain"]:
        assert twin.encode_batch([text])[0].tolist() == tok.encode(text).ids


def test_letters_of_recent_unicode_split_as_the_library_splits_them():
    """U+1C89 is a letter since Unicode 16: tokenizers before 0.21.4 split it off as a
    non-letter while tiktoken keeps it in the word (pyproject requires tokenizers >= 0.22)."""
    tok = _byte_level_bpe([("Ð", "¯"), ("Ð¯", "á")])
    twin = tiktoken_twin(tok)
    assert twin is not None
    for text in ["Я\u1c89", "Я\U00010d4a x", "\U0002ebf0Я"]:
        assert twin.encode_batch([text])[0].tolist() == tok.encode(text).ids


@pytest.mark.parametrize(
    "setting, threads", [("false", 1), ("0", 1), ("", 1), ("N", 1), (None, None), ("true", None)]
)
def test_the_encoder_threads_follow_tokenizers_parallelism(monkeypatch, setting, threads):
    from stackwise.data.fast_bpe import encoder_threads

    if setting is None:
        monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    else:
        monkeypatch.setenv("TOKENIZERS_PARALLELISM", setting)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    assert encoder_threads() == (threads or 3)


def test_the_store_stream_is_the_same_with_and_without_the_fast_path(bpe, monkeypatch):
    from stackwise.data.fast_bpe import TiktokenTwin

    texts = [make_corpus(60, seed=2), "one <eos> inside", "", make_corpus(30, seed=3)]
    monkeypatch.setattr("stackwise.data.fast_bpe.TASK_CHARS", 256)  # several tasks a batch
    monkeypatch.setattr("stackwise.data.fast_bpe.encoder_threads", lambda: 2)
    real, calls = TiktokenTwin.encode_batch, []
    monkeypatch.setattr(
        TiktokenTwin, "encode_batch", lambda self, b: (calls.append(len(b)), real(self, b))[1]
    )
    fast = tz.token_stream(bpe, texts, bpe.eos_token_id)
    assert calls  # the fast path was taken
    monkeypatch.setattr("stackwise.data.fast_bpe.tiktoken_twin", lambda backend: None)
    slow = tz.token_stream(bpe, texts, bpe.eos_token_id)
    assert fast.tolist() == slow.tolist() and len(fast) > 500


def _scanned_cut(text: str, lo: int, hi: int) -> int:
    """The cut as a forward regex scan finds it: the last space or newline after a non-space."""
    found = [m.start() for m in re.finditer(r"(?<=\S)[ \n]", text[:hi]) if m.start() >= lo]
    return found[-1] if found else -1


@settings(max_examples=300, deadline=None)
@given(
    st.text(alphabet=" \n\t\u00a0\u2028ab.", max_size=80),
    st.integers(0, 80),
    st.integers(0, 80),
)
def test_the_backward_word_cut_finds_the_cut_the_forward_scan_finds(text, lo, hi):
    lo, hi = min(lo, hi, len(text)), min(max(lo, hi), len(text))
    assert tz.word_cut(text, lo, hi) == _scanned_cut(text, lo, hi)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(alphabet="ab", max_size=30), max_size=20), st.integers(1, 40))
def test_the_threads_runs_keep_the_order_and_gather_short_texts(texts, chars):
    from stackwise.data.fast_bpe import runs_of

    runs = runs_of(texts, chars)
    assert [t for run in runs for t in run] == texts and all(runs)
    assert all(sum(map(len, run)) >= chars for run in runs[:-1])  # only the last falls short
    assert all(sum(map(len, run[:-1])) < chars for run in runs)  # none takes more than it needs
