"""Reading documents: the built-in corpus, or local text/json/jsonl/parquet files via `datasets`.

Every failure names the file and what to do; nothing here raises a bare library traceback for a
user's data problem.
"""

from __future__ import annotations

import codecs
import contextlib
import glob
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from stackwise.data.corpus import shakespeare_documents
from stackwise.errors import StackWiseError
from stackwise.spec import DataSpec, MixSourceSpec

FORMATS = {
    ".txt": "text",
    ".text": "text",
    ".md": "text",
    ".json": "json",
    ".jsonl": "json",
    ".parquet": "parquet",
}


def _format_of(path: Path, declared: str) -> str:
    if declared != "auto":
        return declared
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise StackWiseError(
            f"Cannot tell the format of data file '{path}' from its suffix; use .txt, .jsonl, "
            ".json or .parquet, or set data.format to text, json or parquet."
        )
    return fmt


# byte-order marks of the encodings editors (Windows' Notepad, Excel exports) save as "Unicode";
# UTF-32 first, as its little-endian mark starts with UTF-16's
BOMS = (
    (codecs.BOM_UTF32_LE, "UTF-32"),
    (codecs.BOM_UTF32_BE, "UTF-32"),
    (codecs.BOM_UTF16_LE, "UTF-16"),
    (codecs.BOM_UTF16_BE, "UTF-16"),
)


def _wide_encoding(path: Path) -> str | None:
    """UTF-16 or UTF-32 when the file starts with its byte-order mark (or, with no mark, when
    every other byte of its start is NUL, as ASCII text in UTF-16 is)."""
    with path.open("rb") as fh:
        head = fh.read(4096)
    for bom, name in BOMS:
        if head.startswith(bom):
            return name
    pairs = len(head) // 2
    if pairs >= 8 and min(head[0::2].count(0), head[1::2].count(0)) == 0 and head.count(0) >= pairs:
        return "UTF-16"
    return None


def check_utf8(path: Path) -> None:
    """Decode incrementally so a large file is checked without loading it whole."""
    wide = _wide_encoding(path)
    if wide is not None:
        raise StackWiseError(
            f"Data file '{path}' is {wide} text, not UTF-8. Convert it, e.g. `iconv -f {wide} "
            f"-t UTF-8 '{path.name}' > utf8-{path.name}`, and point the config at the new file."
        )
    dec = codecs.getincrementaldecoder("utf-8")()
    line, offset = 1, 0
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            try:
                dec.decode(chunk)
            except UnicodeDecodeError as err:
                bad = offset + err.start
                line += chunk[: err.start].count(b"\n")
                raise StackWiseError(
                    f"Data file '{path}' is not UTF-8 text: undecodable byte at offset {bad} "
                    f"(line {line}). Convert it, e.g. `iconv -f latin1 -t utf-8`, and rerun."
                ) from None
            line += chunk.count(b"\n")
            offset += len(chunk)
        try:
            dec.decode(b"", final=True)
        except UnicodeDecodeError:
            raise StackWiseError(
                f"Data file '{path}' ends in the middle of a UTF-8 character; it looks truncated."
            ) from None


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


@contextlib.contextmanager
def quiet_datasets() -> Iterator[None]:
    """datasets' one-off bars ("Generating split", ...) off for a load: noise in our logs."""
    import datasets

    bars = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if bars:
            datasets.enable_progress_bars()


def _open_dataset(path: Path, fmt: str) -> Any:
    """The file as a `datasets` table (Arrow, memory-mapped from its cache), or an error that
    names the file."""
    from datasets import load_dataset

    if fmt in ("text", "json"):
        check_utf8(path)
    kwargs = {"sample_by": "document"} if fmt == "text" else {}
    try:
        with quiet_datasets():
            return load_dataset(fmt, data_files=str(path), split="train", **kwargs)
    except Exception as err:  # datasets wraps parser errors in many types
        cause = err.__cause__ or err
        msg = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
        raise StackWiseError(
            f"Could not read data file '{path}' as {fmt}: {msg}. Check that the file is valid "
            f"{fmt} (one JSON object per line for .jsonl)."
        ) from None


def _checked_fields(ds: Any, path: Path, fields: list[str]) -> Any:
    missing = [f for f in fields if f not in ds.column_names]
    if missing:
        raise StackWiseError(
            f"Data file '{path}' has no field {missing[0]!r}; its fields are "
            f"{ds.column_names}. Set data.text_field to one of them."
        )
    return ds.select_columns(fields)


def open_saved(path: Path) -> Any:
    """A folder written by `datasets`' save_to_disk, as one table (memory-mapped): a
    DatasetDict gives its train split, or its only one."""
    import datasets

    if path.is_file():
        raise StackWiseError(
            f"data.dataset_dir '{path}' is a file, but it must be a folder written "
            "by datasets' save_to_disk. Give a data file with data.files instead."
        )
    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as err:  # datasets raises several types for a wrong folder
        raise StackWiseError(
            f"data.dataset_dir '{path}' is not a folder written by datasets' save_to_disk "
            f"({str(err)[:160]}). Point it at such a folder, or use data.files."
        ) from None
    if isinstance(ds, datasets.DatasetDict):
        if "train" not in ds and len(ds) > 1:
            names = ", ".join(ds)
            raise StackWiseError(
                f"data.dataset_dir '{path}' holds the splits {names} and none is named train, "
                f"so which one to train on is not clear. Point data.dataset_dir at one split's "
                f"folder, e.g. {path / next(iter(ds))}."
            )
        ds = ds["train" if "train" in ds else next(iter(ds))]
    return ds


def open_hub(name: str, subset: str | None, split: str, streaming: bool = False) -> Any:
    """`datasets.load_dataset(name, subset, split=split)`: a hub dataset from the local cache
    when offline (or a local dataset folder), or an error saying so. `streaming`: an iterable
    over its rows, read as they are needed."""
    import datasets

    try:
        with quiet_datasets():
            return datasets.load_dataset(name, subset, split=split, streaming=streaming)
    except Exception as err:  # offline misses, unknown names and configs all land here
        raise StackWiseError(
            f"Could not load dataset '{name}' (subset {subset}, split {split}): "
            f"{str(err)[:200]}. Offline, only datasets already in the local cache load; "
            "otherwise give local files with data.files."
        ) from None


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


def hub_files(where: DataSpec | MixSourceSpec) -> list[tuple[Path, str]]:
    """The Arrow files behind data.dataset_name's split (memory-mapped, read in batches)."""
    ds = open_hub(str(where.dataset_name), where.dataset_subset, where.dataset_split)
    files = [Path(f["filename"]) for f in ds.cache_files]
    rows = sum(_table(path, "arrow").num_rows for path in files)
    if not files or rows != ds.num_rows:
        raise StackWiseError(
            f"data.dataset_split '{where.dataset_split}' of '{where.dataset_name}' is not whole "
            "Arrow files (a slice such as train[:10%], or a dataset held in memory). Name a "
            "whole split (data.num_samples caps the training blocks, not what is tokenized)."
        )
    return [(path, "arrow") for path in files]


def _table(path: Path, fmt: str) -> Any:
    if fmt == "arrow":
        from datasets import Dataset

        return Dataset.from_file(str(path))
    return open_saved(path) if fmt == "saved" else _open_dataset(path, fmt)


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
    yield from row_texts(_checked_fields(_table(path, fmt), path, fields), fields, path)


def _load_file(path: Path, fmt: str, fields: list[str]) -> list[str]:
    ds = _table(path, fmt)
    if fmt == "text":
        return [t for t in ds["text"] if t.strip()]
    return rows_to_text(_checked_fields(ds, path, fields).to_list(), fields, path)


PATTERN_CHARS = set("*?[")


def expand_files(names: list[str]) -> list[Path]:
    """data.files with glob patterns expanded (sorted; `**` recurses); a pattern that matches
    nothing is an error."""
    paths: list[Path] = []
    for name in names:
        expanded = str(Path(name).expanduser())
        if not PATTERN_CHARS & set(name) or Path(expanded).is_file():
            paths.append(Path(expanded))
            continue
        found = sorted(p for p in glob.glob(expanded, recursive=True) if Path(p).is_file())
        if not found:
            raise StackWiseError(
                f"The data.files pattern '{name}' matches no file. Check the pattern "
                "(relative to where you run stackwise; `**` matches folders recursively)."
            )
        paths.extend(Path(p) for p in found)
    seen: set[Path] = set()
    unique = []
    for path in paths:  # overlapping patterns (a/*.txt and a/**/*.txt) name files twice
        if path.resolve() not in seen:
            seen.add(path.resolve())
            unique.append(path)
    return unique


def text_field_given(cfg: DataSpec) -> bool:
    """Whether data.text_field names other fields than its default."""
    return cfg.text_field != DataSpec.text_field


def data_files(
    cfg: DataSpec, where: DataSpec | MixSourceSpec | None = None
) -> list[tuple[Path, str]]:
    """(path, format) of every data file, patterns expanded, each checked to exist and hold
    something; or the data.dataset_dir folder, format "saved"; or data.dataset_name's Arrow
    files. `where` names the files or dataset (an entry of data.mix; default: `cfg` itself)."""
    where = cfg if where is None else where
    if where.dataset_name:
        return hub_files(where)
    if where.dataset_dir:
        folder = Path(where.dataset_dir).expanduser()
        if not folder.is_dir():
            raise StackWiseError(
                f"data.dataset_dir '{folder}' is not a folder. Give the folder that datasets' "
                "save_to_disk wrote."
            )
        return [(folder, "saved")]
    paths = expand_files(list(where.files))
    for path in paths:
        if path.is_dir():
            problem = f"is a directory: list its files, e.g. data.files=[{path / 'a.txt'}]"
        elif not path.is_file():
            problem = "does not exist. Check data.files (relative to where you run stackwise)"
        else:
            continue
        raise StackWiseError(f"Data file '{path}' {problem}.")
    files = [(path, _format_of(path, cfg.format)) for path in paths]
    if all(f == "text" for _, f in files) and text_field_given(cfg):
        raise StackWiseError(
            "data.text_field picks fields of .jsonl/.json/.parquet rows, but every data file is "
            "plain text, so it would have no effect. Remove data.text_field."
        )
    for path, _ in files:
        if path.stat().st_size == 0:
            raise StackWiseError(f"Data file '{path}' is empty. Give it some text.")
    return files


def no_text(path: Path, fields: list[str]) -> StackWiseError:
    return StackWiseError(
        f"Data file '{path}' holds no text (every row is empty in {fields}). Check data.text_field."
    )


def load_documents(cfg: DataSpec) -> list[tuple[str, str]]:
    """(source name, text) for every document, in a fixed order, all in memory (the training
    data reads the corpus piece by piece instead: stackwise.data.documents)."""
    if cfg.source == "shakespeare":
        return shakespeare_documents(cfg.cache_dir)
    fields = cfg.text_fields
    docs: list[tuple[str, str]] = []
    for path, fmt in data_files(cfg):
        texts = _load_file(path, fmt, fields)
        if not texts:
            raise no_text(path, fields)
        docs.extend((str(path), t) for t in texts)
    return docs
