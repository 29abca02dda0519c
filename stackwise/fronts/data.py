"""`create_dataloader(...)` and `TextDataset` (seed 001): a loader of tokenized examples from a
dataset, on the pipeline a run uses.

`TextDataset(rows, tokenizer, ...)` turns rows into examples in one of two modes:
- `pretraining`: the text fields (one name, or several joined by a blank line) of each row,
  tokenized and cut at `max_length`; every token after the first is a target;
- `instruction_finetuning` (or `instruction`): each row a conversation (`messages`,
  `conversations`, `prompt`/`response` or `completion`, Alpaca's instruction/input/output;
  `text_field` may name those columns), rendered with the tokenizer's chat template (our
  default where it has none) and labelled by stackwise.chat: only the replies are targets.
Batches are padded to their longest example: `input_ids`, `labels` (-100 where not a target)
and `attention_mask`, as a Hugging Face causal LM takes them.

`create_dataloader(dataset_name=...)` reads the rows first: a local .jsonl/.json/.parquet/.txt
file, a folder written by `save_to_disk`, a dataset folder (`subset`, `split` as on the hub),
or a hub name (offline: from the local `datasets` cache, else refused saying what to do).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from stackwise.chat.data import IGNORE, ChatRows, ChatStats, examples_of, to_rows
from stackwise.chat.template import use_template
from stackwise.data.plain_tokenizer import as_transformers
from stackwise.data.rows import rows_to_text
from stackwise.data.tables import open_hub, open_saved, quiet_datasets
from stackwise.errors import StackWiseError
from stackwise.spec import DataSpec
from stackwise.train.sampler import ipc_tempdir_that_fits

__all__ = ["TextDataset", "create_dataloader"]

MODES = {"pretraining": "pretraining", "instruction_finetuning": "instruction"}
MODES["instruction"] = "instruction"
FILE_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".txt": "text"}


def mode_of(training_mode: str) -> str:
    if training_mode not in MODES:
        raise StackWiseError(
            f"training_mode '{training_mode}' is not one TextDataset knows: use 'pretraining' "
            "(raw text continuation) or 'instruction_finetuning' (conversations, loss on the "
            "replies)."
        )
    return MODES[training_mode]


class TextDataset(Dataset):
    """Tokenized examples of `rows` (a `datasets` table or a list of dicts); see the module."""

    def __init__(
        self,
        rows: Any,
        tokenizer: Any,
        max_length: int = 512,
        text_field: str | list[str] = "text",
        training_mode: str = "pretraining",
        chat_template: str | None = None,
    ) -> None:
        self.mode = mode_of(training_mode)
        self.tokenizer, self.max_length = tokenizer, max_length
        fields = tuple(text_field) if isinstance(text_field, list | tuple) else text_field
        self.spec = DataSpec(
            mode=self.mode, text_field=fields, seq_len=max_length, chat_template=chat_template
        )
        rows = rows.to_list() if hasattr(rows, "to_list") else list(rows)
        if not rows:
            raise StackWiseError("TextDataset got no rows: give it a dataset with examples.")
        self.stats = ChatStats()
        if self.mode == "instruction":
            self.tokenizer = tokenizer = as_transformers(tokenizer)  # renders the template
            self.template = use_template(tokenizer, chat_template)
            examples = examples_of(rows, tokenizer, self.spec, self.stats)
        else:
            examples = self._texts(rows)
        pad = tokenizer.pad_token_id
        self.rows: ChatRows = to_rows(
            examples, tokenizer.eos_token_id if pad is None else pad, False, max_length
        )

    def _texts(self, rows: list[dict]) -> list[tuple[list[int], list[int]]]:
        """Each row's text fields joined, tokenized (with the tokenizer's own special tokens
        and an EOS closing the document), cut at max_length."""
        fields = self.spec.text_fields
        missing = [f for f in fields if f not in rows[0]]
        if missing:
            raise StackWiseError(
                f"The rows have no field {missing[0]!r} (their fields: {sorted(rows[0])}). Set "
                "text_field to the field (or list of fields) holding the text."
            )
        eos, out = self.tokenizer.eos_token_id, []
        for text in rows_to_text(rows, fields, Path("the dataset")):
            ids = list(self.tokenizer(text)["input_ids"])
            if eos is not None and (not ids or ids[-1] != eos):
                ids.append(eos)
            ids = ids[: self.max_length]
            self.stats.examples += 1
            self.stats.tokens += len(ids)
            out.append((ids, [IGNORE, *ids[1:]]))
        self.stats.format = "text"
        return out

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self.rows[i]

    def collate(self, items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """A batch padded to its longest example: input_ids, labels, attention_mask."""
        return self.rows.collate(items)


def load_table(dataset_name: str, subset: str | None, split: str) -> Any:
    """The split of `dataset_name` as a `datasets` table (see the module for what it may be)."""
    path = Path(dataset_name).expanduser()
    local = (
        path.is_file() or (path / "dataset_dict.json").is_file() or (path / "state.json").is_file()
    )
    if local and subset is not None:
        raise StackWiseError(
            f"subset='{subset}' picks a configuration of a hub dataset, but '{dataset_name}' is "
            "a local file or saved dataset, which has none. Remove subset (or pass the file "
            "or folder of that configuration)."
        )
    if path.is_file():
        return _file_table(path, split)
    if path.is_dir() and any((path / f).is_file() for f in ("dataset_dict.json", "state.json")):
        return _saved_table(path, split)
    if not path.exists() and (dataset_name[:1] in "./~" or path.suffix in FILE_FORMATS):
        raise StackWiseError(f"Dataset '{dataset_name}' does not exist here: check the path.")
    try:
        return open_hub(str(path) if path.is_dir() else dataset_name, subset, split)
    except StackWiseError as err:
        if path.is_dir():
            raise
        raise StackWiseError(
            f"Dataset '{dataset_name}' (subset {subset}, split {split}) could not be loaded: it "
            "is not a local file or folder, and the Hugging Face hub is out of reach here "
            "(offline, or no network) with no copy in the local datasets cache. Where there is "
            "a network, save it with datasets.load_dataset(name, subset).save_to_disk(DIR) and "
            "pass DIR as dataset_name, or pass a local .jsonl/.parquet file or dataset folder "
            "holding its rows."
        ) from err


def _file_table(path: Path, split: str) -> Any:
    from stackwise.data.tables import open_file

    fmt = FILE_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise StackWiseError(
            f"Dataset file '{path}' is not .jsonl, .json, .parquet or .txt; give rows in one of "
            "those, or a dataset folder."
        )
    if split != "train":
        raise StackWiseError(
            f"Dataset file '{path}' is one split (train), but split '{split}' was asked for. "
            "Pass the file of that split, a folder holding several, or split='train'."
        )
    return open_file(path, fmt)


def _saved_table(path: Path, split: str) -> Any:
    import datasets

    if (path / "dataset_dict.json").is_file():  # several splits: pick the one asked for
        with quiet_datasets():
            splits = datasets.load_from_disk(str(path))
        if split not in splits:
            raise StackWiseError(
                f"Dataset folder '{path}' has the splits {', '.join(splits)}, not '{split}'. "
                "Pass one of them as split."
            )
        return splits[split]
    return open_saved(path)


def create_dataloader(
    dataset_name: str,
    tokenizer: Any,
    batch_size: int = 4,
    max_length: int = 512,
    split: str = "train",
    subset: str | None = None,
    text_field: str | list[str] = "text",
    training_mode: str = "pretraining",
    num_workers: int = 0,
    shuffle: bool = True,
    num_samples: int | None = None,
) -> DataLoader:
    """A DataLoader of TextDataset batches from `dataset_name`'s `split` (`subset`: the
    dataset's configuration), at most `num_samples` rows of it (None: all)."""
    mode_of(training_mode)  # a wrong mode is named before any data is read
    table = load_table(dataset_name, subset, split)
    if num_samples is not None:
        table = table.select(range(min(num_samples, len(table))))
    dataset = TextDataset(table, tokenizer, max_length, text_field, training_mode)
    if num_workers:  # workers' sockets must fit their path, whatever TMPDIR is
        ipc_tempdir_that_fits()
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=shuffle,
        num_workers=num_workers,
        collate_fn=dataset.collate,
        persistent_workers=num_workers > 0,
    )
