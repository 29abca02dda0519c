"""The final save of a run, written like a checkpoint and then marked complete.

The model, stacks, tokenizer, config and history are written into `<run>/.final.tmp/`, fsynced,
and moved into the run folder; `run_complete.json` is written last. A run folder is finished
when, and only when, that marker exists: a save that fails or is cut off leaves no marker, the
run's checkpoints untouched, and a folder that `train.resume_from_checkpoint=latest` continues.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from safetensors import SafetensorError

from stackwise.errors import StackWiseError
from stackwise.io.files import fsync_dir, fsync_tree, write_json

MARKER = "run_complete.json"
STAGING = ".final.tmp"


def is_finished(folder: Path) -> bool:
    return (folder / MARKER).is_file()


@contextmanager
def final_save(folder: Path) -> Iterator[Path]:
    """Yields the staging folder to write the run's final files into (on rank 0 only)."""
    staging = folder / STAGING
    try:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        yield staging
        fsync_tree(staging)
        for entry in sorted(staging.iterdir()):
            move_into(entry, folder / entry.name)
        staging.rmdir()
        fsync_dir(folder)
        stamp = datetime.now(UTC).isoformat(timespec="seconds")
        write_json(folder / MARKER, {"finished": stamp})
    except Exception as err:  # a full disk surfaces as OSError, SafetensorError, RuntimeError
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(err, StackWiseError):
            raise
        raise StackWiseError(
            f"Saving the final model into '{folder}' failed ({_reason(err)}). The run is not "
            f"marked finished ({MARKER} was not written) and its checkpoints are untouched. "
            "Free some space (or fix the folder) and finish it with "
            "train.resume_from_checkpoint=latest, or rerun with train.save_steps set."
        ) from None


def move_into(entry: Path, dest: Path) -> None:
    """A file replaces its namesake atomically; a folder (tokenizer/, stacks/) replaces it
    by two renames, the old one removed only after the new one is in place."""
    if entry.is_dir() and dest.exists():
        old = dest.with_name(f".{dest.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(dest, old)
        os.replace(entry, dest)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(entry, dest)


def _reason(err: BaseException) -> str:
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    if isinstance(err, SafetensorError):
        return str(err)[:160]
    return f"{type(err).__name__}: {str(err)[:160]}"
