"""Reading documents: the built-in corpus, or local text/json/jsonl/parquet files via `datasets`.

Every failure names the file and what to do; nothing here raises a bare library traceback for a
user's data problem.
"""

from __future__ import annotations

import codecs
from pathlib import Path

from stackwise.config import DataConfig
from stackwise.data.corpus import shakespeare_documents
from stackwise.errors import StackWiseError

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


def check_utf8(path: Path) -> None:
    """Decode incrementally so a large file is checked without loading it whole."""
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


def _rows_to_text(rows: list[dict], fields: list[str], path: Path) -> list[str]:
    texts = []
    for i, row in enumerate(rows):
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


def _load_file(path: Path, fmt: str, fields: list[str]) -> list[str]:
    import datasets
    from datasets import load_dataset

    if fmt in ("text", "json"):
        check_utf8(path)
    kwargs = {"sample_by": "document"} if fmt == "text" else {}
    bars = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # a one-off "Generating split" bar is noise in our logs
    try:
        ds = load_dataset(fmt, data_files=str(path), split="train", **kwargs)
    except Exception as err:  # datasets wraps parser errors in many types
        cause = err.__cause__ or err
        msg = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
        raise StackWiseError(
            f"Could not read data file '{path}' as {fmt}: {msg}. Check that the file is valid "
            f"{fmt} (one JSON object per line for .jsonl)."
        ) from None
    finally:
        if bars:
            datasets.enable_progress_bars()
    if fmt == "text":
        return [t for t in ds["text"] if t.strip()]
    missing = [f for f in fields if f not in ds.column_names]
    if missing:
        raise StackWiseError(
            f"Data file '{path}' has no field {missing[0]!r}; its fields are "
            f"{ds.column_names}. Set data.text_field to one of them."
        )
    return _rows_to_text(ds.select_columns(fields).to_list(), fields, path)


def load_documents(cfg: DataConfig) -> list[tuple[str, str]]:
    """(source name, text) for every document, in a fixed order."""
    if cfg.source == "shakespeare":
        return shakespeare_documents(cfg.cache_dir)
    fields = [cfg.text_field] if isinstance(cfg.text_field, str) else list(cfg.text_field)
    docs: list[tuple[str, str]] = []
    paths = [Path(name).expanduser() for name in cfg.files]
    for path in paths:
        if path.is_dir():
            problem = f"is a directory: list its files, e.g. data.files=[{path / 'a.txt'}]"
        elif not path.is_file():
            problem = "does not exist. Check data.files (relative to where you run stackwise)"
        else:
            continue
        raise StackWiseError(f"Data file '{path}' {problem}.")
    formats = [_format_of(path, cfg.format) for path in paths]
    if all(f == "text" for f in formats) and cfg.changed("text_field"):
        raise StackWiseError(
            "data.text_field picks fields of .jsonl/.json/.parquet rows, but every data file is "
            "plain text, so it would have no effect. Remove data.text_field."
        )
    for path, fmt in zip(paths, formats, strict=True):
        if path.stat().st_size == 0:
            raise StackWiseError(f"Data file '{path}' is empty. Give it some text.")
        texts = _load_file(path, fmt, fields)
        if not texts:
            raise StackWiseError(
                f"Data file '{path}' holds no text (every row is empty in {fields}). "
                "Check data.text_field."
            )
        docs.extend((str(path), t) for t in texts)
    return docs
