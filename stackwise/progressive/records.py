"""What a progressive run reports: a record per stack, the result, and the summary table."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stackwise.model.rack import Rack
from stackwise.units import format_flops


@dataclass
class StackRecord:
    index: int
    position: int
    steps: int
    tokens: int
    seconds: float
    trainable_params: int
    t_range: tuple[float, float] | None
    train_loss: float | None
    eval: dict[str, float]
    cache: dict[str, Any] = field(default_factory=dict)
    budget: int | None = None  # the steps the stage was given (None: an older history)
    stopped_on_plateau: bool = False  # growth.schedule plateau: it passed steps on
    flops: float = 0.0  # this stage's training FLOPs (carrying the cache into it included)

    def as_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


@dataclass
class ProgressiveResult:
    rack: Rack
    output_dir: Path
    stacks: list[StackRecord]
    final_eval: dict[str, float]
    joint: dict[str, Any] | None = None

    def compute(self) -> tuple[float, int]:
        """(training FLOPs, tokens) over every stage and the joint tuning."""
        joint = self.joint or {}
        flops = sum(r.flops for r in self.stacks) + joint.get("flops", 0.0)
        return flops, sum(r.tokens for r in self.stacks) + joint.get("tokens", 0)


def steps_cell(record: StackRecord) -> str:
    """The steps a stage ran, starred when it ended on a plateau."""
    return f"{record.steps}*" if record.stopped_on_plateau else str(record.steps)


def footnotes(stacks: list[StackRecord]) -> list[str]:
    """The table's notes: a starred step count, and why a cache column of 0% is not a broken
    cache (no stage saw a sample twice)."""
    notes = []
    if any(r.stopped_on_plateau for r in stacks):
        notes.append("* stopped on a plateau; its unused steps went to the next stage")
    caches = [r.cache for r in stacks if r.cache]
    if not caches or any(c["hits"] for c in caches) or not any(c["misses"] for c in caches):
        return notes
    if any(c.get("evictions") for c in caches):  # the budget may be the cause
        return [
            *notes,
            "cache: stored, never read, and entries were evicted: a stage reads an entry "
            "when it sees the same sample again, if progressive.cache.max_bytes kept it",
        ]
    note = (
        "cache: stored, never read: a stage reads an entry when it sees the same sample "
        "(and mask variant) again, and no stage ran past one pass over them"
    )
    if any(r.t_range for r in stacks):
        note += " (with time as depth every stage starts with an empty cache)"
    return [*notes, note]


def summary_table(result: ProgressiveResult) -> str:
    """One row per stack: steps, tokens, training FLOPs, time, its eval, the cache's work."""
    head = (
        f"{'stack':>5} {'pos':>3} {'steps':>6} {'tokens':>10} {'FLOPs':>7} {'time s':>7} "
        f"{'t range':>13} "
        f"{'val loss':>8} {'nelbo/ppl':>9} {'val bpc':>7} {'cache hit%':>10}"
    )
    rows = [head, "-" * len(head)]
    for r in result.stacks:
        ev = r.eval
        metric = ev.get("nelbo", ev.get("ppl", float("nan")))
        tr = f"({r.t_range[0]:.2f},{r.t_range[1]:.2f}]" if r.t_range else "all"
        c = r.cache
        hit = f"{100 * c['hits'] / max(1, c['hits'] + c['misses']):.0f}%" if c else "-"
        rows.append(
            f"{r.index:>5} {r.position:>3} {steps_cell(r):>6} {r.tokens:>10,} "
            f"{format_flops(r.flops):>7} {r.seconds:>7.1f} {tr:>13} "
            f"{ev.get('loss', float('nan')):>8.3f} {metric:>9.3f} "
            f"{ev.get('bpc', float('nan')):>7.3f} {hit:>10}"
        )
    rows.extend(footnotes(result.stacks))
    spent, tokens = result.compute()
    if result.joint:
        joint = result.joint
        rows.append(
            f"joint tuning: {joint['steps']} steps, {joint['tokens']:,} tokens, "
            f"{format_flops(joint.get('flops', 0.0))} FLOPs"
        )
    rows.append(f"run total: {format_flops(spent)} training FLOPs over {tokens:,} tokens")
    f = result.final_eval
    if f:
        metric = f.get("nelbo", f.get("ppl", float("nan")))
        rows.append(
            f"final rack (full noise range): val loss {f['loss']:.3f}, "
            + (f"NELBO {metric:.3f}" if "nelbo" in f else f"ppl {metric:.2f}")
            + (f", {f['bpc']:.3f} bits per character" if "bpc" in f else "")
            + (
                f"; routed by noise level (time as depth) vs the whole rack's NELBO "
                f"{f['whole_rack_nelbo']:.3f}"
                if "whole_rack_nelbo" in f
                else ""
            )
        )
    return "\n".join(rows)
