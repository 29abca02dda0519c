"""The report's figures, drawn with matplotlib; the page keeps them as inline SVG text.

Curves are drawn stage by stage: a progressive run's stacks each get their own curve (one colour
per stack when one run is shown, one colour per run when several are overlaid), and a dotted line
marks where each new stack began. The x axis is the run's step, the tokens it had seen, or the
training FLOPs it had spent, so runs that grew differently compare on what they cost.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from matplotlib import rc_context
from matplotlib.figure import Figure

from stackwise.report.runs import Run, Stage

AXES = {"step": "step", "tokens": "tokens seen", "flops": "training FLOPs"}
COLOURS = [f"C{i}" for i in range(10)]
STYLE = {"svg.fonttype": "none", "font.size": 9, "legend.fontsize": 7, "axes.titlesize": 8}


def styled(build: Callable[..., Figure]) -> Callable[..., Figure]:
    """Build the figure under the report's style: text sizes are fixed when text is made."""

    @functools.wraps(build)
    def inner(*args: Any, **kwargs: Any) -> Figure:
        with rc_context(STYLE):
            return build(*args, **kwargs)

    return inner


def to_svg(fig: Figure, salt: str) -> str:
    """The figure as SVG text, without the XML header (it is inlined) or a date. `salt` (the
    figure's element id) keeps the ids of its clip paths and markers apart from other SVGs'."""
    buf = io.StringIO()
    with rc_context({**STYLE, "svg.hashsalt": salt}):
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = buf.getvalue()
    return text[text.index("<svg") :]


def legend_text(name: str) -> str:
    """A run or stage name as matplotlib shows it: `$` would start math, and a leading `_`
    hides the entry."""
    name = name.replace("$", r"\$")
    return "\u200b" + name if name.startswith("_") else name


def _tokens_at(stage: Stage) -> Callable[[dict[str, Any]], float | None]:
    """Tokens seen by the run at a row: logged (train/run_tokens), or read off the stage's
    train rows by step (an eval row between or after them: at the last rows' rate)."""
    steps = [r["step"] for r in stage.rows if "train/tokens" in r]
    tokens = [r["train/tokens"] for r in stage.rows if "train/tokens" in r]
    rate = tokens[-1] / steps[-1] if steps and steps[-1] else 0.0

    def at(row: dict[str, Any]) -> float | None:
        if "train/run_tokens" in row:
            return float(row["train/run_tokens"])
        if not steps:
            return None
        if row["step"] > steps[-1]:
            return stage.tokens_before + tokens[-1] + rate * (row["step"] - steps[-1])
        return stage.tokens_before + float(np.interp(row["step"], [0, *steps], [0, *tokens]))

    return at


def x_of(stage: Stage, axis: str) -> Callable[[dict[str, Any]], float | None]:
    if axis == "step":
        return lambda row: float(stage.step_offset + row["step"])
    if axis == "tokens":
        return _tokens_at(stage)
    return lambda row: row.get("train/flops")


def began(stage: Stage, axis: str) -> float:
    """Where the stage starts on `axis`: the run's steps, tokens and FLOPs before it."""
    return {"step": stage.step_offset, "tokens": stage.tokens_before, "flops": stage.flops_before}[
        axis
    ]


def curve(stage: Stage, key: str, axis: str) -> tuple[list[float], list[float]]:
    at = x_of(stage, axis)
    points = [(at(r), r[key]) for r in stage.rows if key in r]
    kept = [(x, y) for x, y in points if x is not None and y is not None and np.isfinite(y)]
    return [x for x, _ in kept], [y for _, y in kept]


def _colour(runs: Sequence[Run], run_index: int, stage_index: int) -> str:
    return COLOURS[(stage_index if len(runs) == 1 else run_index) % len(COLOURS)]


def _label(runs: Sequence[Run], run: Run, stage: Stage, suffix: str) -> str | None:
    if len(runs) == 1 and len(run.stages) == 1:
        return "validation" if suffix else "train"
    if len(runs) == 1:
        return legend_text(f"{stage.name}{suffix}")
    return legend_text(f"{run.name}{suffix}") if stage is run.stages[0] else None


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
            if growth and stage.name.startswith("stack") and j > 0:
                ax.axvline(began(stage, axis), color=colour, ls=":", lw=0.9)
            drawn += len(xs)
    return drawn


def _finish(ax: Any, axis: str, ylabel: str) -> None:
    ax.set_xlabel(AXES[axis])
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend()


@styled
def loss_figure(runs: Sequence[Run], val_key: str, train_key: str | None, ylabel: str) -> Figure:
    """`train_key` (solid) and `val_key` (dashed) against steps, tokens and FLOPs."""
    axes_shown = [a for a in AXES if a != "flops" or any(r.rows("train/flops") for r in runs)]
    fig = Figure(layout="constrained", figsize=(4.2 * len(axes_shown), 3.2))
    for n, axis in enumerate(axes_shown):
        ax = fig.add_subplot(1, len(axes_shown), n + 1)
        if train_key:
            draw(ax, runs, train_key, axis)
        draw(ax, runs, val_key, axis, dashed=True, growth=train_key is None)
        _finish(ax, axis, ylabel)
    return fig


@styled
def metric_figure(runs: Sequence[Run], keys: Sequence[str], ylabel: str) -> Figure:
    """One panel per key against the run's step."""
    fig = Figure(layout="constrained", figsize=(4.6 * len(keys), 3.0))
    for n, key in enumerate(keys):
        ax = fig.add_subplot(1, len(keys), n + 1)
        draw(ax, runs, key, "step")
        ax.set_title(key)
        _finish(ax, "step", ylabel)
    return fig


@styled
def noise_figure(runs: Sequence[Run]) -> Figure:
    """The eval's loss per masked token at each noise level, and its share of the NELBO."""
    fig = Figure(layout="constrained", figsize=(8.4, 3.2))
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for i, run in enumerate(runs):
        levels = (run.eval or {}).get("likelihood", {}).get("by_noise") or []
        if not levels:
            continue
        rate = [p["mask_rate"] for p in levels]
        colour, name = COLOURS[i % len(COLOURS)], legend_text(run.name)
        left.plot(rate, [p["loss_per_masked"] for p in levels], "o-", color=colour, label=name)
        right.plot(rate, [p["nelbo_share"] for p in levels], "o-", color=colour, label=name)
    left.set_ylabel("loss per masked token (nats)")
    right.set_ylabel("weighted NELBO term (nats/token)")
    for ax in (left, right):
        ax.set_xlabel("mask rate")
        ax.grid(alpha=0.3)
        ax.legend()
    return fig
