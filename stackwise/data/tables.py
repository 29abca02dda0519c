"""Opening data as `datasets` tables: a local file, a save_to_disk folder, a hub dataset (or the
Arrow files behind its split); every failure names the source and what to do."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from stackwise.data.encoding import check_utf8
from stackwise.errors import StackWiseError
from stackwise.spec import DataSpec, MixSourceSpec


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


def open_file(path: Path, fmt: str) -> Any:
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
            f"{str(err)[:200].rstrip('.')}. Offline, only datasets already in the local cache "
            "load; otherwise give local files with data.files."
        ) from None


def hub_files(where: DataSpec | MixSourceSpec) -> list[tuple[Path, str]]:
    """The Arrow files behind data.dataset_name's split (memory-mapped, read in batches)."""
    ds = open_hub(str(where.dataset_name), where.dataset_subset, where.dataset_split)
    files = [Path(f["filename"]) for f in ds.cache_files]
    rows = sum(open_table(path, "arrow").num_rows for path in files)
    if not files or rows != ds.num_rows:
        raise StackWiseError(
            f"data.dataset_split '{where.dataset_split}' of '{where.dataset_name}' is not whole "
            "Arrow files (a slice such as train[:10%], or a dataset held in memory). Name a "
            "whole split (data.num_samples caps the training blocks, not what is tokenized)."
        )
    return [(path, "arrow") for path in files]


def open_table(path: Path, fmt: str) -> Any:
    """A data file, a saved dataset folder ("saved") or an Arrow file ("arrow") as a table."""
    if fmt == "arrow":
        from datasets import Dataset

        return Dataset.from_file(str(path))
    return open_saved(path) if fmt == "saved" else open_file(path, fmt)
