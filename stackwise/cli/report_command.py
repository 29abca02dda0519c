"""`stackwise report`, and `--report` on `stackwise train`: a run's HTML page."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any


def cmd_report(ns: argparse.Namespace) -> int:
    """Write one self-contained HTML page (plots inline, no network needed to view it) of the
    runs given: per run its config, machine and versions, summary, and curves of loss, val
    bits per character, LR, tokens/s and memory against steps, tokens and FLOPs, one curve per
    stack with each growth marked; diffusion runs add the eval's loss by noise level and
    samples, fine-tunes their adapter. Several runs are overlaid and their configs diffed."""
    from stackwise.report import write_report

    print(f"report: {write_report(ns.runs, ns.out)}")
    return 0


def report_flag(parser: Any) -> None:
    parser.add_argument(
        "--report",
        action="store_true",
        help="at the end, write the run's HTML report to report.html in its folder (`stackwise "
        "report RUN --out FILE.html` writes one anywhere)",
    )


def report_parser(sub: Any, about: Callable[[Any], str]) -> None:
    summary = "write an HTML report of one or more runs (plots, config, machine, samples)"
    r = sub.add_parser("report", help=summary, description=about(cmd_report))
    r.add_argument("runs", nargs="+", metavar="RUN", help="run folders (train.output_dir)")
    r.add_argument(
        "--out",
        metavar="FILE.html",
        help="where to write it (default: report.html in the run's folder; for several runs, "
        "report.html in the current folder)",
    )
    r.set_defaults(func=cmd_report)
