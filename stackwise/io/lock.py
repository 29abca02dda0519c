"""One run per folder: an exclusive `flock` on `<run>/.stackwise.lock`, holding the owner's PID.

Two runs writing one folder interleave their metrics and overwrite each other's checkpoints and
final weights, each exiting 0. The kernel drops a flock when its process dies, so a lock left by
a crashed run is simply taken over. A process keeps its locks until it exits (re-entrant: a run
resumed in the same process, or a notebook training twice into one folder, takes it again).
"""

from __future__ import annotations

import atexit
import contextlib
import os
from pathlib import Path

from stackwise.errors import StackWiseError

LOCK = ".stackwise.lock"
_held: dict[Path, int] = {}  # folder -> open descriptor holding its lock


def lock_run_folder(folder: Path) -> str | None:
    """Take the folder's lock or raise naming the process that holds it. Returns a note when a
    lock left by a process that is gone was taken over."""
    import fcntl  # POSIX; imported here so that the module loads everywhere

    folder = folder.resolve()
    if folder in _held:
        return None
    path = folder / LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        owner = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise StackWiseError(
            f"Output dir '{folder}' is in use by another StackWise run (PID {owner}). Two runs "
            "in one folder overwrite each other's checkpoints and weights: wait for it to end, "
            "or choose another train.output_dir."
        ) from None
    previous = os.read(fd, 64).decode(errors="replace").strip()
    os.lseek(fd, 0, os.SEEK_SET)
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    if not _held:
        atexit.register(_release_all)
    _held[folder] = fd
    if previous and previous != str(os.getpid()):
        return f"took over the lock of '{folder}' left by PID {previous}, which has ended"
    return None


def _release_all() -> None:
    """At a normal exit, clear the PIDs: only a process that died leaves its PID behind, so the
    takeover note means a crashed or killed run, not every resume."""
    for fd in _held.values():
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.close(fd)
    _held.clear()


def release_run_folder(folder: Path) -> None:
    """A run that ended normally: its PID is cleared and the lock dropped at once, not at
    interpreter exit (which a forked or embedded run may never reach)."""
    fd = _held.pop(folder.resolve(), None)
    if fd is not None:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        os.close(fd)


def unlock_run_folder(folder: Path) -> None:
    fd = _held.pop(folder.resolve(), None)
    if fd is not None:
        os.close(fd)  # closing the descriptor drops the flock; the PID stays (see run_dir)


def lock_holder(folder: Path) -> str | None:
    """The PID of a live run holding the folder's lock (None when free); changes nothing."""
    import fcntl

    path = folder / LOCK
    if folder.resolve() in _held or not path.is_file():
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.read(fd, 64).decode(errors="replace").strip() or "unknown"
    finally:
        os.close(fd)  # also drops the shared lock, if it was taken
    return None
