"""Where instruction rows come from: local json/jsonl/parquet files, a `datasets` folder saved
with save_to_disk, or a hub dataset by name (which also works offline from the local cache)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from stackwise.errors import StackWiseError

ORIGIN = "__origin__"  # a row's file and position, carried for error messages
SUFFIXES = {".json": "json", ".jsonl": "json", ".parquet": "parquet"}


def _quiet_datasets() -> Any:
    import datasets

    datasets.disable_progress_bars()  # one-off "Generating split" bars are noise in our logs
    datasets.logging.set_verbosity_error()
    return datasets


def _json_problem(path: Path) -> str | None:
    """Where a .json/.jsonl file stops being JSON (1-based line, the parser's words), read as
    JSON lines, or as one document when its first line is not a whole object."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    try:
        json.loads(text)
        return None  # one document (an array of rows, or a single object)
    except json.JSONDecodeError as whole:
        first = next((ln for ln in lines if ln.strip()), "")
        try:
            json.loads(first)
        except json.JSONDecodeError:  # not JSON lines: the document's own error
            return f"line {whole.lineno}: {whole.msg} (column {whole.colno})"
    for number, line in enumerate(lines, 1):
        try:
            json.loads(line) if line.strip() else None
        except json.JSONDecodeError as err:
            return f"line {number}: {err.msg} (column {err.colno})"
    return None


def _rows_of_file(path: Path, key: str = "data.files") -> list[dict]:
    kind = SUFFIXES.get(path.suffix.lower())
    if path.is_dir():
        raise StackWiseError(
            f"Instruction data file '{path}' is a folder, but {key} takes files (.json, .jsonl "
            "or .parquet). List the files in it, or give a folder written by save_to_disk as "
            "data.dataset_dir."
        )
    if not path.is_file():
        raise StackWiseError(f"Instruction data file '{path}' does not exist. Check {key}.")
    if path.stat().st_size == 0 or not path.read_bytes().strip():
        raise StackWiseError(f"Instruction data file '{path}' is empty. Give it rows ({key}).")
    if kind is None:
        raise StackWiseError(
            f"Instruction data file '{path}' is not .json, .jsonl or .parquet; chat data needs "
            "structured rows. Convert it, or train on plain text with data.mode: pretraining."
        )
    if kind == "json":
        from stackwise.data.sources import check_utf8

        check_utf8(path)
        problem = _json_problem(path)
        if problem is not None:
            raise StackWiseError(
                f"'{path}' is not valid JSON at {problem}. Fix that line (.jsonl holds one "
                "JSON object per line) and rerun."
            )
    datasets = _quiet_datasets()
    try:
        ds = datasets.load_dataset(kind, data_files=str(path), split="train")
    except Exception as err:  # datasets wraps parser errors in many types
        cause = err.__cause__ or err
        first = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
        raise StackWiseError(
            f"Could not read '{path}' as {kind}: {first[:200]}. Check that it is valid {kind} "
            "(one JSON object per line for .jsonl)."
        ) from None
    return _named(ds.to_list(), path.name)


def _named(rows: list[dict], source: str) -> list[dict]:
    """Each row remembers where it came from, so an error can point at it."""
    for i, row in enumerate(rows):
        row[ORIGIN] = f"row {i + 1} of {source}"
    return rows


def _rows_of_dir(path: Path) -> list[dict]:
    from stackwise.data.sources import open_saved

    _quiet_datasets()
    return _named(open_saved(path).to_list(), path.name)


def _rows_of_hub(name: str, subset: str | None, split: str) -> list[dict]:
    from stackwise.data.sources import open_hub

    _quiet_datasets()
    return _named(open_hub(name, subset, split).to_list(), name)


def load_rows(cfg: Any) -> tuple[list[dict], list[dict] | None]:
    """(training rows, evaluation rows or None to split them off the training rows)."""
    if cfg.dataset_dir:
        rows = _rows_of_dir(Path(cfg.dataset_dir).expanduser())
    elif cfg.dataset_name and Path(cfg.dataset_name).expanduser().is_file():  # a local file
        rows = _rows_of_file(Path(cfg.dataset_name).expanduser(), "data.dataset_name")
    elif cfg.dataset_name:
        rows = _rows_of_hub(cfg.dataset_name, cfg.dataset_subset, cfg.dataset_split)
    else:
        rows = [r for f in cfg.files for r in _rows_of_file(Path(f).expanduser())]
    if not rows:
        raise StackWiseError("The instruction data has no rows. Check data.files.")
    evals = [
        r for f in cfg.eval_files for r in _rows_of_file(Path(f).expanduser(), "data.eval_files")
    ]
    return rows, (evals or None)


def split_off(rows: list[dict], fraction: float) -> tuple[list[dict], list[dict]]:
    """The last `fraction` of rows (at least one) for evaluation, the rest for training."""
    n_val = max(1, round(len(rows) * fraction))
    if len(rows) - n_val < 1:
        raise StackWiseError(
            f"The instruction data has {len(rows)} rows: too few to hold out data.val_fraction "
            "for evaluation and still train. Add rows, or give data.eval_files."
        )
    return rows[:-n_val], rows[-n_val:]
