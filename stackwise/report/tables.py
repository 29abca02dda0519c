"""The report's tables as rows of strings: the runs' final metrics side by side, each run's
stages, the config keys that differ between runs, a config flattened for diffing."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from stackwise.report.runs import Run
from stackwise.units import format_flops

Table = tuple[list[str], list[list[str]]]  # (header, rows)


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"train.lr": 0.001, ...}: one line per leaf, which a text diff lines up."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out |= flatten(value, f"{name}.")
        else:
            out[name] = value
    return out


def _num(value: Any, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _most(run: Run, *keys: str) -> float | None:
    """The largest value logged under any of `keys` (peak memory: a resumed run's counter
    starts again, so its last row can be below the run's peak)."""
    values = [r[k] for k in keys for _, r in run.rows(k)]
    return max(values) if values else None


def _median(run: Run, key: str) -> float | None:
    values = [r[key] for _, r in run.rows(key)]
    return statistics.median(values) if values else None


def final_metrics(runs: Sequence[Run]) -> Table:
    """One row per run: what it trained and where it ended."""
    header = [
        "run",
        "objective",
        "stages",
        "steps",
        "tokens",
        "training FLOPs",
        "val loss",
        "val bpc",
        "median tokens/s",
        "peak memory MB",
        "finished",
    ]
    rows = []
    for run in runs:
        final, total = run.final_eval() or {}, run.totals()
        memory = _most(run, "train/peak_gpu_mb", "train/peak_rss_mb")
        rows.append(
            [
                run.name,
                run.objective,
                str(len(run.stages)),
                _num(int(total["steps"])),
                _num(int(total["tokens"])),
                format_flops(total["flops"]) if total["flops"] else "-",
                _num(final.get("loss")),
                _num(final.get("bpc")),
                _num(_median(run, "train/tokens_per_s"), 0),
                _num(memory, 0),
                "yes" if run.complete else "no (stopped or running)",
            ]
        )
    return header, rows


def _t_range(value: Any) -> str:
    """A stack's noise range under time as depth; "all" where every stack sees every t."""
    return f"{value[0]:.3g}..{value[1]:.3g}" if value else "all"


def stage_table(run: Run) -> Table:
    """A progressive run's stacks (and joint tuning) as progressive_history.json has them."""
    header = [
        "stage",
        "steps",
        "tokens",
        "FLOPs",
        "seconds",
        "trainable params",
        "t range",
        "val loss",
        "val bpc",
        "stopped early",
    ]
    rows = []
    for stage in run.stages:
        rec, ev = stage.record, stage.record.get("eval") or {}
        flops = format_flops(rec["flops"]) if rec.get("flops") else "-"
        rows.append(
            [
                stage.name,
                _num(rec.get("steps")),
                _num(rec.get("tokens")),
                flops,
                _num(rec.get("seconds"), 1),
                _num(rec.get("trainable_params")),
                _t_range(rec.get("t_range")),
                _num(ev.get("loss")),
                _num(ev.get("bpc")),
                "yes" if rec.get("stopped_on_plateau") else "no",
            ]
        )
    return header, rows


def _setting(value: Any) -> str:
    """A config value as written in YAML: null, true, 3e-05 (not rounded to a width)."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def config_differences(runs: Sequence[Run]) -> Table:
    """The keys whose values differ between the runs (a key one run lacks counts as differing)."""
    flat = [flatten(r.config) for r in runs]
    keys = sorted(set().union(*flat))
    rows = [
        [key, *(_setting(f[key]) if key in f else "(not set)" for f in flat)]
        for key in keys
        if len({repr(f.get(key, "(not set)")) for f in flat}) > 1
    ]
    return ["key", *(r.name for r in runs)], rows


def eval_table(run: Run) -> Table:
    """`stackwise eval`'s figures (eval.json): likelihood, conditional, and sample quality."""
    report = run.eval or {}
    rows = []
    for part in ("likelihood", "conditional", "samples"):
        for key, value in (report.get(part) or {}).items():
            if key != "by_noise" and not isinstance(value, list | dict):
                whole = isinstance(value, float) and value.is_integer()
                rows.append([part, key.replace("_", " "), _num(int(value) if whole else value)])
    return ["part", "figure", "value"], rows


def env_table(env: dict[str, Any]) -> Table:
    return ["what", "value"], [[k, _num(v)] for k, v in flatten(env).items()]


SAMPLER_FIGURES = (  # (eval's key, column, digits): how the samples read, and what they cost
    ("gen_ppl", "gen PPL", 2),
    ("entropy", "unigram entropy", 3),
    ("distinct_2", "distinct-2", 3),
    ("in_corpus", "words in corpus", 3),
    ("longest_repeat_run", "longest repeat run", 0),
    ("tokens_per_s", "tokens/s", 0),
    ("forward_passes_per_sample", "forward passes", 0),
)


def samplers_table(run: Run) -> Table:
    """One row per sampler setting `stackwise eval` scored on the run (eval_samplers.json)."""
    header = ["sampler settings", *(column for _, column, _ in SAMPLER_FIGURES)]
    rows = []
    for row in run.samplers:
        setting = ", ".join(f"{k} {v}" for k, v in (row.get("sampling") or {}).items())
        figures = row.get("samples") or {}
        rows.append([setting, *(_num(figures.get(key), d) for key, _, d in SAMPLER_FIGURES)])
    return header, rows
