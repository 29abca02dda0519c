"""Where StackWise keeps what it can rebuild: the corpus, tokenizers, the hardware verdict."""

from __future__ import annotations

import os
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
