"""Data: the default corpus, local files in every format, packing, tokenizers, and data errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from conftest import make_corpus
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

import stackwise.data.tokenizer as tokmod
from stackwise.config import DataConfig
from stackwise.data.corpus import shakespeare_dir, shakespeare_documents
from stackwise.data.pack import build_data, pack_stream, to_blocks
from stackwise.data.sources import load_documents
from stackwise.data.tokenizer import SPECIALS, corpus_tokenizer, train_bpe
from stackwise.errors import StackWiseError

DOCS = [make_corpus(40, seed=s) for s in range(3)]


def files_cfg(files: list[Path], cache: Path, **kw: Any) -> DataConfig:
    base: dict[str, Any] = {
        "source": "files",
        "files": [str(f) for f in files],
        "seq_len": 32,
        "bpe_vocab_size": 300,
        "cache_dir": str(cache),
    }
    base.update(kw)
    if base.get("tokenizer") in ("char", "byte"):
        base.pop("bpe_vocab_size")  # only the BPE reads it
    return DataConfig(**base)


def texts_of(files: list[Path], cache: Path, **kw: Any) -> list[str]:
    return [t for _, t in load_documents(files_cfg(files, cache, **kw))]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def stream_of(data_texts: list[str], tok: Any) -> torch.Tensor:
    ids = tok(data_texts, add_special_tokens=False)["input_ids"]
    return pack_stream(ids, tok.eos_token_id)


# --- the default corpus ----------------------------------------------------------------------


def test_default_corpus_is_the_gutenberg_texts_only():
    folder = shakespeare_dir()  # the real default cache: downloaded once per machine
    names = sorted(p.name for p in folder.glob("*"))
    assert len(names) >= 30
    assert all(n.endswith("_gut.txt") for n in names), names
    assert not any(n.endswith("_f.txt") or "_f_" in n for n in names)
    assert "hamlet_gut.txt" in names and "sonnets_gut.txt" in names
    hamlet = (folder / "hamlet_gut.txt").read_text(encoding="utf-8")
    assert "Hamlet" in hamlet and len(hamlet) > 100_000
    # a second call reuses the cache (same folder, no second download)
    assert shakespeare_dir() == folder
    docs = shakespeare_documents()
    assert [n for n, _ in docs] == names


def test_default_split_is_deterministic_and_val_is_the_stream_tail():
    cfg = DataConfig()
    a, b = build_data(cfg), build_data(cfg)
    assert torch.equal(a.train.blocks, b.train.blocks)
    assert torch.equal(a.val.blocks, b.val.blocks)
    assert a.n_documents == 42

    texts = [t for _, t in shakespeare_documents()]
    stream = stream_of(texts, a.tokenizer)
    assert stream.numel() == a.n_tokens
    n_val = max(cfg.seq_len, int(stream.numel() * cfg.val_fraction))
    n_train = a.train.blocks.numel()
    # train is the head of the stream, val the tail, and they do not overlap
    assert n_train <= stream.numel() - n_val
    assert torch.equal(a.train.blocks.flatten().long(), stream[:n_train].long())
    tail = stream[-n_val:]
    assert torch.equal(a.val.blocks.flatten().long(), tail[: a.val.blocks.numel()].long())
    assert a.val.blocks.numel() >= n_val - cfg.seq_len
    assert a.train.blocks.shape[1] == a.val.blocks.shape[1] == cfg.seq_len


# --- local files -----------------------------------------------------------------------------


def test_txt_jsonl_json_and_parquet_all_load(tmp_path, cache_dir):
    txt = tmp_path / "a.txt"
    txt.write_text(DOCS[0], encoding="utf-8")
    jsonl = write_jsonl(tmp_path / "b.jsonl", [{"text": d} for d in DOCS])
    js = tmp_path / "c.json"
    js.write_text(json.dumps([{"text": d, "n": i} for i, d in enumerate(DOCS)]), "utf-8")
    pqt = tmp_path / "d.parquet"
    pq.write_table(pa.table({"text": DOCS, "id": [1, 2, 3]}), pqt)

    # a .txt file is one document, kept whole
    assert texts_of([txt], cache_dir) == [DOCS[0]]
    assert texts_of([jsonl], cache_dir) == DOCS
    assert texts_of([js], cache_dir) == DOCS
    assert texts_of([pqt], cache_dir) == DOCS
    # several files: in the order given, each document named by its file
    docs = load_documents(files_cfg([pqt, txt], cache_dir))
    assert [n for n, _ in docs] == [str(pqt)] * 3 + [str(txt)]
    data = build_data(files_cfg([txt, jsonl, js, pqt], cache_dir))
    assert data.n_documents == 1 + 3 + 3 + 3
    assert len(data.train) > 0 and len(data.val) > 0


def test_text_field_as_a_name_and_as_a_list(tmp_path, cache_dir):
    rows = [
        {"title": "Title one", "body": "Body one.", "other": 1},
        {"title": "Title two", "body": "Body two."},
        {"title": None, "body": "Only a body."},
    ]
    path = write_jsonl(tmp_path / "rows.jsonl", rows)
    assert texts_of([path], cache_dir, text_field="body") == [
        "Body one.",
        "Body two.",
        "Only a body.",
    ]
    assert texts_of([path], cache_dir, text_field=["title", "body"]) == [
        "Title one\n\nBody one.",
        "Title two\n\nBody two.",
        "Only a body.",
    ]
    pqt = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"q": ["a?", "b?"], "a": ["A.", "B."]}), pqt)
    assert texts_of([pqt], cache_dir, text_field=["q", "a"]) == ["a?\n\nA.", "b?\n\nB."]


def test_format_override_reads_an_odd_suffix(tmp_path, cache_dir):
    odd = write_jsonl(tmp_path / "corpus.data", [{"text": d} for d in DOCS])
    with pytest.raises(StackWiseError, match="format"):
        texts_of([odd], cache_dir)
    assert texts_of([odd], cache_dir, format="json") == DOCS
    raw = tmp_path / "corpus.log"
    raw.write_text(DOCS[1], encoding="utf-8")
    assert texts_of([raw], cache_dir, format="text") == [DOCS[1]]


# --- packing ---------------------------------------------------------------------------------


def test_pack_stream_puts_eos_after_every_document():
    stream = pack_stream([[5, 6], [], [7, 8, 9]], eos_id=2)
    assert stream.tolist() == [5, 6, 2, 2, 7, 8, 9, 2]
    assert to_blocks(stream, 3).tolist() == [[5, 6, 2], [2, 7, 8]]


def test_documents_are_eos_separated_in_fixed_length_blocks(tmp_path, cache_dir):
    path = write_jsonl(tmp_path / "docs.jsonl", [{"text": d} for d in DOCS])
    cfg = files_cfg([path], cache_dir, seq_len=16, val_fraction=0.1)
    data = build_data(cfg)
    tok = data.tokenizer
    eos = tok.eos_token_id
    ids = [tok(d, add_special_tokens=False)["input_ids"] for d in DOCS]
    assert all(eos not in x for x in ids)
    expected = torch.tensor(ids[0] + [eos] + ids[1] + [eos] + ids[2] + [eos])
    assert data.n_tokens == expected.numel()
    both = torch.cat([data.train.blocks.flatten(), data.val.blocks.flatten()])
    # the head of the stream is exactly document, EOS, document, ...
    assert torch.equal(data.train.blocks.flatten().long(), expected[: data.train.blocks.numel()])
    assert int((both == eos).sum()) <= 3
    assert int((data.train.blocks == eos).sum()) >= 2  # both boundaries fall in train
    assert data.train.blocks.shape[1] == data.val.blocks.shape[1] == 16
    item = data.train[0]["input_ids"]
    assert item.shape == (16,) and item.dtype == torch.long


def test_num_samples_caps_the_training_sequences(tmp_path, cache_dir):
    path = tmp_path / "c.txt"
    path.write_text(make_corpus(200), encoding="utf-8")
    full = build_data(files_cfg([path], cache_dir))
    assert len(full.train) > 10
    capped = build_data(files_cfg([path], cache_dir, num_samples=10))
    assert len(capped.train) == 10
    assert torch.equal(capped.train.blocks, full.train.blocks[:10])
    assert torch.equal(capped.val.blocks, full.val.blocks)  # the cap leaves validation alone
    bigger = build_data(files_cfg([path], cache_dir, num_samples=10**6))
    assert len(bigger.train) == len(full.train)


# --- tokenizers ------------------------------------------------------------------------------


def test_trained_bpe_has_distinct_special_tokens():
    tok = train_bpe([make_corpus(100)], 300)
    ids = {name: getattr(tok, f"{name}_id") for name in SPECIALS}
    assert all(isinstance(i, int) for i in ids.values()), ids
    assert len(set(ids.values())) == 4
    assert {getattr(tok, name) for name in SPECIALS} == set(SPECIALS.values())
    assert len(tok) <= 300
    text = "The king hath a sweet crown."
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text


def test_bpe_is_cached_by_corpus_hash_and_vocab_size(tmp_path, monkeypatch):
    texts = [make_corpus(120, seed=7)]
    cache = tmp_path / "cache"
    first = corpus_tokenizer(texts, 300, str(cache))
    entries = sorted((cache / "tokenizers").iterdir())
    assert len(entries) == 1 and (entries[0] / "tokenizer.json").is_file()
    assert entries[0].name.endswith("-300")

    def no_training(*_: Any, **__: Any) -> Any:
        raise AssertionError("retrained a cached tokenizer")

    monkeypatch.setattr(tokmod, "train_bpe", no_training)
    second = corpus_tokenizer(texts, 300, str(cache))  # must come from the cache
    sample = texts[0][:500]
    assert second(sample)["input_ids"] == first(sample)["input_ids"]
    assert second.get_vocab() == first.get_vocab()
    for name in SPECIALS:
        assert getattr(second, f"{name}_id") == getattr(first, f"{name}_id")

    # a different vocab size, or a different corpus, is a new entry: training is attempted
    with pytest.raises(AssertionError, match="retrained"):
        corpus_tokenizer(texts, 320, str(cache))
    with pytest.raises(AssertionError, match="retrained"):
        corpus_tokenizer([texts[0] + "x"], 300, str(cache))
    monkeypatch.undo()
    corpus_tokenizer(texts, 320, str(cache))
    names = sorted(p.name for p in (cache / "tokenizers").iterdir())
    assert len(names) == 2 and {n.rsplit("-", 1)[1] for n in names} == {"300", "320"}


def test_the_bpe_learns_from_one_piece_in_k_and_names_the_sample(tmp_path, capsys):
    """Above data.bpe_sample_mb the BPE reads one piece in k: a word only the skipped pieces
    hold gets no merge, the sample is said once, and it has its own cache entry. Below it the
    corpus is read whole, under the key a whole-corpus BPE always had."""
    texts = [make_corpus(30, seed=1), "qzqx " * 800, make_corpus(30, seed=2), "vwvw " * 800]
    assert all(len(t) < tokmod.SAMPLE_CHARS for t in texts)  # a piece each
    size = sum(len(t.encode()) for t in texts)
    assert tokmod.sample_stride(texts, None) == 1 and tokmod.sample_stride(texts, 1.0) == 1
    assert tokmod.sample_stride(texts, size / 2e6) == 2
    cache = tmp_path / "cache"
    whole = corpus_tokenizer(texts, 300, str(cache), sample_mb=1.0)
    sampled = corpus_tokenizer(texts, 300, str(cache), sample_mb=size / 2e6)
    assert "one piece in 2 of the corpus" in capsys.readouterr().err
    names = sorted(p.name for p in (cache / "tokenizers").iterdir())
    assert [n.endswith("-300") for n in names].count(True) == 1
    assert [n.endswith("-300-every2") for n in names].count(True) == 1
    for tok, merged in ((whole, True), (sampled, False)):
        assert (len(tok.tokenize(" qzqx")) == 1) is merged  # only the skipped piece has qzqx
        assert len(tok.tokenize(" vwvw")) > 1 or merged  # nor vwvw, the other skipped one


@pytest.mark.parametrize("name", [None, "char", "byte"])
def test_a_built_tokenizer_reloads_without_the_auto_registry(tmp_path, name):
    """Our tokenizers with a chat template (as a chat run saves them) reload as transformers'
    plain fast class, not through AutoTokenizer (whose model registry costs every process
    seconds): the same tokenizer, chat template included. (Without a template they reload as
    our PlainTokenizer: tests/test_plain_tokenizer.py.)"""
    from transformers import AutoTokenizer

    built = tokmod.make_tokenizer(name, [*DOCS, ODD_TEXT], 300, str(tmp_path)).to_transformers()
    built.chat_template = "{% for m in messages %}{{ m['content'] }}{{ eos_token }}{% endfor %}"
    folder = tmp_path / "saved"
    built.save_pretrained(str(folder))
    assert tokmod._loader(folder) is PreTrainedTokenizerFast
    fast, auto = tokmod.load_tokenizer_dir(folder), AutoTokenizer.from_pretrained(str(folder))
    assert type(fast) is type(auto) and repr(fast) == repr(auto)  # specials, sides, lengths
    assert fast.get_vocab() == auto.get_vocab() and fast.all_special_ids == auto.all_special_ids
    assert fast.chat_template == auto.chat_template == built.chat_template
    for text in (ODD_TEXT, DOCS[0][:300]):
        assert fast(text)["input_ids"] == auto(text)["input_ids"]
    chat = [{"role": "user", "content": "Hail"}]
    assert fast.apply_chat_template(chat, tokenize=False) == "Hail<eos>"
    # a model's folder (its config.json may choose the class), a folder saved as another
    # class, or one with no readable config: AutoTokenizer decides
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    assert tokmod._loader(folder) is AutoTokenizer
    (folder / "config.json").unlink()
    config = folder / "tokenizer_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "tokenizer_class": "X"}))
    assert tokmod._loader(folder) is AutoTokenizer
    config.write_text("[1, 2]")
    assert tokmod._loader(folder) is AutoTokenizer


def test_loading_our_tokenizer_leaves_the_auto_registry_unimported(tmp_path):
    folder = tmp_path / "char"
    tokmod.char_tokenizer(DOCS).save_pretrained(str(folder))
    code = (
        "import sys; from stackwise.data.tokenizer import load_tokenizer_dir; "
        f"load_tokenizer_dir({str(folder)!r}); "
        "print(sorted(m for m in sys.modules if m.startswith('transformers.models.auto')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_build_data_uses_the_cache_dir_for_its_tokenizer(tmp_path, monkeypatch):
    path = tmp_path / "c.txt"
    path.write_text(make_corpus(80, seed=3), encoding="utf-8")
    cfg = files_cfg([path], tmp_path / "cache")
    a = build_data(cfg)
    monkeypatch.setattr(tokmod, "train_bpe", lambda *_: pytest.fail("retrained"))
    b = build_data(cfg)
    assert torch.equal(a.train.blocks, b.train.blocks)


def test_local_hf_tokenizer_dir_gets_missing_specials(tmp_path, cache_dir, monkeypatch):
    raw = Tokenizer(models.BPE(unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    raw.train_from_iterator(
        [make_corpus(100)],
        trainer=trainers.BpeTrainer(vocab_size=200, special_tokens=["[UNK]", "</s>"]),
    )
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]", eos_token="</s>")
    folder = tmp_path / "my-tokenizer"
    tok.save_pretrained(str(folder))
    n_before = len(tok)
    eos_before = tok.eos_token_id

    corpus = tmp_path / "c.txt"
    corpus.write_text(make_corpus(100), encoding="utf-8")
    cfg = DataConfig(
        source="files",
        files=[str(corpus)],
        seq_len=16,
        tokenizer=str(folder),
        cache_dir=str(cache_dir),
    )
    monkeypatch.setattr(tokmod, "train_bpe", lambda *_: pytest.fail("trained a BPE"))
    data = build_data(cfg)
    got = data.tokenizer
    assert got.eos_token == "</s>" and got.eos_token_id == eos_before  # kept, not replaced
    assert got.pad_token == "<pad>" and got.bos_token == "<bos>" and got.mask_token == "<mask>"
    assert len(got) == n_before + 3
    sp = data.specials
    assert len({sp.pad_id, sp.bos_id, sp.eos_id, sp.mask_id}) == 4
    assert sp.vocab_size == len(got)
    # the corpus was encoded with this tokenizer (EOS between documents is its </s>)
    ids = got(make_corpus(100), add_special_tokens=False)["input_ids"]
    assert data.train.blocks.flatten()[:50].tolist() == ids[:50]


# --- errors name the file --------------------------------------------------------------------


def expect_error(cfg: DataConfig, *needles: str) -> str:
    with pytest.raises(StackWiseError) as info:
        build_data(cfg)
    msg = str(info.value)
    for n in needles:
        assert n in msg, (n, msg)
    return msg


def test_missing_and_empty_files(tmp_path, cache_dir):
    missing = tmp_path / "nope.txt"
    expect_error(files_cfg([missing], cache_dir), str(missing), "does not exist")
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    expect_error(files_cfg([empty], cache_dir), str(empty), "empty")
    blank = tmp_path / "blank.txt"
    blank.write_text("  \n\n  \n", encoding="utf-8")
    expect_error(files_cfg([blank], cache_dir), str(blank), "no text")
    blank_rows = write_jsonl(tmp_path / "blank.jsonl", [{"text": None}, {"text": None}])
    expect_error(files_cfg([blank_rows], cache_dir), str(blank_rows))


def test_non_utf8_names_file_and_line(tmp_path, cache_dir):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes(b"first line\nsecond line\nthird caf\xe9 line\n")
    expect_error(files_cfg([bad], cache_dir), str(bad), "UTF-8", "line 3")
    bad_json = tmp_path / "latin1.jsonl"
    bad_json.write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n')
    expect_error(files_cfg([bad_json], cache_dir), str(bad_json), "UTF-8", "line 2")
    truncated = tmp_path / "cut.txt"
    truncated.write_bytes("fine text \u00e9".encode()[:-1])
    expect_error(files_cfg([truncated], cache_dir), str(truncated), "UTF-8")


def test_non_utf8_line_is_right_past_the_first_read_chunk(tmp_path, cache_dir):
    bad = tmp_path / "big.txt"
    line = b"x" * 99 + b"\n"  # 100 bytes a line; the decoder reads 1 MiB at a time
    bad.write_bytes(line * 15_000 + b"bad \xff byte\n" + line * 10)
    expect_error(files_cfg([bad], cache_dir), str(bad), "line 15001", "offset 1500004")


def test_invalid_jsonl_names_the_file(tmp_path, cache_dir):
    bad = tmp_path / "broken.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": "unterminated\n', encoding="utf-8")
    expect_error(files_cfg([bad], cache_dir), str(bad), "json")


def test_missing_text_field_lists_the_fields(tmp_path, cache_dir):
    path = write_jsonl(tmp_path / "rows.jsonl", [{"body": "a", "title": "b"}])
    msg = expect_error(files_cfg([path], cache_dir), str(path), "'text'")
    assert "body" in msg and "title" in msg
    expect_error(
        files_cfg([path], cache_dir, text_field=["title", "summary"]), str(path), "'summary'"
    )


def test_non_string_field_is_refused(tmp_path, cache_dir):
    path = write_jsonl(tmp_path / "nums.jsonl", [{"text": 1}, {"text": 2}])
    expect_error(files_cfg([path], cache_dir), str(path), "'text'", "int", "row 1")
    nested = write_jsonl(tmp_path / "nested.jsonl", [{"text": {"a": "b"}}])
    expect_error(files_cfg([nested], cache_dir), str(nested), "not text")


def test_corpus_too_small_for_one_block(tmp_path, cache_dir):
    small = tmp_path / "small.txt"
    small.write_text("The king hath a crown.\n", encoding="utf-8")
    expect_error(
        files_cfg([small], cache_dir, seq_len=32, bpe_vocab_size=300),
        str(small),
        "seq_len",
    )


# --- character- and byte-level tokenizers, and bits per character ---------------------------

ODD_TEXT = "Thou art é, naïve—\nKING. O!\ttab"


def test_char_tokenizer_round_trips_and_has_every_special(tmp_path):
    texts = [*DOCS, ODD_TEXT]
    tok = tokmod.make_tokenizer("char", texts, 2048, str(tmp_path))
    for name in SPECIALS:
        assert getattr(tok, f"{name}_id") is not None
    ids = tok(ODD_TEXT, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(ODD_TEXT)  # one token per character
    assert tok.decode(ids) == ODD_TEXT
    assert len(tok) == len(set("".join(texts))) + len(SPECIALS) + 1  # + <unk>
    unseen = tok("Zq€", add_special_tokens=False)["input_ids"]
    assert tok.unk_token_id in unseen  # characters not in the corpus are <unk>, not dropped
    # cached by corpus hash: a second build loads the same vocabulary from disk
    again = tokmod.make_tokenizer("char", texts, 2048, str(tmp_path))
    assert again.get_vocab() == tok.get_vocab()
    assert any(p.name.startswith("char-v1-") for p in (tmp_path / "tokenizers").iterdir())


def test_byte_tokenizer_covers_every_byte(tmp_path):
    tok = tokmod.make_tokenizer("byte", [], 2048, str(tmp_path))
    assert len(tok) == 256 + len(SPECIALS)
    ids = tok(ODD_TEXT, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(ODD_TEXT.encode("utf-8"))
    assert tok.decode(ids) == ODD_TEXT
    assert tok.mask_token_id is not None and tok.mask_token_id not in ids


@pytest.mark.parametrize("name", [None, "char", "byte"])
def test_bytes_per_token_spells_the_text(tmp_path, name):
    tok = tokmod.make_tokenizer(name, [*DOCS, ODD_TEXT], 300, str(tmp_path))
    from stackwise.data.token_bytes import bytes_per_token

    table = bytes_per_token(tok)
    for text in (ODD_TEXT, DOCS[0]):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert float(table[ids].sum()) == len(text.encode("utf-8"))
    assert table[tok.eos_token_id] == 1 and table[tok.mask_token_id] == 0


@pytest.mark.parametrize("key, value", [("bpe_vocab_size", 512), ("bpe_sample_mb", 8.0)])
def test_bpe_keys_with_a_char_tokenizer_are_refused(key, value):
    with pytest.raises(ValueError, match=f"{key} only applies"):
        DataConfig(tokenizer="char", **{key: value})


@pytest.mark.parametrize("objective", ["clm", "diffusion"])
def test_eval_reports_bits_per_character(corpus_file, cache_dir, tmp_path, objective):
    import math

    from conftest import tiny_dict

    from stackwise.config import from_dict
    from stackwise.pipeline import train_from_config

    raw = tiny_dict(corpus_file, cache_dir, tmp_path / "run", objective={"name": objective})
    raw["data"].pop("bpe_vocab_size")
    raw["data"]["tokenizer"] = "char"
    res = train_from_config(from_dict(raw), quiet=True)
    ev = res.state.history[-1]
    assert ev["bpc"] > 0
    if objective == "clm":  # one byte per token: bpc is the per-token NLL in bits
        assert ev["bpc"] == pytest.approx(math.log2(ev["ppl"]), rel=1e-6)
    else:  # every real token is one byte: the bound per character is the NELBO in bits
        assert ev["bpc"] == pytest.approx(ev["nelbo"] / math.log(2), rel=1e-6)
