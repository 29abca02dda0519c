"""The one way StackWise writes and reads its files.

Writes go to a temporary name, are fsynced and renamed into place, so a crash leaves the old file
or the new one, never half of one. Reads never unpickle: tensors come from safetensors, and the
few torch files (optimizer state) through `torch.load(weights_only=True)`. A missing or damaged
file is a StackWiseError naming the file and the caller's fix, never a traceback.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from safetensors import SafetensorError

from stackwise.errors import StackWiseError

if TYPE_CHECKING:  # torch loads with the first tensor read or written: JSON and YAML need none
    import torch

METADATA = {"format": "pt", "library": "stackwise"}


def fsync_dir(path: Path) -> None:
    """Make a rename inside `path` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):  # some filesystems cannot fsync a directory
            os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(folder: Path) -> None:
    for p in folder.rglob("*"):
        if p.is_file():
            with p.open("rb") as fh:
                os.fsync(fh.fileno())
    fsync_dir(folder)


def publish_dir(tmp: Path, final: Path) -> None:
    """Rename a finished folder into place: its files are fsynced before the rename and the
    parent after it, so a crash leaves no folder or the whole new one, never a part of it."""
    fsync_tree(tmp)
    os.replace(tmp, final)
    fsync_dir(final.parent)


def _replace(tmp: Path, path: Path) -> None:
    with tmp.open("rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def _tmp(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp")


# errno -> (what happened, in plain words; what the user can do)
_NO_SPACE = "Free some space on that disk (or write to another one) and rerun."
_NO_RIGHTS = "Pick a folder you can write to (or fix its permissions) and rerun."
WRITE_ERRORS = {
    errno.ENOSPC: ("the disk is full (ENOSPC, no space left on device)", _NO_SPACE),
    errno.EDQUOT: ("your disk quota is used up (EDQUOT)", _NO_SPACE),
    errno.EACCES: ("permission denied (EACCES): you may not write there", _NO_RIGHTS),
    errno.EPERM: ("the operation is not permitted there (EPERM)", _NO_RIGHTS),
    errno.EROFS: (
        "the filesystem is read-only (EROFS)",
        "Pick a folder on a writable disk and rerun.",
    ),
}


def write_problem(err: BaseException) -> tuple[str, str] | None:
    """(what went wrong, the fix) when `err` is a failed write: an OSError, or the I/O error
    safetensors wraps in its own type, which names the errno only in its text."""
    if isinstance(err, OSError):
        code, words = err.errno, err.strerror or str(err)
    elif isinstance(err, SafetensorError) and "I/O error" in str(err):
        found = re.search(r"os error (\d+)", str(err))
        code, words = (int(found.group(1)) if found else None), str(err)[:160]
    else:
        return None
    if code in WRITE_ERRORS:
        return WRITE_ERRORS[code]
    return words, "Check that the folder is writable and has space, and rerun."


@contextlib.contextmanager
def staged(tmp: Path, failure: str) -> Iterator[Path]:
    """A scratch folder (emptied first) to build a result in before it is renamed into place.
    Any failure removes it, so a retry finds nothing left over; a failed write (full disk,
    read-only place) becomes `failure`, a message with a {reason} field, and its fix."""
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        yield tmp
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        problem = write_problem(err)
        if problem is None:
            raise
        raise StackWiseError(f"{failure.format(reason=problem[0])} {problem[1]}") from None


@contextlib.contextmanager
def new_folder(out: Path, failure: str, tag: str) -> Iterator[Path]:
    """Build the new folder `out` in a hidden sibling (`.OUT.tag`), renamed to `out` at the
    end: a failure leaves neither, never half of `out`. `out` may exist if empty."""
    with staged(out.with_name(f".{out.name}.{tag}"), failure) as tmp:
        tmp.mkdir(parents=True)
        yield tmp
        if out.is_dir() and not any(out.iterdir()):
            out.rmdir()
        publish_dir(tmp, out)


def write_atomic(path: Path, text: str) -> None:
    tmp = _tmp(path)
    tmp.write_text(text, encoding="utf-8")
    _replace(tmp, path)


def write_json(path: Path, data: Any) -> None:
    write_atomic(path, json.dumps(data, indent=1))


def save_file(
    tensors: dict[str, torch.Tensor], filename: str, metadata: dict | None = None
) -> None:
    """safetensors' save_file, imported with the first tensor written (it loads torch)."""
    from safetensors.torch import save_file as save

    save(tensors, filename, metadata)


def save_tensors(state: dict[str, torch.Tensor], path: Path) -> Path:
    tmp = _tmp(path)
    save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, str(tmp), METADATA)
    os.chmod(tmp, 0o666 & ~_umask())  # safetensors creates 0600; match the run's other files
    _replace(tmp, path)
    return path


def in_precision(state: dict[str, torch.Tensor], precision: str | None) -> dict[str, torch.Tensor]:
    """`state` with its floating tensors cast to `precision` (fp32, fp16, bf16; None: as is)."""
    if precision is None:
        return state
    from stackwise.precision import torch_dtype

    dtype = torch_dtype(precision)
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}


def cast_weight_files(folder: Path, precision: str | None) -> None:
    """Each safetensors file directly in `folder` rewritten (atomically, its metadata kept)
    with its floating tensors in `precision`; None leaves them as they are."""
    if precision is None:
        return
    from safetensors import safe_open

    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), "pt") as handle:
            metadata = handle.metadata()
        state = in_precision(read_tensors(path, "It was written a moment ago."), precision)
        tmp = _tmp(path)
        save_file({k: v.contiguous() for k, v in state.items()}, str(tmp), metadata)
        _replace(tmp, path)


def save_torch_weights(state: dict[str, torch.Tensor], path: Path) -> None:
    """A state dict as a torch file of plain CPU tensors, which torch.load reads back with
    weights_only=True (no pickled object: tensor subclasses are stored as plain tensors)."""
    import torch

    plain = {k: v.detach().cpu().as_subclass(torch.Tensor) for k, v in state.items()}
    torch.save(plain, path)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def read_tensors(path: Path, fix: str) -> dict[str, torch.Tensor]:
    """`fix` ends the error: what the user can do about a missing or damaged file."""
    if not path.is_file():
        raise StackWiseError(f"'{path}' is missing. {fix}")
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as err:
        raise StackWiseError(f"'{path}' is corrupted or truncated ({err}). {fix}") from None


def read_json(path: Path, fix: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StackWiseError(f"'{path}' is missing. {fix}") from None
    except (OSError, ValueError) as err:
        raise StackWiseError(f"'{path}' is unreadable ({err}). {fix}") from None


def read_yaml(path: Path, fix: str) -> Any:
    """Plain data (yaml.safe_load: no objects are built); an empty file is None."""
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StackWiseError(f"'{path}' is missing. {fix}") from None
    except (OSError, ValueError, yaml.YAMLError) as err:
        raise StackWiseError(f"'{path}' is unreadable ({err}). {fix}") from None


def read_torch(path: Path, fix: str) -> Any:
    """Tensors and plain containers only: anything else (a pickled object) is refused."""
    if not path.is_file():
        raise StackWiseError(f"'{path}' is missing. {fix}")
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several types for damaged or hostile files
        raise StackWiseError(
            f"'{path}' cannot be read safely ({type(err).__name__}: {str(err)[:120]}); it is "
            f"corrupted, or not ours. {fix}"
        ) from None
