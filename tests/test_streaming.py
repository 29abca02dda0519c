"""data.streaming: blocks cut from the corpus as it is read, resumed at a recorded position."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import make_corpus
from test_checkpoints import resume_pair

import stackwise.data.tokenize as tokenize_mod
from stackwise.config import DataConfig, from_dict
from stackwise.data.pack import build_data
from stackwise.data.tokenize import token_stream
from stackwise.errors import StackWiseError
from stackwise.pipeline import train_from_config
from stackwise.train.sampler import stream_loader


@pytest.fixture
def texts() -> list[str]:
    return [make_corpus(8, seed=s) for s in range(4)]  # about 36 blocks of 32 bytes


@pytest.fixture
def files(tmp_path, texts) -> str:
    folder = tmp_path / "corpus"
    folder.mkdir()
    for i, text in enumerate(texts):
        (folder / f"part{i}.txt").write_text(text, encoding="utf-8")
    return str(folder / "part*.txt")


def streamed(tmp_path, **data) -> DataConfig:
    base = {"source": "files", "tokenizer": "byte", "seq_len": 32, "streaming": True}
    return DataConfig(**base, stream_val_blocks=4, cache_dir=str(tmp_path / "cache"), **data)


def batches(data, start=None, shard=(0, 1), batch_size=4, workers=0) -> list[dict]:
    return list(stream_loader(data.train, start, shard, (batch_size, workers, 0), 0))


def test_the_stream_is_the_documents_cut_in_order_validation_first(tmp_path, files, texts):
    data = build_data(streamed(tmp_path, files=[files]))
    assert data.train_size == 0 and data.val.blocks.shape == (4, 32)
    expected = token_stream(data.tokenizer, texts, data.tokenizer.eos_token_id).long()
    got = torch.cat(
        [data.val.blocks.long().flatten()] + [b["input_ids"].flatten() for b in batches(data)]
    )
    assert got.numel() > 0.9 * expected.numel()  # only the last partial batch is left out
    assert torch.equal(got, expected[: got.numel()])
    assert not (tmp_path / "cache" / "token-stores").exists()  # nothing was stored


def test_ranks_split_the_stream_block_by_block(tmp_path, files):
    data = build_data(streamed(tmp_path, files=[files]))
    whole = torch.cat([b["input_ids"] for b in batches(data, batch_size=1)])
    ranks = [
        torch.cat([b["input_ids"] for b in batches(data, shard=(r, 2), batch_size=1)])
        for r in (0, 1)
    ]
    assert len(ranks[0]) == len(ranks[1]) == len(whole) // 2
    assert torch.equal(ranks[0], whole[0 : 2 * len(ranks[0]) : 2])
    assert torch.equal(ranks[1], whole[1 : 2 * len(ranks[1]) : 2])


def test_a_resumed_stream_goes_on_without_encoding_the_pieces_before_it(
    tmp_path, files, texts, monkeypatch
):
    """Each file is a piece; a position in the third file re-encodes only from there on."""
    data = build_data(streamed(tmp_path, files=[files]))
    first = batches(data)
    mid = next(i for i, b in enumerate(first) if b["stream_pos"][-1][0] == 2)
    position = first[mid]["stream_pos"][-1].tolist()
    encoded: list[str] = []
    real = tokenize_mod.batch_encoder

    def counting(tok):
        encode = real(tok)
        return lambda batch: (encoded.extend(batch), encode(batch))[1]

    monkeypatch.setattr(tokenize_mod, "batch_encoder", counting)
    rest = batches(data, start=position)
    assert len(rest) == len(first) - mid - 1
    assert all(
        torch.equal(a["input_ids"], b["input_ids"])
        for a, b in zip(rest, first[mid + 1 :], strict=True)
    )
    assert encoded == texts[2:]  # the files before the position were read, not encoded


def test_num_samples_caps_the_blocks_of_an_epoch(tmp_path, files):
    data = build_data(streamed(tmp_path, files=[files], num_samples=10))
    assert sum(len(b["input_ids"]) for b in batches(data, batch_size=2)) == 10


def run_resumed(tiny, tmp_path, **data):
    """Train 8 steps streamed (the tiny corpus wraps into a second epoch), crash at 4 and
    resume: both runs bit for bit."""
    data = {"tokenizer": "byte", "streaming": True, "stream_val_blocks": 4, **data}
    # dropout: a loader that drew from the global RNG on resume would shift every mask
    a, b = resume_pair(tiny, tmp_path, data=data, train={"batch_size": 8}, model={"dropout": 0.1})
    wa, wb = a.rack.state_dict(), b.rack.state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert a.state.history == b.state.history
    assert a.state.epoch >= 1  # the stream ended and began again
    return a


def test_a_streamed_multi_file_corpus_trains_and_resumes_exactly(tiny, tmp_path, files):
    run_resumed(tiny, tmp_path, files=[files])


def test_a_streamed_save_to_disk_folder_trains_and_resumes_exactly(tiny, tmp_path, texts):
    from datasets import Dataset

    folder = tmp_path / "saved"
    Dataset.from_list([{"text": t} for t in texts]).save_to_disk(str(folder))
    run_resumed(tiny, tmp_path, files=[], dataset_dir=str(folder))


def test_a_streamed_named_dataset_trains_and_resumes_exactly(tiny, tmp_path, texts, monkeypatch):
    """load_dataset(streaming=True) over a local dataset folder, as a hub name would be read."""
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))
    folder = tmp_path / "named"
    folder.mkdir()
    (folder / "train.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    run_resumed(tiny, tmp_path, files=[], dataset_name=str(folder))
    assert not (tmp_path / "hf-datasets").exists() or not any(
        (tmp_path / "hf-datasets").rglob("*.arrow")
    )


def test_one_loader_worker_reads_the_same_stream(tiny, tmp_path, files):
    runs = []
    for workers in (0, 1):
        data = {"files": [files], "tokenizer": "byte", "streaming": True, "num_workers": workers}
        out = str(tmp_path / f"w{workers}")
        runs.append(
            train_from_config(
                tiny(data=data, train={"max_steps": 4, "output_dir": out}), quiet=True
            )
        )
    wa, wb = runs[0].rack.state_dict(), runs[1].rack.state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.parametrize(
    ("data", "train", "words"),
    [
        ({"tokenizer": None}, {}, "pass over it"),
        ({"tokenizer": "char"}, {}, "pass over it"),
        ({"val_fraction": 0.1}, {}, "stream_val_blocks"),
        ({"num_workers": 2}, {}, "one reader"),
        ({}, {"num_train_epochs": 1}, "max_steps"),
        ({"streaming": False, "stream_val_blocks": 8}, {}, "set data.streaming"),
    ],
)
def test_stream_settings_that_cannot_work_are_refused(tmp_path, files, data, train, words):
    base = {"source": "files", "files": [files], "tokenizer": "byte", "streaming": True}
    with pytest.raises(StackWiseError, match=words):
        from_dict({"data": {**base, **data}, "train": train})


def test_per_stack_epochs_are_refused_on_a_stream(files):
    data = {"source": "files", "files": [files], "tokenizer": "byte", "streaming": True}
    progressive = {"strategy": "progressive", "steps_per_stack": 4, "stacks": {0: {"epochs": 1}}}
    with pytest.raises(StackWiseError, match=r"stacks\.<k>\.steps"):
        from_dict({"data": data, "model": {"n_stacks": 2}, "progressive": progressive})


def test_an_iterable_dataset_of_another_kind_is_refused(tiny):
    from stackwise.io.trained import build_rack
    from stackwise.objectives import Specials, build_objective
    from stackwise.pipeline import trainer_for as Trainer

    class Rows(torch.utils.data.IterableDataset):
        def __iter__(self):
            yield {"input_ids": torch.zeros(32, dtype=torch.long)}

    cfg = tiny()
    objective = build_objective(cfg, Specials(300, 0, 3, 1, 2))
    with pytest.raises(StackWiseError, match="iterable dataset"):
        Trainer(cfg, build_rack(cfg, 300), objective, Rows())


def test_too_short_a_stream_is_a_clear_error(tmp_path):
    (tmp_path / "a.txt").write_text("a few words only")
    with pytest.raises(StackWiseError, match="too few"):
        build_data(streamed(tmp_path, files=[str(tmp_path / "a.txt")]))


def test_progressive_growth_on_a_stream_resumes_bitwise(tiny, tmp_path, files):
    """Each stage reads the stream from its start; a crash inside stack 1 resumes from the
    position its checkpoint recorded."""
    from test_checkpoints import crash_then_resume
    from test_progressive import grown

    data = {"files": [files], "tokenizer": "byte", "streaming": True, "stream_val_blocks": 4}

    def cfg(name, **train):
        out = {"save_steps": 3, "batch_size": 8, "output_dir": str(tmp_path / name), **train}
        return grown(tiny, 2, {"steps_per_stack": 6}, data=data, train=out)

    full = train_from_config(cfg("full"), quiet=True)
    resumed = crash_then_resume(cfg, 1, 3)
    wa, wb = full.rack.state_dict(), resumed.rack.state_dict()
    assert [k for k in wa if not torch.equal(wa[k], wb[k])] == []
    assert [r.eval for r in full.progressive.stacks] == [r.eval for r in resumed.progressive.stacks]


def test_a_long_document_is_encoded_a_batch_at_a_time(tmp_path, monkeypatch):
    """One document far longer than a batch: the encoder never sees much more than
    BATCH_CHARS at once, and the tokens are the whole document's."""
    from stackwise.data.tokenizer import byte_tokenizer

    monkeypatch.setattr(tokenize_mod, "BATCH_CHARS", 2_000)
    monkeypatch.setattr(tokenize_mod, "PIECE_CHARS", 500)
    real, sizes = tokenize_mod.batch_encoder, []

    def recording(tok):
        encode = real(tok)
        return lambda batch: (sizes.append(sum(map(len, batch))), encode(batch))[1]

    monkeypatch.setattr(tokenize_mod, "batch_encoder", recording)
    tok = byte_tokenizer()
    text = make_corpus(600)
    assert len(text) > 10 * 2_000
    pieces = [(text, True), ("a second document", True)]
    batches = list(tokenize_mod.piece_token_batches(tok, pieces, tok.eos_token_id))
    assert len(sizes) > 10 and max(sizes) <= 2_000 + 500
    arrays = [a for batch in batches for a in batch]
    assert len(arrays) == 2  # one array per piece, each whole
    whole = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert arrays[0].tolist() == whole


def test_a_streamed_checkpoint_resumes_only_over_the_same_stream(tiny, tmp_path, files):
    """Its position counts pieces, tokens and blocks of that data: other data settings (or
    streaming switched on or off) are refused, naming what changed."""
    data = {"files": [files], "tokenizer": "byte", "streaming": True, "stream_val_blocks": 4}
    out = str(tmp_path / "run")
    first = tiny(data=data, train={"max_steps": 4, "save_steps": 2, "output_dir": out})
    train_from_config(first, quiet=True)
    checkpoint = str(tmp_path / "run" / "checkpoint-4")
    for change in ({"stream_val_blocks": 8}, {"seq_len": 16}, {"streaming": False}):
        again = {**data, **change}
        if change.get("streaming") is False:
            del again["stream_val_blocks"]
        train = {"max_steps": 6, "output_dir": str(tmp_path / "again")}
        cfg = tiny(data=again, train={**train, "resume_from_checkpoint": checkpoint})
        with pytest.raises(StackWiseError, match=f"data.{next(iter(change))}"):
            train_from_config(cfg, quiet=True)


def test_a_sliced_split_is_refused_on_a_stream(tmp_path):
    data = {"source": "files", "dataset_name": str(tmp_path), "tokenizer": "byte"}
    data |= {"streaming": True, "dataset_split": "train[:10%]"}
    with pytest.raises(StackWiseError, match="is a slice"):
        from_dict({"data": data})
