"""Where instruction rows come from: local json/jsonl/parquet files, a `datasets` folder saved
with save_to_disk, or a hub dataset by name (which also works offline from the local cache)."""

from __future__ import annotations

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


def _rows_of_file(path: Path, key: str = "data.files") -> list[dict]:
    kind = SUFFIXES.get(path.suffix.lower())
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
