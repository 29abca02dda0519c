"""benchmarks/RESULTS.md as a dashboard, and the history files beside it: plain text in, text out.

RESULTS.md holds a table with one row per benchmark (headline, goal, met, date, commit, machine,
command), then one section per benchmark under a heading `## <benchmark>` with its newest run.
benchmarks/history/<benchmark>.md keeps every section of that benchmark, newest first. The
functions here replace one benchmark's row and section, or prepend to a history, and leave
every other byte as it was; _record.py runs them for a benchmark's --record.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

COLUMNS = ("benchmark", "headline", "goal", "met", "date", "commit", "machine", "command")
HEADER = "| " + " | ".join(COLUMNS) + " |"
RULE = "|" + "---|" * len(COLUMNS)
NO_GOAL = "—"
SECTION = re.compile(r"^## ([A-Za-z0-9_]+)\s*$")  # a dashboard section's own heading
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")


@dataclass(frozen=True)
class Run:
    """One recorded run: what the script printed and where it ran."""

    name: str
    headline: str
    goal: str
    met: bool | None
    output: str
    command: str
    date: datetime
    commit: str
    machine: str


# ---- the table -----------------------------------------------------------------------------


def format_row(cells: list[str]) -> str:
    """A table row; a `|` in a cell is escaped, a line break becomes a space."""
    clean = [c.replace("\r\n", " ").replace("\n", " ").replace("|", "\\|") for c in cells]
    return "| " + " | ".join(clean) + " |"


def parse_row(line: str) -> list[str]:
    """The cells of a row that format_row wrote (the padding space on each side is dropped)."""
    if not (line.startswith("| ") and line.endswith(" |")) or len(line) < 4:
        raise ValueError(f"not a table row: {line!r}")
    return [c.replace("\\|", "|") for c in line[2:-2].split(" | ")]


def table_span(lines: list[str]) -> tuple[int, int]:
    """(index of the first row, index after the last) of the benchmark table."""
    start = lines.index(HEADER) + 2
    if lines[start - 1] != RULE:
        raise ValueError("the benchmark table's header is not followed by its rule")
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return start, end


def parse_table(text: str) -> list[list[str]]:
    lines = text.split("\n")
    start, end = table_span(lines)
    return [parse_row(line) for line in lines[start:end]]


def met_text(met: bool | None) -> str:
    return NO_GOAL if met is None else ("met" if met else "missed")


def row_cells(run: Run) -> list[str]:
    return [
        run.name,
        run.headline,
        run.goal,
        met_text(run.met),
        run.date.strftime("%Y-%m-%d"),
        run.commit,
        run.machine,
        code(run.command),
    ]


def replace_row(text: str, cells: list[str]) -> str:
    """The table with the row of benchmark cells[0] replaced, or added at its end."""
    lines = text.split("\n")
    start, end = table_span(lines)
    row = format_row(cells)
    names = [parse_row(line)[0] for line in lines[start:end]]
    if cells[0] in names:
        lines[start + names.index(cells[0])] = row
    else:
        lines.insert(end, row)
    return "\n".join(lines)


# ---- the sections --------------------------------------------------------------------------


def outside_fences(lines: list[str]) -> Iterator[tuple[int, str]]:
    """(index, line) of the lines that are not in a fenced code block (nor its fences)."""
    fence = None
    for i, line in enumerate(lines):
        found = FENCE.match(line)
        if fence is None:
            if found:
                fence = found.group(1)
            else:
                yield i, line
        elif found and closes(found, fence):
            fence = None


def closes(found: re.Match[str], fence: str) -> bool:
    """A closing fence: the opening's character, at least as long, nothing after it."""
    mark = found.group(1)
    return mark[0] == fence[0] and len(mark) >= len(fence) and not found.group(2).strip()


def section_span(lines: list[str], name: str) -> tuple[int, int] | None:
    """[start, end) of the dashboard section `## name`: up to the next such heading."""
    heads = [(i, m.group(1)) for i, line in outside_fences(lines) if (m := SECTION.match(line))]
    for k, (i, found) in enumerate(heads):
        if found == name:
            return i, heads[k + 1][0] if k + 1 < len(heads) else len(lines)
    return None


def code(text: str) -> str:
    """`text` as inline code, with a longer delimiter when it holds backticks."""
    ticks = "``" if "`" in text else "`"
    pad = " " if ticks == "``" else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def section_text(run: Run) -> str:
    """The section a recorded run gets, in RESULTS.md and at the top of its history."""
    output = run.output.rstrip("\n")
    longest = max((len(m.group(0)) for m in re.finditer(r"`+", output)), default=0)
    fence = "`" * max(3, longest + 1)
    return "\n".join(
        [
            f"## {run.name} — {run.date:%Y-%m-%d %H:%M} UTC at {run.commit}"
            " (recorded with --record)",  # time and commit: two runs of a day get two anchors
            "",
            f"- **Date:** {run.date:%a %b %d %H:%M:%S UTC %Y}",
            f"- **Commit:** {run.commit}",
            f"- **Machine:** {run.machine}",
            f"- **Command:** {code(run.command)}",
            f"- **Goal:** {run.goal}" + ("" if run.met is None else f" ({met_text(run.met)})"),
            "",
            fence,
            output,
            fence,
        ]
    )


def replace_section(text: str, name: str, body: str) -> str:
    """The file with section `## name` holding `body`, added at the end if it was not there."""
    lines = text.split("\n")
    block = [f"## {name}", "", *body.split("\n"), ""]
    span = section_span(lines, name)
    if span is None:
        while lines and lines[-1] == "":
            lines.pop()
        return "\n".join([*lines, "", *block])
    start, end = span
    return "\n".join(lines[:start] + block + lines[end:])


def update_results(text: str, run: Run) -> str:
    return replace_section(replace_row(text, row_cells(run)), run.name, section_text(run))


def history_header(name: str) -> str:
    return (
        f"# {name}: history\n\nEvery recorded section of `benchmarks/{name}.py`, newest first;\n"
        "the newest also stands in [RESULTS.md](../RESULTS.md).\n"
    )


def update_history(text: str | None, run: Run) -> str:
    """The history with the run's section first (before the first `## ` heading)."""
    section = section_text(run).split("\n")
    lines = (text if text is not None else history_header(run.name)).split("\n")
    first = next((i for i, line in outside_fences(lines) if line.startswith("## ")), None)
    if first is None:
        while lines and lines[-1] == "":
            lines.pop()
        return "\n".join([*lines, "", *section, ""])
    return "\n".join(lines[:first] + section + [""] + lines[first:])
