"""The report's figures, drawn with matplotlib and kept as inline SVG text.

Curves are drawn stage by stage: a progressive run's stacks each get their own curve (one colour
per stack when one run is shown, one colour per run when several are overlaid), and a dotted line
marks where each new stack began. The x axis is the run's step, the tokens it had seen, or the
training FLOPs it had spent, so runs that grew differently compare on what they cost.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from matplotlib import rc_context
from matplotlib.figure import Figure

from stackwise.report.runs import Run, Stage

AXES = {"step": "step", "tokens": "tokens seen", "flops": "training FLOPs"}
COLOURS = [f"C{i}" for i in range(10)]
STYLE = {"svg.fonttype": "none", "font.size": 9}
_drawn = iter(range(1 << 30))


def to_svg(fig: Figure) -> str:
    """The figure as SVG text, without the XML header (it is inlined) or a date. Each figure
    gets its own salt, so the ids of clip paths and markers differ between the page's SVGs."""
    buf = io.StringIO()
    with rc_context({**STYLE, "svg.hashsalt": f"stackwise-{next(_drawn)}"}):
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = buf.getvalue()
    return text[text.index("<svg") :]


def _tokens_at(stage: Stage) -> Callable[[dict[str, Any]], float | None]:
    """Tokens seen by the run at a row: logged directly (train/run_tokens for a stage, or
    train/tokens for a whole run), or read off the stage's train rows by step."""
    steps = [r["step"] for r in stage.rows if "train/tokens" in r]
    tokens = [r["train/tokens"] for r in stage.rows if "train/tokens" in r]
    before = 0.0
    first = next((r for r in stage.rows if "train/run_tokens" in r and "train/tokens" in r), None)
    if first is not None:
        before = first["train/run_tokens"] - first["train/tokens"]

    def at(row: dict[str, Any]) -> float | None:
        if "train/run_tokens" in row:
            return float(row["train/run_tokens"])
        if not steps:
            return None
        return before + float(np.interp(row["step"], [0, *steps], [0, *tokens]))

    return at


def x_of(stage: Stage, axis: str) -> Callable[[dict[str, Any]], float | None]:
    if axis == "step":
        return lambda row: float(stage.step_offset + row["step"])
    if axis == "tokens":
        return _tokens_at(stage)
    return lambda row: row.get("train/flops")


def curve(stage: Stage, key: str, axis: str) -> tuple[list[float], list[float]]:
    at = x_of(stage, axis)
    points = [(at(r), r[key]) for r in stage.rows if key in r]
    kept = [(x, y) for x, y in points if x is not None and y is not None and np.isfinite(y)]
    return [x for x, _ in kept], [y for _, y in kept]


def _colour(runs: Sequence[Run], run_index: int, stage_index: int) -> str:
    return COLOURS[(stage_index if len(runs) == 1 else run_index) % len(COLOURS)]


def _label(runs: Sequence[Run], run: Run, stage: Stage, suffix: str) -> str | None:
    if len(runs) == 1:
        return f"{stage.name}{suffix}" if len(run.stages) > 1 or suffix else None
    return f"{run.name}{suffix}" if stage is run.stages[0] else None


def draw(
    ax: Any, runs: Sequence[Run], key: str, axis: str, dashed: bool = False, growth: bool = True
) -> int:
    """Each run's curve of `key` stage by stage, and (`growth`) a dotted line where each new
    stack began; returns the number of points drawn."""
    drawn = 0
    for i, run in enumerate(runs):
        for j, stage in enumerate(run.stages):
            xs, ys = curve(stage, key, axis)
            if not xs:
                continue
            colour = _colour(runs, i, j)
            style = {"ls": "--", "marker": "o", "ms": 3} if dashed else {"lw": 1.2}
            suffix = " (val)" if dashed else ""
            ax.plot(xs, ys, color=colour, label=_label(runs, run, stage, suffix), **style)
            began = x_of(stage, axis)(stage.rows[0])
            if growth and stage.name.startswith("stack") and j > 0 and began is not None:
                ax.axvline(began, color=colour, ls=":", lw=0.9)
            drawn += len(xs)
    return drawn


def _finish(ax: Any, axis: str, ylabel: str, log_x: bool = False) -> None:
    ax.set_xlabel(AXES[axis])
    ax.set_ylabel(ylabel)
    if log_x:
        ax.set_xscale("log")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def loss_figure(runs: Sequence[Run], val_key: str, train_key: str | None, ylabel: str) -> str:
    """`train_key` (solid) and `val_key` (dashed) against steps, tokens and FLOPs."""
    axes_shown = [a for a in AXES if a != "flops" or any(r.rows("train/flops") for r in runs)]
    fig = Figure(figsize=(4.2 * len(axes_shown), 3.2))
    for n, axis in enumerate(axes_shown):
        ax = fig.add_subplot(1, len(axes_shown), n + 1)
        if train_key:
            draw(ax, runs, train_key, axis)
        draw(ax, runs, val_key, axis, dashed=True, growth=train_key is None)
        _finish(ax, axis, ylabel)
    return to_svg(fig)


def metric_figure(
    runs: Sequence[Run], keys: Sequence[str], ylabel: str, log_y: bool = False
) -> str:
    """One panel per key against the run's step."""
    fig = Figure(figsize=(4.6 * len(keys), 3.0))
    for n, key in enumerate(keys):
        ax = fig.add_subplot(1, len(keys), n + 1)
        draw(ax, runs, key, "step")
        if log_y:
            ax.set_yscale("log")
        ax.set_title(key, fontsize=8)
        _finish(ax, "step", ylabel)
    return to_svg(fig)


def noise_figure(runs: Sequence[Run]) -> str:
    """The eval's loss per masked token at each noise level, and its share of the NELBO."""
    fig = Figure(figsize=(8.4, 3.2))
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for i, run in enumerate(runs):
        levels = (run.eval or {}).get("likelihood", {}).get("by_noise") or []
        if not levels:
            continue
        rate = [p["mask_rate"] for p in levels]
        colour = COLOURS[i % len(COLOURS)]
        left.plot(rate, [p["loss_per_masked"] for p in levels], "o-", color=colour, label=run.name)
        right.plot(rate, [p["nelbo_share"] for p in levels], "o-", color=colour, label=run.name)
    left.set_ylabel("loss per masked token (nats)")
    right.set_ylabel("weighted NELBO term (nats/token)")
    for ax in (left, right):
        ax.set_xlabel("mask rate")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return to_svg(fig)
