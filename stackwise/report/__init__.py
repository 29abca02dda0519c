"""`stackwise report`: a run's logs as one HTML page a user can open, send and compare."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from stackwise.errors import StackWiseError
from stackwise.io.files import write_atomic
from stackwise.report.runs import Run, load_run, unique_names

__all__ = ["Run", "load_run", "write_report"]


def default_page(folders: Sequence[Path]) -> Path:
    """report.html in the run's folder for one run; in the current folder for several."""
    return folders[0] / "report.html" if len(folders) == 1 else Path("report.html")


def write_report(runs: Sequence[str | Path], out: str | Path | None = None) -> Path:
    """Read each run folder and write the page; returns where it was written."""
    from stackwise.report.page import render

    if not runs:
        raise StackWiseError("No run given: pass one or more run folders to report.")
    folders = list(dict.fromkeys(Path(r).expanduser().resolve() for r in runs))  # each once
    loaded = [load_run(f) for f in folders]
    unique_names(loaded)
    for run in loaded:
        for note in run.notes:
            print(f"stackwise: note: {run.name}: {note}", file=sys.stderr)
    page = Path(out).expanduser() if out else default_page(folders)
    if page.suffix.lower() not in (".html", ".htm"):
        raise StackWiseError(
            f"--out '{out}' does not end in .html: the report is one HTML page. Name the file "
            "FILE.html."
        )
    if page.is_dir():
        raise StackWiseError(f"--out '{out}' is a folder; give a file name such as report.html.")
    page.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(page, render(loaded))
    return page
