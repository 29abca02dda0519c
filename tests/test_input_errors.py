"""Tokenizer, data and override mistakes name the real problem; long documents tokenize in
pieces to the same stream, in bounded memory."""

from __future__ import annotations

import json

import pytest
from conftest import make_corpus
from hypothesis import given, settings
from hypothesis import strategies as st

from stackwise.config import load_config
from stackwise.config.loading import parse_override
from stackwise.data.pack import pack_stream
from stackwise.data.tokenize import text_pieces, token_stream
from stackwise.data.tokenizer import byte_tokenizer, char_tokenizer, load_tokenizer_dir, train_bpe
from stackwise.errors import StackWiseError


def long_document() -> str:
    """About 150k characters with runs of spaces and newlines at varied places."""
    lines = make_corpus(3000, seed=3).splitlines()
    return "\n".join(
        line + "  " * (i % 3) + ("\n" if i % 7 == 0 else "") for i, line in enumerate(lines)
    )


@pytest.mark.parametrize("kind", ["bpe", "char", "byte"])
def test_long_documents_tokenize_in_pieces_to_the_same_stream(kind):
    doc = long_document()
    texts = [doc, "A short one.", "", doc[:5000]]
    tok = {"bpe": lambda: train_bpe(texts, 400), "char": lambda: char_tokenizer(texts)}.get(
        kind, byte_tokenizer
    )()
    pieces = list(text_pieces(doc, 4096))
    assert len(pieces) > 30 and "".join(pieces) == doc
    whole = pack_stream(tok(texts, add_special_tokens=False)["input_ids"], tok.eos_token_id)
    import stackwise.data.tokenize as tz

    old = tz.PIECE_CHARS, tz.BATCH_CHARS
    tz.PIECE_CHARS, tz.BATCH_CHARS = 4096, 20_000  # many pieces and batches
    try:
        pieced = token_stream(tok, texts, tok.eos_token_id)
    finally:
        tz.PIECE_CHARS, tz.BATCH_CHARS = old
    assert pieced.dtype.is_floating_point is False and pieced.tolist() == whole.tolist()


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=" \nab", min_size=0, max_size=400), st.integers(4, 64))
def test_pieces_rebuild_the_text_and_respect_the_size(text, size):
    pieces = list(text_pieces(text, size))
    assert "".join(pieces) == text
    assert all(len(p) <= size for p in pieces[:-1])


def test_tokenizer_folder_mistakes_are_named(tmp_path):
    (tmp_path / "tok.json").write_text("{}")
    (tmp_path / "empty").mkdir()
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "tokenizer.json").write_text(json.dumps({"model": {"type": "none"}}))
    expected = {
        "tok.json": "is a file; a tokenizer is a folder",
        "empty": "holds no tokenizer",
        "broken": "damaged or not a tokenizer",
        "missing": "does not exist",
    }
    for name, needle in expected.items():
        with pytest.raises(StackWiseError, match=needle):
            load_tokenizer_dir(tmp_path / name)


def test_a_directory_given_as_a_data_file_is_named(tiny, tmp_path):
    from stackwise.data.sources import load_documents

    cfg = tiny(data={"files": [str(tmp_path)]})
    with pytest.raises(StackWiseError, match="is a directory"):
        load_documents(cfg.data)


def test_a_misspelt_per_stack_key_gets_a_suggestion():
    with pytest.raises(StackWiseError, match=r"progressive.stacks.0.stepz' — did you mean 'steps'"):
        load_config(None, ["progressive.stacks.0.stepz=5"])


WORDS_YAML_MISREADS = ["no", "yes", "on", "off", "true", "123", "1.5", "{a: 1}", "---", "..."]


@pytest.mark.parametrize("word", WORDS_YAML_MISREADS)
def test_a_string_setting_takes_the_word_yaml_would_misread(word):
    assert load_config(None, [f"sample.prompt={word}"]).sample.prompt == word
    assert load_config(None, [f"logging.run_name={word}"]).logging.run_name == word


@settings(max_examples=80, deadline=None)
@given(st.text(alphabet="abnoyes01 .:-", min_size=1, max_size=12).filter(lambda t: t.strip() == t))
def test_prompt_overrides_are_taken_verbatim(word):
    parts, value = parse_override(f"sample.prompt={word}")
    assert parts == ["sample", "prompt"]
    assert value == word or (value is None and word.lower() in ("null", "~"))


def test_numbers_and_booleans_still_parse_where_they_belong():
    cfg = load_config(None, ["train.max_steps=7", "model.tie_embeddings=no"])
    assert cfg.train.max_steps == 7 and cfg.model.tie_embeddings is False


def test_streamed_text_matches_the_final_text_when_the_prompt_holds_eos():
    import torch

    from stackwise.generate import TextStream

    tok = char_tokenizer(["abc de"])
    eos = tok.eos_token_id
    a, b, c = (tok.convert_tokens_to_ids(x) for x in "abc")
    prompt = [a, eos, b]
    shown: list[str] = []
    stream = TextStream(tok, shown.append, eos, prompt_len=len(prompt))
    for new in ([c], [c, a], [c, a, eos]):
        stream.update(torch.tensor([prompt + new]))
    final = tok.decode([a, eos, b, c, a], skip_special_tokens=True)
    stream.finish(final)
    assert "".join(shown) == final == "abca"


def test_a_head_count_error_offers_counts_that_divide():
    with pytest.raises(StackWiseError, match=r"head counts that divide it: 1, 7") as caught:
        load_config(None, ["model.d_model=7"])
    assert "must be even" not in str(caught.value)


def test_a_checkpoint_moved_out_of_its_run_is_named(tiny, tmp_path, capsys):
    """A checkpoint reads the run's tokenizer from the folder around it: moved elsewhere, the
    refusal says so (not "point data.tokenizer at ...", a key the user never set)."""
    import shutil

    from stackwise.cli import main
    from stackwise.pipeline import train_from_config

    run = train_from_config(tiny(train={"max_steps": 2, "save_steps": 2}), quiet=True).output_dir
    moved = tmp_path / "elsewhere" / "checkpoint-2"
    shutil.copytree(run / "checkpoint-2", moved)
    assert main(["eval", "--checkpoint", str(moved), "--samples", "1"]) == 2
    said = capsys.readouterr().err
    assert "was the checkpoint moved out of its run?" in said and "data.tokenizer" not in said
    assert main(["eval", "--checkpoint", str(run / "checkpoint-2"), "--samples", "1"]) == 0


def test_a_hugging_face_folder_given_as_a_run_is_named(tmp_path):
    from stackwise.io.run_folder import run_paths

    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(StackWiseError, match=r"holds a Hugging Face model \(config.json\)"):
        run_paths(tmp_path)
    (tmp_path / "config.json").unlink()
    with pytest.raises(StackWiseError, match="is not a StackWise output dir"):
        run_paths(tmp_path)
