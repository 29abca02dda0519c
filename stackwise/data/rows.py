"""Row texts: the fields data.text_field names, joined per row, from a table, a stream or a hub
dataset; a row whose field is not text is named by its place."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from stackwise.data.tables import open_hub, open_table
from stackwise.errors import StackWiseError
from stackwise.spec import DataSpec


def rows_to_text(rows: list[dict], fields: list[str], path: Path, first: int = 0) -> list[str]:
    """The rows' texts; `first` is the index of rows[0] in the file (for error messages)."""
    texts = []
    for i, row in enumerate(rows, start=first):
        parts = []
        for f in fields:
            value = row.get(f)
            if value is None:
                continue
            if not isinstance(value, str):
                raise StackWiseError(
                    f"Data file '{path}', row {i + 1}: field '{f}' is {type(value).__name__}, "
                    "not text. Point data.text_field at string fields."
                )
            parts.append(value)
        if parts:
            texts.append("\n\n".join(parts))
    return texts


def checked_fields(ds: Any, path: Path, fields: list[str]) -> Any:
    """The table's data.text_field columns, or an error naming the fields it has."""
    missing = [f for f in fields if f not in ds.column_names]
    if missing:
        raise StackWiseError(
            f"Data file '{path}' has no field {missing[0]!r}; its fields are "
            f"{ds.column_names}. Set data.text_field to one of them."
        )
    return ds.select_columns(fields)


def hub_rows(cfg: DataSpec, batch: int = 512) -> Iterator[tuple[str, bool]]:
    """data.dataset_name's split streamed: each row's text as one document, in order. Offline a
    hub dataset cannot stream; its copy in the local datasets cache is read row by row."""
    where = (str(cfg.dataset_name), cfg.dataset_subset, cfg.dataset_split)
    try:
        ds = open_hub(*where, streaming=True)
    except StackWiseError:
        ds = open_hub(*where).to_iterable_dataset()
    fields, name = cfg.text_fields, Path(str(cfg.dataset_name))
    missing = [f for f in fields if ds.column_names is not None and f not in ds.column_names]
    if missing:
        raise StackWiseError(
            f"Dataset '{cfg.dataset_name}' has no field {missing[0]!r} (it has "
            f"{', '.join(ds.column_names)}). Point data.text_field at its text."
        )
    yield from ((text, True) for text in row_texts(ds, fields, name, batch))


def row_texts(ds: Any, fields: list[str], where: Path, batch: int = 512) -> Iterator[str]:
    """The text of each row of a dataset (a table or a stream), read a batch at a time; a row
    is named by its place in `where` when it is not text."""
    first = 0
    for columns in ds.iter(batch_size=batch):
        n = len(next(iter(columns.values())))
        cols = {f: columns.get(f) or [None] * n for f in fields}
        yield from rows_to_text(
            [{f: cols[f][i] for f in fields} for i in range(n)], fields, where, first
        )
        first += n


def file_texts(path: Path, fmt: str, fields: list[str]) -> Iterator[str]:
    """A json/jsonl/parquet file's, a saved dataset's or an Arrow file's row texts."""
    yield from row_texts(checked_fields(open_table(path, fmt), path, fields), fields, path)
