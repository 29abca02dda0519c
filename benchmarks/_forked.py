"""Run one benchmark repetition in a forked child of the (imports-only) parent.

Every run then starts from the same clean process state (heap, allocator thresholds, caches),
as a real training run would, instead of inheriting the memory layout of the run before it.
"""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, TypeVar

T = TypeVar("T")


def _child(conn: Connection, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    try:
        conn.send((True, fn(*args)))
    except BaseException as err:  # report any failure to the parent, then exit
        conn.send((False, f"{type(err).__name__}: {err}"))
    finally:
        conn.close()


def in_fork(label: str, fn: Callable[..., T], *args: Any) -> T:
    """fn(*args) in a forked child; its result comes back pickled. Failures name `label`."""
    ctx = mp.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(send, fn, args))
    proc.start()
    send.close()
    try:
        ok, value = receive.recv()
    except EOFError:
        proc.join()
        raise RuntimeError(f"{label} died (exit code {proc.exitcode})") from None
    proc.join()
    if not ok:
        raise RuntimeError(f"{label} failed: {value}")
    return value
