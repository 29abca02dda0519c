"""Where StackWise keeps what it can rebuild: the corpus, tokenizers, the hardware verdict."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


def cache_root(override: str | None = None) -> Path:
    """`override`, else $STACKWISE_CACHE, else $XDG_CACHE_HOME/stackwise (~/.cache/stackwise)."""
    if override:
        return Path(override).expanduser()
    env = os.environ.get("STACKWISE_CACHE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "stackwise"


@contextlib.contextmanager
def build_lock(folder: Path) -> Iterator[None]:
    """Held while `folder` is built, so that processes sharing a cache (DDP ranks, parallel
    runs) build it once: the others wait, then find it built."""
    import fcntl

    folder.parent.mkdir(parents=True, exist_ok=True)
    locks = folder.parent.with_name(f"{folder.parent.name}.locks")  # beside, not among, them
    locks.mkdir(exist_ok=True)
    fd = os.open(locks / f"{folder.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
