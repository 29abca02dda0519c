"""PlainTokenizer, our tokenizer class over `tokenizers`, against transformers' fast class over
the same files: the same ids, text, vocabulary and special tokens; the folders it reads and
those it leaves to transformers; and a pretraining run that never imports transformers."""

from __future__ import annotations

import json
import pickle
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from conftest import make_corpus, tiny_dict
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

import stackwise.data.tokenizer as tokmod
from stackwise.data.plain_tokenizer import CONFIG, PlainTokenizer, as_transformers, plain_folder

KINDS = [None, "char", "byte"]  # a BPE learnt on the corpus, characters, bytes
TEXTS = [
    "Thou art é, naïve—\nKING. O!\ttab",
    "  leading spaces and trailing  ",
    "<eos> written out, and <mask> too",
    "日本語のテキスト 🙂 and a zero\u200bwidth space",
    "",
]
_PAIRS: dict[str | None, tuple[PlainTokenizer, PreTrainedTokenizerBase]] = {}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str | None, Path]:
    """The folders our build of each kind is saved in."""
    root = tmp_path_factory.mktemp("plain-tok")
    corpus = [make_corpus(60, seed=s) for s in range(3)] + TEXTS[:2]
    folders = {}
    for kind in KINDS:
        tok = tokmod.make_tokenizer(kind, corpus, 320, str(root / "cache"))
        tok.save_pretrained(str(root / str(kind)))
        folders[kind] = root / str(kind)
    return folders


def pair(built: dict, kind: str | None) -> tuple[PlainTokenizer, PreTrainedTokenizerBase]:
    """Ours and transformers' over the same folder (loaded once per module; tests that change
    them load their own)."""
    if kind not in _PAIRS or _PAIRS[kind][0].name_or_path != str(built[kind]):
        plain = tokmod.load_tokenizer_dir(built[kind])
        assert isinstance(plain, PlainTokenizer)
        _PAIRS[kind] = plain, AutoTokenizer.from_pretrained(str(built[kind]))
    return _PAIRS[kind]


@pytest.mark.parametrize("kind", KINDS)
def test_it_gives_what_transformers_gives_over_the_same_folder(built, kind):
    plain, hf = pair(built, kind)
    assert len(plain) == len(hf) and plain.get_vocab() == hf.get_vocab()
    for name in ("bos", "eos", "unk", "pad", "mask"):
        assert getattr(plain, f"{name}_token") == getattr(hf, f"{name}_token"), name
        assert getattr(plain, f"{name}_token_id") == getattr(hf, f"{name}_token_id"), name
    assert plain.all_special_ids == hf.all_special_ids
    assert plain.all_special_tokens == hf.all_special_tokens
    assert plain.special_tokens_map == hf.special_tokens_map
    for text in TEXTS:
        assert plain(text)["input_ids"] == hf(text)["input_ids"], text
        assert plain(text) == dict(hf(text))
        assert plain.encode(text) == hf.encode(text)
        assert plain.tokenize(text) == hf.tokenize(text)
        assert plain(text, add_special_tokens=False) == dict(hf(text, add_special_tokens=False))
    assert plain(TEXTS)["input_ids"] == hf(TEXTS)["input_ids"]
    rng = random.Random(0)
    for _ in range(20):
        ids = [rng.randrange(len(plain)) for _ in range(rng.randint(1, 30))]
        for skip in (False, True):
            assert plain.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip), ids
        assert plain.decode(torch.tensor(ids)) == hf.decode(ids)
        assert plain.convert_ids_to_tokens(ids) == hf.convert_ids_to_tokens(ids)
    assert plain.decode(ids[0]) == hf.decode(ids[0])
    assert plain.batch_decode([ids, ids[:3]]) == hf.batch_decode([ids, ids[:3]])
    tokens = list(plain.get_vocab())
    for token in [*tokens[:: max(1, len(tokens) // 40)], "never-a-token"]:
        assert plain.convert_tokens_to_ids(token) == hf.convert_tokens_to_ids(token), token
        assert plain.convert_tokens_to_string([token]) == hf.convert_tokens_to_string([token])
    assert plain.convert_tokens_to_ids(tokens[:5]) == hf.convert_tokens_to_ids(tokens[:5])


@settings(max_examples=60, deadline=None)
@given(text=st.text(max_size=80), kind=st.sampled_from(KINDS))
def test_any_text_gets_the_same_ids_and_comes_back_the_same(built, text, kind):
    plain, hf = pair(built, kind)
    ids = plain.encode(text)
    assert ids == hf.encode(text)
    assert plain.decode(ids) == hf.decode(ids)


@pytest.mark.parametrize("kind", KINDS)
def test_a_folder_saved_by_either_class_loads_in_the_other(built, tmp_path, kind):
    plain, hf = pair(built, kind)
    # ours -> transformers: AutoTokenizer reads it as the same tokenizer
    plain.save_pretrained(tmp_path / "ours")
    back = AutoTokenizer.from_pretrained(str(tmp_path / "ours"))
    assert back.get_vocab() == hf.get_vocab() and back.all_special_ids == hf.all_special_ids
    assert all(back(t)["input_ids"] == hf(t)["input_ids"] for t in TEXTS)
    # transformers -> ours: the folders every earlier run saved
    hf.save_pretrained(str(tmp_path / "theirs"))
    again = tokmod.load_tokenizer_dir(tmp_path / "theirs")
    assert isinstance(again, PlainTokenizer)
    assert all(again.encode(t) == hf.encode(t) for t in TEXTS)
    # the same settings as transformers writes, but for the options of its last load
    ours, theirs = (json.loads((tmp_path / f / CONFIG).read_text()) for f in ("ours", "theirs"))
    for written in (ours, theirs):
        written.pop("is_local", None), written.pop("local_files_only", None)
        written.pop("tokenizer_class")  # PreTrainedTokenizerFast is TokenizersBackend's name
    assert ours == theirs
    # and the conversion, for what this class does not do
    converted = as_transformers(PlainTokenizer.from_folder(built[kind]))
    assert isinstance(converted, PreTrainedTokenizerFast) and as_transformers(hf) is hf
    assert all(converted(t)["input_ids"] == hf(t)["input_ids"] for t in TEXTS)
    assert converted.all_special_ids == hf.all_special_ids


def test_truncation_and_padding_set_on_it_are_off_as_in_transformers(built):
    plain = tokmod.load_tokenizer_dir(built[None])
    hf = AutoTokenizer.from_pretrained(str(built[None]))
    for tok in (plain.backend_tokenizer, hf.backend_tokenizer):
        tok.enable_truncation(3)
        tok.enable_padding(length=40)
    text = TEXTS[0]
    assert len(plain.encode(text)) > 3 and plain.encode(text) == hf.encode(text)
    assert plain([text, "a"])["input_ids"] == hf([text, "a"])["input_ids"]


def edit_config(folder: Path, **changes: object) -> None:
    config = folder / "tokenizer_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), **changes}))


def drop_key(folder: Path, key: str) -> None:
    config = folder / "tokenizer_config.json"
    settings = json.loads(config.read_text())
    settings.pop(key)
    config.write_text(json.dumps(settings))


ADDED_EOS = {"__type": "AddedToken", "content": "<eos>", "special": True, "normalized": False}


def rewrite_backend(folder: Path, change) -> None:
    from tokenizers import Tokenizer

    backend = Tokenizer.from_file(str(folder / "tokenizer.json"))
    change(backend)
    backend.save(str(folder / "tokenizer.json"))


def unregistered_specials(folder: Path) -> None:
    """tokenizer.json with the special tokens as ordinary vocabulary entries."""
    data = json.loads((folder / "tokenizer.json").read_text())
    data["added_tokens"] = []
    (folder / "tokenizer.json").write_text(json.dumps(data))


FOREIGN = {
    "a chat template": lambda f: edit_config(f, chat_template="{{ messages }}"),
    "a clean-up setting": lambda f: edit_config(f, clean_up_tokenization_spaces=True),
    "a padding side": lambda f: edit_config(f, padding_side="left"),
    "a template file": lambda f: (f / "chat_template.jinja").write_text("{{ messages }}"),
    "a special-token map": lambda f: (f / "special_tokens_map.json").write_text("{}"),
    "a model's config": lambda f: (f / "config.json").write_text('{"model_type": "llama"}'),
    "another class": lambda f: edit_config(f, tokenizer_class="GPT2TokenizerFast"),
    "an AddedToken": lambda f: edit_config(f, eos_token=ADDED_EOS),
    "no mask token": lambda f: drop_key(f, "mask_token"),
    "a token not in it": lambda f: edit_config(f, pad_token="<never>"),
    "specials not registered": unregistered_specials,
    "a truncation in the file": lambda f: rewrite_backend(f, lambda b: b.enable_truncation(9)),
    "a padding in the file": lambda f: rewrite_backend(f, lambda b: b.enable_padding(length=9)),
    "a templates folder": lambda f: (f / "additional_chat_templates").mkdir(),
    "added tokens file": lambda f: (f / "added_tokens.json").write_text("{}"),
    "a template json": lambda f: (f / "chat_template.json").write_text("{}"),
    "extra specials": lambda f: edit_config(f, extra_special_tokens=["<x>"]),
    "a bos setting": lambda f: edit_config(f, add_bos_token=True),
    "input names": lambda f: edit_config(f, model_input_names=["input_ids"]),
    "fast files": lambda f: edit_config(f, fast_tokenizer_files=["tokenizer.json"]),
}
KEPT = {"a padding side": ("padding_side", "left")}


@pytest.mark.parametrize("what", list(FOREIGN))
def test_a_folder_with_settings_it_does_not_read_goes_to_transformers(built, tmp_path, what):
    """Anything beyond the special tokens: transformers' class reads the folder (and adds a
    missing special token), so no setting is dropped."""
    folder = tmp_path / "tok"
    pair(built, "char")[1].save_pretrained(str(folder))
    assert plain_folder(folder) is not None
    FOREIGN[what](folder)
    assert PlainTokenizer.from_folder(folder) is None
    if what in ("another class", "a model's config"):
        return  # plain_folder's refusal is the point; those classes need their own files
    tok = tokmod.load_tokenizer_dir(folder)
    assert isinstance(tok, PreTrainedTokenizerBase) and tok.mask_token_id is not None
    if what in KEPT:
        key, value = KEPT[what]
        assert getattr(tok, key) == value


def test_a_length_limit_in_the_folder_is_kept(built, tmp_path):
    folder = tmp_path / "tok"
    pair(built, "byte")[1].save_pretrained(str(folder))
    edit_config(folder, model_max_length=2048)
    plain = tokmod.load_tokenizer_dir(folder)
    assert isinstance(plain, PlainTokenizer) and plain.model_max_length == 2048
    plain.save_pretrained(tmp_path / "again")
    assert AutoTokenizer.from_pretrained(str(tmp_path / "again")).model_max_length == 2048
    assert plain.to_transformers().model_max_length == 2048


def test_what_it_lacks_fails_and_names_the_conversion(built):
    plain = tokmod.load_tokenizer_dir(built["byte"])
    with pytest.raises(AttributeError, match="to_transformers"):
        plain.padding_side  # noqa: B018
    with pytest.raises(AttributeError):
        plain.chat_template = "{{ messages }}"  # a setting it would not save
    with pytest.raises(TypeError, match="batch_decode"):
        plain.decode([[1, 2], [3]])
    ids = plain.encode(TEXTS[0])
    assert plain.decode(list(np.array(ids))) == plain.decode(list(torch.tensor(ids))) == TEXTS[0]
    assert getattr(plain, "chat_template", None) is None
    again = pickle.loads(pickle.dumps(plain))  # DataLoader workers may get a copy
    assert again.encode(TEXTS[0]) == plain.encode(TEXTS[0])


def test_a_template_set_by_chat_data_is_saved_with_the_tokenizer(built, tmp_path):
    """TextDataset converts our tokenizer to render instruction rows; the template it sets is
    on the conversion, which the caller's tokenizer saves (a run saved with it can chat)."""
    from stackwise.fronts.data import TextDataset

    plain = tokmod.load_tokenizer_dir(built["byte"])
    rows = [{"prompt": "Say hi", "completion": "hi"}] * 4
    data = TextDataset(rows, plain, 64, "text", "instruction")
    assert data.tokenizer is as_transformers(plain) is plain.to_transformers()
    plain.save_pretrained(tmp_path / "saved")
    again = tokmod.load_tokenizer_dir(tmp_path / "saved")
    assert again.chat_template and again.chat_template == data.tokenizer.chat_template
    chat = [{"role": "user", "content": "Hail"}]
    assert "Hail" in again.apply_chat_template(chat, tokenize=False)
    assert again.encode(TEXTS[0]) == plain.encode(TEXTS[0])
    # tokens added to the conversion: ids of the PlainTokenizer would not match what it saves
    plain.to_transformers().add_special_tokens({"additional_special_tokens": ["<|im|>"]})
    with pytest.raises(ValueError, match="encode and save with that one"):
        plain.save_pretrained(tmp_path / "refused")


def test_a_pretraining_run_never_imports_transformers(tmp_path, corpus_file):
    """A BPE built, the run trained, saved and sampled, then `generate` and `eval` on it: no
    module of transformers loaded (its import costs each process about 0.7 s and 20 MB), nor
    the growth recipe's (builder, growth operators: a plain run builds no grown rack)."""
    config = tmp_path / "run.yaml"
    run = tmp_path / "r"
    config.write_text(yaml.safe_dump(tiny_dict(corpus_file, tmp_path / "cache", run)))
    commands = [
        ["train", str(config)],
        ["generate", "--checkpoint", str(run), "--prompt", "the", "--max-new-tokens", "4"],
        ["eval", "--checkpoint", str(run)],
    ]
    code = (
        "import sys\nfrom stackwise.cli import main\n"
        f"codes = [main(c) for c in {commands!r}]\n"
        "print('LOADED', sorted(m for m in sys.modules if m.split('.')[0] == 'transformers'))\n"
        "grown = ('stackwise.growth', 'stackwise.progressive.builder', "
        "'stackwise.progressive.recipe')\n"
        "print('GROWN', sorted(m for m in sys.modules if m.startswith(grown)))\n"
        "sys.exit(max(codes))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "LOADED []" in proc.stdout and "GROWN []" in proc.stdout, proc.stdout[-2000:]
    assert (run / "model.safetensors").is_file() and (run / "eval.json").is_file()
