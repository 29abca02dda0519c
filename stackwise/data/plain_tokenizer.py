"""The tokenizers StackWise builds (BPE, char, byte) and the folders they are saved in, without
transformers: importing its tokenizer classes costs every process about 0.7 s and 20 MB
(benchmarks/RESULTS.md, throughput's memory section), and a pretraining run needs none of what
they add.

`PlainTokenizer` is a `tokenizers.Tokenizer` with its special tokens and the part of
transformers' fast-tokenizer API our runs use, giving the same ids and text (tested against
transformers). It is used only for a folder whose settings it reads completely (`plain_folder`);
any other folder gets transformers' own class. Chat data converts it first (`as_transformers`):
chat templates are transformers' work, and a template set on the converted tokenizer is saved
by the PlainTokenizer it came from.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from typing import TypeAlias

    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerBase

    # what a run's data, generation and checkpoints take: ours, or transformers' for HF models
    AnyTokenizer: TypeAlias = "PlainTokenizer | PreTrainedTokenizerBase"

# the classes transformers saves a plain fast tokenizer as (its 5 and 4 names)
PLAIN_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")
SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token", "mask_token")
# the settings a plain tokenizer_config.json may hold and this class honours; the others change
# nothing: model_max_length is a limit we never apply, the backend a label, and is_local and
# local_files_only the options of the load before, which transformers writes back on save
READ_KEYS = {
    "tokenizer_class",
    "backend",
    "model_max_length",
    "is_local",
    "local_files_only",
    *SPECIAL_KEYS,
}
NO_LIMIT = int(1e30)  # transformers' VERY_LARGE_INTEGER: no length limit
CONFIG = "tokenizer_config.json"
MODEL_FILES = ("config.json", "tekken.json")  # transformers may pick a model's class from these
# files that carry more settings (a chat template, older special-token maps, slow vocabularies)
OTHER_FILES = (
    "chat_template.jinja",
    "chat_template.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "additional_chat_templates",
)
NEEDED = ("pad_token", "bos_token", "eos_token", "mask_token")


class Settings(NamedTuple):
    specials: dict[str, str]
    model_max_length: int


def plain_folder(path: Path) -> Settings | None:
    """The settings of a folder this class reads completely, else None: a tokenizer.json
    saved as a plain fast tokenizer with pad, bos, eos and mask tokens, no model or other
    tokenizer files, no setting beyond READ_KEYS (a clean-up, padding side, chat template, ...
    send the folder to transformers)."""
    if not (path / "tokenizer.json").is_file():
        return None
    if any((path / name).exists() for name in (*MODEL_FILES, *OTHER_FILES)):
        return None
    try:
        settings = json.loads((path / CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(settings, dict) or settings.get("tokenizer_class") not in PLAIN_CLASSES:
        return None
    if not READ_KEYS.issuperset(settings):
        return None
    specials = {k: settings[k] for k in SPECIAL_KEYS if k in settings}
    if not all(isinstance(v, str) for v in specials.values()):
        return None  # a special token written as an AddedToken dict: transformers reads it
    if not set(NEEDED).issubset(specials):
        return None  # transformers' class adds the missing ones (ensure_specials)
    limit = settings.get("model_max_length", NO_LIMIT)
    return Settings(specials, limit) if isinstance(limit, int) else None


def unregistered(backend: Tokenizer, specials: Mapping[str, str]) -> list[str]:
    """The special tokens `backend` does not hold as special added tokens (transformers
    registers them so on load: split out of any text, dropped by skip_special_tokens)."""
    held = {t.content for t in backend.get_added_tokens_decoder().values() if t.special}
    return [tok for tok in specials.values() if tok not in held]


class PlainTokenizer:
    """A Rust tokenizer and its special tokens: encode, decode, vocabulary, special ids and
    save_pretrained, as transformers' fast tokenizer gives them. Slots: a setting transformers'
    class would honour (a chat template, say) fails here instead of being dropped on save."""

    __slots__ = ("_converted", "_specials", "_tokenizer", "model_max_length", "name_or_path")

    def __init__(
        self,
        backend: Tokenizer,
        specials: Mapping[str, str],
        name_or_path: str = "",
        model_max_length: int = NO_LIMIT,
    ) -> None:
        missing = unregistered(backend, specials)
        if missing:
            raise ValueError(f"not special tokens of the tokenizer: {missing}")
        self._tokenizer = backend
        self._specials = dict(specials)
        self._converted: PreTrainedTokenizerBase | None = None
        self.name_or_path = name_or_path
        self.model_max_length = model_max_length

    @classmethod
    def from_folder(cls, path: Path) -> PlainTokenizer | None:
        """The folder's tokenizer, or None where transformers must read it (`plain_folder`; a
        tokenizer.json that truncates or pads, or whose special tokens are not registered as
        such: transformers turns those into settings of its own)."""
        settings = plain_folder(path)
        if settings is None:
            return None
        from tokenizers import Tokenizer

        backend = Tokenizer.from_file(str(path / "tokenizer.json"))
        if backend.truncation is not None or backend.padding is not None:
            return None
        try:
            return cls(backend, settings.specials, str(path), settings.model_max_length)
        except ValueError:  # special tokens not registered as such
            return None

    def __getattr__(self, name: str) -> Any:
        """Called only for what the class lacks: say where it is."""
        raise AttributeError(
            f"PlainTokenizer has no '{name}': StackWise's own tokenizers do encode, decode and "
            "save; for anything else of transformers' tokenizers, call to_transformers()"
        )

    @property
    def special_tokens_map(self) -> dict[str, str]:
        return dict(self._specials)

    @property
    def backend_tokenizer(self) -> Tokenizer:
        return self._tokenizer

    def __len__(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def __repr__(self) -> str:
        return f"PlainTokenizer(name_or_path={self.name_or_path!r}, vocab={len(self)})"

    def get_vocab(self) -> dict[str, int]:
        return self._tokenizer.get_vocab(with_added_tokens=True)

    def _special(self, key: str) -> str | None:
        return self._specials.get(key)

    def _special_id(self, key: str) -> int | None:
        token = self._specials.get(key)
        return None if token is None else self._tokenizer.token_to_id(token)

    bos_token = property(lambda self: self._special("bos_token"))
    eos_token = property(lambda self: self._special("eos_token"))
    unk_token = property(lambda self: self._special("unk_token"))
    pad_token = property(lambda self: self._special("pad_token"))
    mask_token = property(lambda self: self._special("mask_token"))
    bos_token_id = property(lambda self: self._special_id("bos_token"))
    eos_token_id = property(lambda self: self._special_id("eos_token"))
    unk_token_id = property(lambda self: self._special_id("unk_token"))
    pad_token_id = property(lambda self: self._special_id("pad_token"))
    mask_token_id = property(lambda self: self._special_id("mask_token"))

    @property
    def all_special_tokens(self) -> list[str]:
        """Each special token once, in transformers' order of the attributes."""
        named = (self._specials[k] for k in SPECIAL_KEYS if k in self._specials)
        return list(dict.fromkeys(named))

    @property
    def all_special_ids(self) -> list[int]:
        return [self._tokenizer.token_to_id(t) for t in self.all_special_tokens]

    def _plain(self) -> Tokenizer:
        """The Rust tokenizer with truncation and padding off, as transformers' call sets it
        when asked for neither (a tokenizer.json may carry both)."""
        if self._tokenizer.truncation is not None:
            self._tokenizer.no_truncation()
        if self._tokenizer.padding is not None:
            self._tokenizer.no_padding()
        return self._tokenizer

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._plain().encode(text, add_special_tokens=add_special_tokens).ids

    def tokenize(self, text: str) -> list[str]:
        return self._plain().encode(text, add_special_tokens=False).tokens

    def __call__(
        self, text: str | list[str], add_special_tokens: bool = True
    ) -> dict[str, list[Any]]:
        """{"input_ids", "attention_mask"} of one text or a list of texts (no padding; for
        offsets, padding or tensors, to_transformers())."""
        if isinstance(text, str):
            ids = self.encode(text, add_special_tokens)
            return {"input_ids": ids, "attention_mask": [1] * len(ids)}
        done = self._plain().encode_batch_fast(text, add_special_tokens=add_special_tokens)
        rows = [e.ids for e in done]
        return {"input_ids": rows, "attention_mask": [[1] * len(r) for r in rows]}

    def decode(self, ids: Any, skip_special_tokens: bool = False) -> str:
        """The text of `ids`: one sequence (a list, a tensor or an array of ids) or one id."""
        ids = ids.tolist() if hasattr(ids, "tolist") else ids
        ids = [ids] if isinstance(ids, int) else list(ids)
        try:
            ids = [operator.index(i) for i in ids]  # numpy ints and 0-d tensors too
        except TypeError:
            raise TypeError(
                "decode takes one sequence of ids; batch_decode takes several"
            ) from None
        return self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def batch_decode(self, rows: Iterable[Any], skip_special_tokens: bool = False) -> list[str]:
        return [self.decode(r, skip_special_tokens) for r in rows]

    def convert_tokens_to_ids(self, tokens: str | list[str]) -> Any:
        """Ids of tokens; one not in the vocabulary is the unknown token's (None without one)."""
        if isinstance(tokens, str):
            found = self._tokenizer.token_to_id(tokens)
            return self.unk_token_id if found is None else found
        return [self.convert_tokens_to_ids(t) for t in tokens]

    def convert_ids_to_tokens(self, ids: int | list[int]) -> Any:
        if isinstance(ids, int):
            return self._tokenizer.id_to_token(ids)
        return [self._tokenizer.id_to_token(i) for i in ids]

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        decoder = self._tokenizer.decoder
        return decoder.decode(tokens) if decoder is not None else " ".join(tokens)

    def save_pretrained(self, folder: str | Path) -> tuple[str, ...]:
        """tokenizer.json and the settings transformers reads it with (AutoTokenizer loads
        the folder as the same tokenizer). Once converted (to_transformers), the converted
        tokenizer is saved: it carries what chat data set on it, its template above all. Its
        vocabulary must still be this one's: ids from this tokenizer would not match the
        saved folder's otherwise."""
        if self._converted is not None:
            if self._converted.get_vocab() != self.get_vocab():
                raise ValueError(
                    "tokens were added to the tokenizer to_transformers() gave, so this "
                    "PlainTokenizer's ids no longer match it: encode and save with that one"
                )
            self._converted.model_max_length = self.model_max_length
            self._converted.name_or_path = self.name_or_path
            return tuple(self._converted.save_pretrained(str(folder)))
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self._tokenizer.save(str(folder / "tokenizer.json"))
        settings = {
            "backend": "tokenizers",
            **self._specials,
            "model_max_length": self.model_max_length,
            "tokenizer_class": PLAIN_CLASSES[1],  # the name transformers 4 and 5 both read
        }
        config = folder / CONFIG
        config.write_text(json.dumps(settings, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        return str(config), str(folder / "tokenizer.json")

    def to_transformers(self) -> PreTrainedTokenizerBase:
        """transformers' fast tokenizer over a copy of the same Rust tokenizer, for chat
        templates and anything else this class does not do. Built once: each call gives the
        same object, and what is set on it is what this tokenizer saves."""
        if self._converted is None:
            from tokenizers import Tokenizer
            from transformers import PreTrainedTokenizerFast

            copy = Tokenizer.from_str(self._tokenizer.to_str())
            self._converted = PreTrainedTokenizerFast(
                tokenizer_object=copy, model_max_length=self.model_max_length, **self._specials
            )
            self._converted.name_or_path = self.name_or_path
        return self._converted


def as_transformers(tokenizer: Any) -> PreTrainedTokenizerBase:
    """transformers' class for any tokenizer: a PlainTokenizer converted, others as they are."""
    return tokenizer.to_transformers() if isinstance(tokenizer, PlainTokenizer) else tokenizer
