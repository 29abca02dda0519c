"""The token store: built once per corpus and tokenizer, memory-mapped after, rebuilt when its
manifest does not vouch for it; globs in data.files; training from it resumes exactly."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import make_corpus
from test_checkpoints import resume_pair
from test_data import files_cfg

import stackwise.data.store as store_mod
from stackwise.data.pack import build_data
from stackwise.data.tokenize import token_stream
from stackwise.errors import StackWiseError
from stackwise.pipeline import train_from_config


@pytest.fixture
def corpus_dir(tmp_path):
    folder = tmp_path / "corpus"
    (folder / "more").mkdir(parents=True)
    for i in range(3):
        (folder / f"part{i}.txt").write_text(make_corpus(30, seed=i), encoding="utf-8")
    (folder / "more" / "part3.txt").write_text(make_corpus(30, seed=3), encoding="utf-8")
    return folder


def builds(monkeypatch) -> list[str]:
    """Record every store build (and still build)."""
    calls: list[str] = []
    real = store_mod.build_store

    def spy(folder, *args, **kwargs):
        calls.append(folder.name)
        return real(folder, *args, **kwargs)

    monkeypatch.setattr(store_mod, "build_store", spy)
    return calls


def stored(data) -> torch.Tensor:
    return torch.cat([data.train.blocks.flatten(), data.val.blocks.flatten()]).long()


def test_a_second_run_maps_the_store_without_tokenizing(corpus_dir, tmp_path, monkeypatch):
    calls = builds(monkeypatch)
    cfg = files_cfg(sorted(corpus_dir.glob("*.txt")), tmp_path / "cache", tokenizer="char")
    first = build_data(cfg)
    assert len(calls) == 1
    texts = [p.read_text(encoding="utf-8") for p in sorted(corpus_dir.glob("*.txt"))]
    expected = token_stream(first.tokenizer, texts, first.tokenizer.eos_token_id).long()
    assert first.n_tokens == expected.numel() and first.n_documents == 3
    head = first.train.blocks.flatten().long()
    assert torch.equal(head, expected[: head.numel()])

    def no_tokenizing(*args, **kwargs):
        raise AssertionError("the store was rebuilt")

    monkeypatch.setattr(store_mod, "build_store", no_tokenizing)
    monkeypatch.setattr(store_mod, "token_chunks", no_tokenizing)
    second = build_data(cfg)
    assert torch.equal(stored(second), stored(first))
    assert second.train.blocks.dtype == torch.uint16  # a char vocabulary fits in 16 bits
    base = second.train.blocks
    while base._base is not None:  # the blocks are a view of the file, not a copy in memory
        base = base._base
    assert base.numel() == first.n_tokens


@pytest.mark.parametrize("damage", ["truncated", "flipped", "no manifest", "other key"])
def test_a_damaged_or_unfinished_store_is_rebuilt(corpus_dir, tmp_path, monkeypatch, damage):
    cfg = files_cfg(sorted(corpus_dir.glob("*.txt")), tmp_path / "cache", tokenizer="char")
    good = stored(build_data(cfg))
    (folder,) = [p for p in (tmp_path / "cache" / "token-stores").iterdir() if p.is_dir()]
    tokens, manifest = folder / "tokens.bin", folder / "manifest.json"
    if damage == "truncated":
        tokens.write_bytes(tokens.read_bytes()[:-2])
    elif damage == "flipped":
        raw = bytearray(tokens.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        tokens.write_bytes(bytes(raw))
    elif damage == "no manifest":
        manifest.unlink()
    else:
        manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "key": "x"}))
    calls = builds(monkeypatch)
    again = build_data(cfg)
    assert len(calls) == 1 and torch.equal(stored(again), good)


def test_ids_past_16_bits_are_stored_as_uint32():
    assert store_mod._dtype(50_000) == np.uint16 and store_mod._dtype(65_536) == np.uint16
    assert store_mod._dtype(65_537) == np.uint32


def test_a_changed_file_gets_a_new_store(corpus_dir, tmp_path, monkeypatch):
    calls = builds(monkeypatch)
    cfg = files_cfg(sorted(corpus_dir.glob("*.txt")), tmp_path / "cache", tokenizer="char")
    build_data(cfg)
    with (corpus_dir / "part0.txt").open("a", encoding="utf-8") as fh:
        fh.write(" and a new line.")
    bigger = build_data(cfg)
    assert len(calls) == 2 and bigger.n_tokens > 0


def test_globs_expand_in_order_and_a_pattern_without_files_is_an_error(corpus_dir, tmp_path):
    listed = [*sorted(corpus_dir.glob("*.txt")), corpus_dir / "more" / "part3.txt"]
    by_list = build_data(files_cfg(listed, tmp_path / "c1", tokenizer="char"))
    globs = [corpus_dir / "*.txt", corpus_dir / "more" / "**" / "*.txt"]
    pattern = files_cfg(globs, tmp_path / "c2", tokenizer="char")
    by_glob = build_data(pattern)
    assert by_glob.n_documents == 4 and torch.equal(stored(by_glob), stored(by_list))
    nothing = pattern.model_copy(update={"files": [str(corpus_dir / "*.md")]})
    with pytest.raises(StackWiseError, match=r"pattern '.*\*\.md' matches no file"):
        build_data(nothing)


def test_training_on_a_globbed_corpus_resumes_exactly(tiny, corpus_dir, tmp_path):
    data = {"source": "files", "files": [str(corpus_dir / "**" / "*.txt")], "tokenizer": "char"}
    a, b = resume_pair(tiny, tmp_path, data=data)
    wa, wb = a.rack.state_dict(), b.rack.state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert a.state.history == b.state.history


@pytest.fixture
def saved_dir(tmp_path):
    from datasets import Dataset

    folder = tmp_path / "saved"
    rows = [{"text": make_corpus(20, seed=s), "id": s} for s in range(6)]
    Dataset.from_list(rows).save_to_disk(str(folder))
    return folder, [r["text"] for r in rows]


def dataset_source(tiny, tmp_path, key: str, value: str, texts: list[str]):
    """Build the store from `data.<key>: value` (each text one document, in order), then train
    from it, crash and resume: both bit for bit. Returns the DataConfig."""
    from stackwise.config import DataConfig

    cfg = DataConfig(
        source="files", tokenizer="char", seq_len=32, cache_dir=str(tmp_path / "cache"),
        **{key: value},
    )  # fmt: skip
    data = build_data(cfg)
    assert data.n_documents == len(texts)
    expected = token_stream(data.tokenizer, texts, data.tokenizer.eos_token_id).long()
    head = data.train.blocks.flatten().long()
    assert torch.equal(head, expected[: head.numel()])
    source = {"source": "files", "files": [], key: value, "tokenizer": "char"}
    a, b = resume_pair(tiny, tmp_path, data=source)
    wa, wb = a.rack.state_dict(), b.rack.state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert a.state.history == b.state.history
    return cfg


def test_a_save_to_disk_folder_is_a_corpus_and_resumes_exactly(tiny, saved_dir, tmp_path):
    folder, texts = saved_dir
    dataset_source(tiny, tmp_path, "dataset_dir", str(folder), texts)


def test_files_and_a_dataset_dir_together_are_refused(saved_dir, corpus_dir):
    from stackwise.config import DataConfig

    with pytest.raises(Exception, match="not both"):
        DataConfig(
            source="files", files=[str(corpus_dir / "part0.txt")], dataset_dir=str(saved_dir[0])
        )
    with pytest.raises(StackWiseError, match="not a folder written by datasets"):
        build_data(DataConfig(source="files", dataset_dir=str(corpus_dir), tokenizer="char"))


def test_a_named_dataset_trains_from_its_arrow_files_and_resumes(tiny, tmp_path, monkeypatch):
    """data.dataset_name goes through datasets.load_dataset (here a local dataset folder, as a
    hub name resolves from the offline cache); its Arrow files feed the store."""
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))
    folder = tmp_path / "named"
    folder.mkdir()
    texts = [make_corpus(20, seed=s) for s in range(5)]
    (folder / "train.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    cfg = dataset_source(tiny, tmp_path, "dataset_name", str(folder), texts)
    sliced = cfg.model_copy(update={"dataset_split": "train[:50%]"})
    with pytest.raises(StackWiseError, match="not whole Arrow files"):
        build_data(sliced)


def test_loader_workers_read_the_mapped_store_and_resume_exactly(tiny, tmp_path):
    """Two DataLoader workers (forked, sharing the memory map) give the run that a crash and
    resume reproduces bit for bit."""
    a, b = resume_pair(tiny, tmp_path, data={"num_workers": 2})
    wa, wb = a.rack.state_dict(), b.rack.state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert a.state.history == b.state.history
    plain = train_from_config(
        tiny(train={"max_steps": 8, "output_dir": str(tmp_path / "p")}), quiet=True
    )
    wp = plain.rack.state_dict()
    assert all(torch.equal(wa[k], wp[k]) for k in wa)  # workers change nothing but speed


def test_pieces_cut_where_a_word_starts_so_the_stream_is_the_whole_documents():
    """Double spaces, one word per line and a tokenizer.json that truncates and pads: the
    store's ids equal the whole text's through the usual tokenizer call."""
    from stackwise.data.tokenize import token_chunks
    from stackwise.data.tokenizer import train_bpe

    texts = ["hello  world  " * 9000, "hello\nworld\n" * 12000]
    tok = train_bpe(texts, 300)
    tok._tokenizer.enable_truncation(5)
    tok._tokenizer.enable_padding(length=7)
    eos = tok.eos_token_id
    whole = [i for t in texts for i in [*tok(t, add_special_tokens=False)["input_ids"], eos]]
    pieces = [(t, True) for t in texts]
    got = torch.cat(list(token_chunks(tok, pieces, eos))).tolist()
    assert got == whole


def test_overlapping_patterns_read_each_file_once(corpus_dir, tmp_path):
    both = [corpus_dir / "*.txt", corpus_dir / "**" / "*.txt"]
    data = build_data(files_cfg(both, tmp_path / "cache", tokenizer="char"))
    assert data.n_documents == 4


def test_a_weighted_mix_draws_each_source_by_its_weight_and_resumes(
    tiny, corpus_dir, saved_dir, tmp_path
):
    """data.mix: a file pattern at weight 3 and a save_to_disk folder at weight 1. Every slot
    of an epoch is a real block of its source, the shares follow the weights through the epoch,
    and a crash and resume reproduces the run bit for bit."""
    from stackwise.config import DataConfig
    from stackwise.data.mix import MixedBlocks

    mix = [
        {"files": [str(corpus_dir / "*.txt")], "weight": 3.0},
        {"dataset_dir": str(saved_dir[0]), "weight": 1.0},
    ]
    cfg = DataConfig(
        source="files", mix=mix, tokenizer="char", seq_len=32, cache_dir=str(tmp_path / "c")
    )
    data = build_data(cfg)
    train = data.train
    assert isinstance(train, MixedBlocks)
    share = (train.source == 0).mean()
    assert abs(share - 0.75) < 0.01
    first_half = train.source[: len(train) // 2]
    assert abs((first_half == 0).mean() - 0.75) < 0.02  # interleaved, not one after the other
    for i in (0, 1, len(train) - 1):
        k, b = int(train.source[i]), int(train.index[i])
        assert torch.equal(train[i]["input_ids"], train.parts[k][b].long())
    assert data.n_documents == 3 + 6
    a, b = resume_pair(
        tiny, tmp_path, data={"source": "files", "files": [], "mix": mix, "tokenizer": "char"}
    )
    wa, wb = a.rack.state_dict(), b.rack.state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ({"mix": [{"files": ["a.txt"]}]}, "two or more sources"),
        ({"mix": [{"files": ["a.txt"]}, {}]}, "data.mix.1 needs exactly one"),
        ({"files": ["a.txt"], "mix": [{"files": ["b"]}, {"files": ["c"]}]}, "both name the data"),
        ({"mix": [{"files": ["a"]}, {"files": ["b"], "wieght": 2}]}, "data.mix.1.wieght"),
    ],
)
def test_mix_settings_that_cannot_work_are_refused(data, words):
    from stackwise.config import from_dict

    with pytest.raises(StackWiseError, match=words):
        from_dict({"data": {"source": "files", **data}})


def test_a_bad_row_is_named_by_its_place_in_the_file(tmp_path):
    """Rows are read in batches of 512; the error still counts from the top of the file."""
    rows = [{"text": f"line {i}"} for i in range(600)]
    rows[549] = {"text": 5}
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(StackWiseError, match="row 550: field 'text' is int"):
        build_data(files_cfg([path], tmp_path / "cache", tokenizer="char"))


def test_a_saved_folder_of_several_splits_without_train_is_refused(tmp_path):
    from datasets import Dataset, DatasetDict

    from stackwise.config import DataConfig

    folder = tmp_path / "splits"
    part = Dataset.from_list([{"text": make_corpus(5)}])
    DatasetDict({"first": part, "second": part}).save_to_disk(str(folder))
    cfg = DataConfig(source="files", dataset_dir=str(folder), tokenizer="char")
    with pytest.raises(StackWiseError, match="none is named train") as err:
        build_data(cfg)
    assert str(folder / "first") in str(err.value)  # the fix names a folder that works
    one = build_data(cfg.model_copy(update={"dataset_dir": str(folder / "first")}))
    assert one.n_documents == 1


def test_processes_sharing_a_cache_train_one_bpe(tmp_path, monkeypatch):
    """Two trainers of the same tokenizer at once (as DDP ranks are): one trains, the other
    waits on the lock and loads what the first saved."""
    import threading
    import time

    import stackwise.data.tokenizer as tokenizer_mod

    real, calls = tokenizer_mod.train_bpe, []

    def slow(texts, vocab_size, every):
        calls.append(1)
        time.sleep(0.5)  # long enough for the other thread to reach the lock
        return real(texts, vocab_size, every)

    monkeypatch.setattr(tokenizer_mod, "train_bpe", slow)
    texts = [make_corpus(50)]
    results = []

    def build():
        results.append(tokenizer_mod.corpus_tokenizer(texts, 300, str(tmp_path), "k"))

    threads = [threading.Thread(target=build) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(results) == 2
    assert results[0].get_vocab() == results[1].get_vocab()


def test_a_corpus_and_a_mix_measure_their_files_for_the_bpe_sample(corpus_dir, tmp_path, capsys):
    """The sample's stride comes from the files' size; a corpus above data.bpe_sample_mb says
    how much of it the BPE reads, and caches that BPE apart from the whole corpus's."""
    from stackwise.data.documents import Corpus
    from stackwise.data.mix import Sources

    files = sorted(corpus_dir.rglob("*.txt"))
    cfg = files_cfg([corpus_dir / "**" / "*.txt"], tmp_path / "cache")
    corpus = Corpus(cfg)
    assert corpus.size_bytes == sum(f.stat().st_size for f in files) == corpus.total_bytes
    assert Sources([corpus, Corpus(cfg)]).size_bytes == 2 * corpus.size_bytes
    third = corpus.size_bytes / 2.5e6  # MB: one piece in 3 (2.5 rounded up, clear of rounding)
    data = build_data(cfg.model_copy(update={"bpe_sample_mb": third}))
    assert "one piece in 3 of the corpus" in capsys.readouterr().err
    whole = build_data(cfg.model_copy(update={"bpe_sample_mb": None}))
    names = sorted(p.name for p in (tmp_path / "cache" / "tokenizers").iterdir())
    assert len(names) == 2 and {n.split("-300")[1] for n in names} == {"", "-every3"}
    assert data.tokenizer.get_vocab() != whole.tokenizer.get_vocab()
