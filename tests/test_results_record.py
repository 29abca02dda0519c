"""benchmarks/RESULTS.md as a dashboard: `--record` (benchmarks/_record.py, _dashboard.py)
rewrites one benchmark's row and section, leaves every other byte alone, and prepends the run
to benchmarks/history/<benchmark>.md. Dates, commits and machines are passed in: nothing here
reads the clock, git or the terminal."""

from __future__ import annotations

import dataclasses
import re
import sys
from datetime import UTC, datetime
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.append(str(BENCHMARKS))

import _dashboard as dash  # noqa: E402
import _record as record  # noqa: E402

SAMPLE = (
    "# Benchmark results\n\nIntro, with a table below.\n\n"
    + dash.HEADER
    + "\n"
    + dash.RULE
    + "\n"
    + "| alpha | a 1.00x | ≥ 1x | met | 2026-01-01 | abc1234 | cpu, 2 cores | `python a.py` |\n"
    + "| beta | b 2.00x | — | — | 2026-01-02 | not recorded | cpu, 2 cores | `python b.py` |\n"
    + "\n## alpha\n\n## alpha — 2026-01-01 (first)\n\n```\n## beta\na fenced line that looks "
    "like a heading\n```\n\n### Reading\ntext\n\n\n"
    + "## beta\n\n## beta — 2026-01-02\n\nbody of beta,\twith a tab and trailing spaces  \n"
)
BETA = SAMPLE[SAMPLE.index("## beta\n\n## beta — ") :]


def run(name: str = "alpha", day: int = 3, output: str = "t\nheadline: a 1.50x\n") -> dash.Run:
    return dash.Run(
        name=name,
        headline=record.last_headline(output),
        goal="≥ 1x",
        met=True,
        output=output,
        command=f"python benchmarks/{name}.py --quick",
        date=datetime(2026, 2, day, 12, 0, tzinfo=UTC),
        commit="f00ba12",
        machine="Test CPU, 2 cores",
    )


def rows(text: str) -> dict[str, list[str]]:
    return {r[0]: r for r in dash.parse_table(text)}


def test_recording_replaces_only_its_row_and_section() -> None:
    new = dash.update_results(SAMPLE, run())
    assert new.startswith(SAMPLE[: SAMPLE.index("| alpha |")])
    assert new.endswith(BETA)  # the section after it, to the last byte
    assert rows(new)["beta"] == rows(SAMPLE)["beta"]
    assert rows(new)["alpha"] == [
        "alpha",
        "a 1.50x",
        "≥ 1x",
        "met",
        "2026-02-03",
        "f00ba12",
        "Test CPU, 2 cores",
        "`python benchmarks/alpha.py --quick`",
    ]
    section = new[new.index("## alpha\n") : new.index("## beta\n\n## beta — ")]
    assert "## alpha — 2026-02-03" in section and "headline: a 1.50x" in section
    assert "- **Commit:** f00ba12" in section and "(first)" not in section
    assert new.count("## beta\n") == 1  # the fenced look-alike went with alpha's old section


def test_recording_twice_leaves_one_row_and_one_section() -> None:
    once = dash.update_results(SAMPLE, run())
    twice = dash.update_results(once, run())
    assert twice == once
    other = dash.update_results(once, run(day=4, output="headline: a 1.60x\n"))
    assert list(rows(other)) == ["alpha", "beta"]
    assert other.count("\n## alpha\n") == 1 and rows(other)["alpha"][1] == "a 1.60x"
    assert other.endswith(BETA)


def test_a_new_benchmark_gets_a_row_and_a_section_at_the_end() -> None:
    new = dash.update_results(SAMPLE, run("gamma"))
    assert list(rows(new)) == ["alpha", "beta", "gamma"]
    row = dash.format_row(dash.row_cells(run("gamma")))
    head, tail = new.split(row + "\n")
    assert SAMPLE.startswith(head)
    assert tail.startswith(SAMPLE[len(head) :].rstrip("\n") + "\n\n## gamma\n\n## gamma — ")
    assert new.endswith("headline: a 1.50x\n```\n")


def test_history_is_newest_first_and_keeps_what_was_there() -> None:
    old = "# alpha: history\n\nIntro.\n\n## alpha — 2025-12-01 (old)\n\nold body\n"
    first = dash.update_history(old, run(day=3, output="headline: third\n"))
    second = dash.update_history(first, run(day=5, output="headline: fifth\n"))
    assert second.startswith("# alpha: history\n\nIntro.\n\n## alpha — 2026-02-05")
    assert second.index("headline: fifth") < second.index("headline: third")
    assert second.endswith("\n\n## alpha — 2025-12-01 (old)\n\nold body\n")
    fresh = dash.update_history(None, run())
    assert fresh.startswith(dash.history_header("alpha")) and fresh.count("\n## alpha — ") == 1


def test_two_runs_on_one_day_get_distinct_headings() -> None:
    """A history's headings are its anchors: two runs of one day differ by time and commit."""
    morning = run(output="headline: morning\n")
    evening = dataclasses.replace(
        morning, date=morning.date.replace(hour=18, minute=5), commit="cafe123"
    )
    text = dash.update_history(dash.update_history(None, morning), evening)
    heads = [line for line in text.split("\n") if line.startswith("## ")]
    assert heads == [
        "## alpha — 2026-02-03 18:05 UTC at cafe123 (recorded with --record)",
        "## alpha — 2026-02-03 12:00 UTC at f00ba12 (recorded with --record)",
    ]


def test_record_writes_both_files(tmp_path: Path) -> None:
    results, history = tmp_path / "RESULTS.md", tmp_path / "history"
    results.write_bytes(SAMPLE.encode())
    record.record(run(), results, history)
    record.record(run(day=4), results, history)
    text = results.read_bytes().decode()
    assert text.endswith(BETA) and list(rows(text)) == ["alpha", "beta"]
    past = (history / "alpha.md").read_text()
    assert past.index("2026-02-04") < past.index("2026-02-03")


def test_a_run_is_teed_and_recorded(monkeypatch, capsys) -> None:
    got = []
    monkeypatch.setattr(record, "record", lambda run, *paths: got.append(run))
    monkeypatch.setattr(record, "commit", lambda: "f00ba12")
    monkeypatch.setattr(record, "machine", lambda: "Test CPU, 2 cores")
    rec = record.start("alpha", True)
    print("name  value")
    print("headline (one seed): alpha 1.50x")
    rec.finish("≥ 1x", True)
    assert "headline (one seed)" in capsys.readouterr().out  # still printed
    (done,) = got
    assert done.output == "name  value\nheadline (one seed): alpha 1.50x\n"
    assert done.headline == "one seed: alpha 1.50x" and done.met is True
    record.start("alpha", False).finish("≥ 1x", True)
    assert len(got) == 1


def test_command_drops_record_and_names_the_script() -> None:
    argv = [str(BENCHMARKS / "alpha.py"), "--steps", "3", "--record", "--set", "a b"]
    assert record.command(argv) == "python benchmarks/alpha.py --steps 3 --set 'a b'"


CELL = st.text(st.characters(blacklist_characters="|\n"), max_size=30)


@given(st.lists(CELL, min_size=1, max_size=8))
def test_a_row_round_trips(cells: list[str]) -> None:
    assert dash.parse_row(dash.format_row(cells)) == cells


@given(st.lists(st.lists(CELL, min_size=7, max_size=7), max_size=5))
def test_the_table_round_trips(table: list[list[str]]) -> None:
    text = "# t\n\n" + dash.HEADER + "\n" + dash.RULE + "\n\n## a\n\ntext\n"
    for i, cells in enumerate(table):
        text = dash.replace_row(text, [f"b{i}", *cells])
    assert dash.parse_table(text) == [[f"b{i}", *cells] for i, cells in enumerate(table)]
    assert text.endswith("\n\n## a\n\ntext\n")


def test_the_committed_results_has_a_row_and_section_per_benchmark() -> None:
    text = record.read(record.RESULTS)
    table = rows(text)
    lines = text.split("\n")
    scripts = sorted(p for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_"))
    recorded = []
    for script in scripts:
        assert script.stem in table, f"no row for {script.name}"
        assert dash.section_span(lines, script.stem), f"no section for {script.name}"
        names = re.findall(r'record\.start\(\s*"(\w+)"', script.read_text())
        if names:
            assert names == [script.stem]
            source = script.read_text()
            assert any(f in source for f in ("benchmark_parser(", "quick_flag(", "add_flag("))
            recorded.append(script.stem)
    assert len(recorded) >= 15
    assert all(len(cells) == len(dash.COLUMNS) for cells in table.values())
    assert len(table) == len(dash.parse_table(text))  # one row per benchmark
