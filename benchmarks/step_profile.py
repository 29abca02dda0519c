"""Where a training step's time goes: torch.profiler over real Trainer steps, per objective.

    .venv/bin/python benchmarks/step_profile.py                         # clm, fp32 and bf16
    .venv/bin/python benchmarks/step_profile.py --objectives clm,mlm,diffusion

The rack and settings are throughput.py's (4 layers of d_model 128, 4 heads, seq 64, batch 12,
vocab 65, one thread). The Trainer runs `warmup` steps unprofiled, then `steps` profiled ones.
For each objective and precision the table lists the ops with the most self CPU time per step,
and the share spent in the objective's own work (masking in `prepare`, the loss), read from
the profiler's record_function ranges, so a slow masking or loss path shows up by name.
"""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Iterator
from pathlib import Path

import _common as bench
import _record as record
import throughput as tp
import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule

from stackwise.objectives import Specials, build_objective
from stackwise.pipeline import trainer_for


def profiled(shape: tp.Shape, plan: tp.Plan, objective_name: str, out: Path) -> tuple:
    """(profiler, ms per step) of `plan.steps` Trainer steps after `plan.warmup` plain ones."""
    config = tp.make_config(shape, plan, out, objective={"name": objective_name})
    rack = tp.fresh_rack(config, shape.vocab_size)
    specials = Specials(vocab_size=shape.vocab_size, pad_id=tp.PAD_ID, mask_id=tp.MASK_ID)
    objective = build_objective(config, specials)
    prepare, loss = objective.prepare, objective.loss

    def labelled_prepare(*args, **kwargs):
        with record_function("objective.prepare"):
            return prepare(*args, **kwargs)

    def labelled_loss(*args, **kwargs):
        with record_function("objective.loss"):
            return loss(*args, **kwargs)

    objective.prepare, objective.loss = labelled_prepare, labelled_loss  # type: ignore[method-assign]
    tokens = tp.random_tokens(shape, plan)
    trainer = trainer_for(config, rack, objective, tp.TokenRows(tokens), val_data=None)
    step, clock = trainer.optimizer_step, tp.StepClock()
    prof = profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=plan.warmup, warmup=0, active=plan.steps),
    )

    def timed_step(batches: Iterator[dict[str, torch.Tensor]]) -> torch.Tensor | None:
        result = step(batches)
        clock.tick()
        prof.step()
        return result

    trainer.optimizer_step = timed_step  # type: ignore[method-assign]
    with prof:
        trainer.train()
    times = [b - a for a, b in zip(clock.times, clock.times[1:], strict=False)][plan.warmup :]
    return prof, 1000 * statistics.median(times)


def summary(prof: object, steps: int, rows: int) -> tuple[list[tuple[str, float, int]], dict]:
    """Top ops by self CPU ms per step, and the objective's ranges' total ms per step."""
    events = prof.key_averages()  # type: ignore[attr-defined]
    ops = sorted(
        (e for e in events if not e.key.startswith(("objective.", "ProfilerStep"))),
        key=lambda e: e.self_cpu_time_total,
        reverse=True,
    )
    top = [(e.key, e.self_cpu_time_total / 1000 / steps, e.count // steps) for e in ops[:rows]]
    ranges = {
        e.key: e.cpu_time_total / 1000 / steps for e in events if e.key.startswith("objective.")
    }
    return top, ranges


def report(name: str, precision: str, ms: float, top: list, ranges: dict) -> str:
    lines = [f"{name}, {precision}: {ms:.1f} ms per step (median)"]
    for key in ("objective.prepare", "objective.loss"):
        if key in ranges:
            lines.append(f"  {key:<40} {ranges[key]:7.2f} ms/step ({100 * ranges[key] / ms:4.1f}%)")
    lines.append(f"  {'op':<40} {'self ms/step':>12} {'share':>6} {'calls/step':>10}")
    for key, per_step, calls in top:
        lines.append(f"  {key[:40]:<40} {per_step:12.2f} {100 * per_step / ms:5.1f}% {calls:>10}")
    return "\n".join(lines)


def run(name: str, precision: str, rows: int, plan: tp.Plan) -> str:
    tp.PRECISION = precision
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        prof, ms = profiled(tp.Shape("vocab 65", 65), plan, name, Path(tmp) / "run")
    top, ranges = summary(prof, plan.steps, rows)
    return report(name, precision, ms, top, ranges)


def main() -> None:
    p = bench.benchmark_parser(__doc__, "smoke run: 3 + 4 steps")
    p.add_argument(
        "--objectives", default="clm", help="comma-separated: clm, mlm, diffusion (one-pass racks)"
    )
    p.add_argument("--precisions", default="no,bf16", help="no (fp32), bf16, or both")
    p.add_argument("--rows", type=int, default=15, help="ops listed per table")
    args = p.parse_args()
    rec = record.start("step_profile", args.record)
    plan = tp.Plan(1, 3, 4) if args.quick else tp.Plan(1, 10, 20)
    bench.pin_threads()
    print(bench.machine_line("fp32 and bf16 tables"))
    medians = []
    for name in args.objectives.split(","):
        for precision in args.precisions.split(","):
            text = bench.in_fork(f"{name} {precision}", run, name, precision, args.rows, plan)
            print(text)
            print()
            medians.append(text.split(" ms per step")[0].replace(",", "").replace(":", ""))
    print("headline: ms per step under the profiler (median): " + ", ".join(medians))
    rec.finish()


if __name__ == "__main__":
    main()
