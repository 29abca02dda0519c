"""`--record`: a benchmark's run written into benchmarks/RESULTS.md and its history.

Recording a run replaces the benchmark's row and section in RESULTS.md (or adds them) and
prepends the section to benchmarks/history/<benchmark>.md; every other byte of RESULTS.md stays
as it was (the text operations are in _dashboard.py).

    rec = record.start("throughput", args.record)   # tees stdout from here on
    ...                                              # the script prints its table and headline
    rec.finish(goal="ours >= 1.1x nanoGPT", met=ratio >= 1.1)

The headline is the last `headline: ...` line the script printed, unless finish() is given one.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import shlex
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from _dashboard import NO_GOAL, Run, update_history, update_results

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "RESULTS.md"
HISTORY = HERE / "history"
HEADLINE = re.compile(r"^headline(?: \(([^)]*)\))?: (.*)$")


def add_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--record",
        action="store_true",
        help="write this run into benchmarks/RESULTS.md (its row and section) and prepend it "
        "to benchmarks/history/<benchmark>.md",
    )


def read(path: Path) -> str:
    with open(path, encoding="utf-8", newline="") as f:
        return f.read()


def write(path: Path, text: str) -> None:
    """Whole or not at all: a temporary file beside it, then one rename."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    os.replace(tmp, path)


def record(run: Run, results: Path = RESULTS, history: Path = HISTORY) -> None:
    """Write the run into `results` and prepend it to `history`/<name>.md. Both texts are made
    before either file is written, so a failure in the making changes nothing."""
    past = history / f"{run.name}.md"
    new_results = update_results(read(results), run)
    new_history = update_history(read(past) if past.is_file() else None, run)
    history.mkdir(parents=True, exist_ok=True)
    write(past, new_history)
    write(results, new_results)


# ---- where and how the run happened --------------------------------------------------------


def commit(root: Path = HERE.parent) -> str:
    """The short commit, with -dirty when tracked files differ from it (the results files
    themselves left out, so that recording one benchmark after another stays clean)."""
    spec = [".", ":(exclude)benchmarks/RESULTS.md", ":(exclude)benchmarks/history"]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True
        )
        if head.returncode:
            return "unknown"
        diff = subprocess.run(
            ["git", "diff", "--quiet", "HEAD", "--", *spec], cwd=root, capture_output=True
        )
    except OSError:
        return "unknown"
    return head.stdout.strip() + ("-dirty" if diff.returncode else "")


def machine() -> str:
    """The CPU's model name and core count (and the GPU, where torch sees one)."""
    from stackwise.hwprobe import cpu_description

    text = f"{cpu_description()[0]}, {os.cpu_count()} cores"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        text += f", GPU {torch.cuda.get_device_name(0)}"
    return text


def command(argv: list[str] | None = None) -> str:
    """The command line that reproduces the run (without --record)."""
    argv = list(sys.argv if argv is None else argv)
    script = Path(argv[0]).resolve()
    try:
        shown = str(script.relative_to(HERE.parent))
    except ValueError:
        shown = str(script)
    return shlex.join(["python", shown, *(a for a in argv[1:] if a != "--record")])


def last_headline(output: str) -> str:
    """The text of the last `headline...: ` line printed ("headline (x): y" gives "x: y")."""
    for line in reversed(output.split("\n")):
        found = HEADLINE.match(line.strip())
        if found:
            return f"{found.group(1)}: {found.group(2)}" if found.group(1) else found.group(2)
    return "(no headline printed)"


class _Tee:
    """Writes go to the terminal and to a copy; anything else is the terminal's."""

    def __init__(self, out: TextIO, copy: io.StringIO) -> None:
        self.out, self.copy = out, copy

    def write(self, s: str) -> int:
        self.copy.write(s)
        return self.out.write(s)

    def flush(self) -> None:
        self.out.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.out, name)


class Recording:
    """Tees stdout while a benchmark runs; finish() records what it printed."""

    def __init__(self, name: str, enabled: bool) -> None:
        if enabled and "--quick" in sys.argv:
            raise SystemExit(
                f"{name}: --record with --quick would put a smoke run's figures on the "
                "dashboard in place of the benchmark's. Record a full run (drop --quick)."
            )
        self.name, self.enabled, self.copy = name, enabled, io.StringIO()
        self.stdout = sys.stdout
        if enabled:
            sys.stdout = _Tee(self.stdout, self.copy)

    def finish(self, goal: str = NO_GOAL, met: bool | None = None, headline: str = "") -> None:
        if not self.enabled:
            return
        sys.stdout.flush()
        sys.stdout = self.stdout
        output = self.copy.getvalue()
        run = Run(
            name=self.name,
            headline=headline or last_headline(output),
            goal=goal,
            met=met,
            output=output,
            command=command(),
            date=datetime.now(UTC).replace(microsecond=0),
            commit=commit(),
            machine=machine(),
        )
        record(run, RESULTS, HISTORY)
        print(f"recorded {self.name} in {RESULTS} and {HISTORY / (self.name + '.md')}")


def start(name: str, enabled: bool) -> Recording:
    """Begin capturing a benchmark's printed output when `enabled` (its --record flag)."""
    return Recording(name, enabled)
