"""Reading documents: the built-in corpus, or the files, saved dataset or hub dataset data names
(patterns expanded, each checked), all in memory.

Every failure names the file and what to do; nothing here raises a bare library traceback for a
user's data problem. The UTF-8 check is `encoding`, opening tables `tables`, row texts `rows`;
the names other modules read from here stay importable.
"""

from __future__ import annotations

import glob
from pathlib import Path

from stackwise.data.corpus import shakespeare_documents
from stackwise.data.encoding import check_utf8
from stackwise.data.rows import checked_fields, file_texts, hub_rows, rows_to_text
from stackwise.data.tables import hub_files, open_hub, open_saved, open_table
from stackwise.errors import StackWiseError
from stackwise.spec import DataSpec, MixSourceSpec

__all__ = [
    "check_utf8",
    "data_files",
    "expand_files",
    "file_texts",
    "hub_rows",
    "load_documents",
    "no_text",
    "open_hub",
    "open_saved",
    "text_field_given",
]

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


def _load_file(path: Path, fmt: str, fields: list[str]) -> list[str]:
    ds = open_table(path, fmt)
    if fmt == "text":
        return [t for t in ds["text"] if t.strip()]
    return rows_to_text(checked_fields(ds, path, fields).to_list(), fields, path)


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
        local = Path(str(where.dataset_name)).expanduser()
        if not local.is_file():
            return hub_files(where)
        if where.dataset_split != "train":  # a file is one split
            raise StackWiseError(
                f"data.dataset_name '{local}' is a file, which holds one split (train), but "
                f"data.dataset_split is '{where.dataset_split}'. Remove dataset_split."
            )
        where = MixSourceSpec(files=(str(local),))
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
