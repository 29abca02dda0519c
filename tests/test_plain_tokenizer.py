"""PlainTokenizer, our tokenizer class over `tokenizers`, against transformers' fast class over
the same files: the same ids, text, vocabulary and special tokens; the folders it reads and
those it leaves to transformers; and a pretraining run that never imports transformers."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
import yaml
from conftest import make_corpus, tiny_dict
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

import stackwise.data.tokenizer as tokmod
from stackwise.data.plain_tokenizer import PlainTokenizer, as_transformers, plain_folder

KINDS = [None, "char", "byte"]  # a BPE learnt on the corpus, characters, bytes
TEXTS = [
    "Thou art é, naïve—\nKING. O!\ttab",
    "  leading spaces and trailing  ",
    "<eos> written out, and <mask> too",
    "日本語のテキスト 🙂 and a zero\u200bwidth space",
    "",
]
_BUILT: dict[str | None, Path] = {}


def saved(kind: str | None) -> Path:
    """The folder our build of `kind` is saved in (built once per test process)."""
    if kind not in _BUILT:
        root = Path(tempfile.mkdtemp(prefix="plain-tok-"))
        corpus = [make_corpus(60, seed=s) for s in range(3)] + TEXTS[:2]
        tok = tokmod.make_tokenizer(kind, corpus, 320, str(root / "cache"))
        tok.save_pretrained(str(root / "saved"))
        _BUILT[kind] = root / "saved"
    return _BUILT[kind]


def pair(kind: str | None) -> tuple[PlainTokenizer, PreTrainedTokenizerBase]:
    folder = saved(kind)
    plain = tokmod.load_tokenizer_dir(folder)
    assert isinstance(plain, PlainTokenizer)
    return plain, AutoTokenizer.from_pretrained(str(folder))


@pytest.mark.parametrize("kind", KINDS)
def test_it_gives_what_transformers_gives_over_the_same_folder(kind):
    plain, hf = pair(kind)
    assert len(plain) == len(hf) and plain.get_vocab() == hf.get_vocab()
    for name in ("bos", "eos", "unk", "pad", "mask"):
        assert getattr(plain, f"{name}_token") == getattr(hf, f"{name}_token"), name
        assert getattr(plain, f"{name}_token_id") == getattr(hf, f"{name}_token_id"), name
    assert set(plain.all_special_ids) == set(hf.all_special_ids)
    assert set(plain.all_special_tokens) == set(hf.all_special_tokens)
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
def test_any_text_gets_the_same_ids_and_comes_back_the_same(text, kind):
    plain, hf = pair(kind)
    ids = plain.encode(text)
    assert ids == hf.encode(text)
    assert plain.decode(ids) == hf.decode(ids)


@pytest.mark.parametrize("kind", KINDS)
def test_a_folder_saved_by_either_class_loads_in_the_other(tmp_path, kind):
    plain, hf = pair(kind)
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
    # and the conversion, for what this class does not do
    converted = as_transformers(plain)
    assert isinstance(converted, PreTrainedTokenizerFast) and as_transformers(hf) is hf
    assert all(converted(t)["input_ids"] == hf(t)["input_ids"] for t in TEXTS)
    assert converted.all_special_ids == hf.all_special_ids


def test_truncation_and_padding_kept_in_a_file_are_off_as_in_transformers():
    plain, hf = pair(None)
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
}


@pytest.mark.parametrize("what", list(FOREIGN))
def test_a_folder_with_settings_it_does_not_read_goes_to_transformers(tmp_path, what):
    """Anything beyond the special tokens: transformers' class reads the folder (and adds a
    missing special token), so no setting is dropped."""
    folder = tmp_path / "tok"
    pair("char")[1].save_pretrained(str(folder))
    assert plain_folder(folder) is not None
    FOREIGN[what](folder)
    assert PlainTokenizer.from_folder(folder) is None
    if what in ("another class", "a model's config"):
        return  # plain_folder's refusal is the point; those classes need their own files
    tok = tokmod.load_tokenizer_dir(folder)
    assert isinstance(tok, PreTrainedTokenizerBase) and tok.mask_token_id is not None


def test_a_setting_it_would_not_save_cannot_be_set():
    plain, _ = pair("byte")
    with pytest.raises(AttributeError):
        plain.chat_template = "{{ messages }}"  # type: ignore[attr-defined]
    converted = plain.to_transformers()
    converted.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    assert converted.apply_chat_template([{"role": "user", "content": "Hail"}], tokenize=False)


def test_a_pretraining_run_never_imports_transformers(tmp_path, corpus_file):
    """A BPE built, the run trained, saved and sampled: no module of transformers loaded (its
    import costs each process about 0.7 s and 20 MB)."""
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(tiny_dict(corpus_file, tmp_path / "cache", tmp_path / "r")))
    code = (
        "import sys\nfrom stackwise.cli import main\n"
        f"code = main(['train', {str(config)!r}])\n"
        "print('LOADED', sorted(m for m in sys.modules if m.split('.')[0] == 'transformers'))\n"
        "sys.exit(code)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "LOADED []" in proc.stdout, proc.stdout[-2000:]
    assert (tmp_path / "r" / "model.safetensors").is_file()
