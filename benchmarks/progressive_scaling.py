"""Progressive growth: optimizer-step time while training stack k = 1..8, activation cache on/off.

Run from the repository root:

    .venv/bin/python benchmarks/progressive_scaling.py            # full run, a few minutes
    .venv/bin/python benchmarks/progressive_scaling.py --quick    # smoke run, under a minute

One progressive run grows an 8-stack rack (1 block per stack, append, frozen trunk, head policy
train_first, time as input, masked-diffusion objective, fp32) on the built-in Shakespeare corpus,
capped at `--samples` training sequences, stack by stack through the progressive recipe
(`stackwise.pipeline.progressive_recipe`, a `stackwise.progressive.ProgressiveRecipe`). Every
stack trains for `--epochs` epochs over that capped set (steps_per_stack = epochs x samples /
batch). The same run is made with `progressive.cache.enabled` true and false.

What is timed: every call of `EnhancedTrainer.optimizer_step` (monkeypatched on the class),
i.e. one optimizer step: fetching and collating the batch, masking, the trunk (run under no_grad
without the cache; read from / written to the cache with it), forward and backward of the new
stack and the head, clipping, AdamW and the scheduler. Steps are grouped by the stack being
trained and each stack's median step time is t(k). Not timed: construction, evaluations, saving,
and the cache's carry-over between stages (pushing every cached entry through the just-frozen
stack, `advance_cache`), which is timed separately and shown as `carry ms`.

With the cache on, stack 1 trains with no trunk (no cache); stack 2 fills the cache during its
first epoch (misses: the trunk runs and its output is stored) and reads it afterwards (hits);
from stack 3 on, the entries carried over from the previous stage cover every key, so all steps
are hits. With >= 2 epochs per stack the median is therefore dominated by steady-state hits; the
hit rate per stack is printed next to it. t(1) also updates the embeddings (and the tied head),
which later stacks leave frozen (head_policy train_first), so it is slightly more expensive than a
cached step of a later stack.

`cache B/token` is the cache's bytes divided by the tokens whose hidden states it holds (entries x
seq_len), read from the cache after each stage: it should be d_model x 2 bytes (bf16).

Repetitions are interleaved (cache on, cache off, cache on, ...), each run in a fresh child forked
from this process after the corpus is loaded, with one torch thread. t(k)/t(1) is computed within
each run and the table shows its median over repetitions. The same ratios are also computed from
each step's CPU time (`time.thread_time()` of the one thread that runs the step): on a shared
machine whose load changes during a run, wall-clock medians of late stacks can be inflated by
other processes, CPU time much less so (`cpu ratio` columns). `none/cache` is the per-rep paired
ratio of the two settings' wall-clock step times. The last line printed is the headline.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _common as bench
import _record as record
import torch

import stackwise.progressive.stage_cache as prog_stage_cache
from stackwise.config import Config, from_dict
from stackwise.data.pack import PreparedData, build_data
from stackwise.pipeline import progressive_recipe
from stackwise.progressive import GrowingRack, ProgressiveRecipe
from stackwise.train.trainer import EnhancedTrainer

SEED = 0


@dataclass(frozen=True)
class Plan:
    reps: int
    n_stacks: int
    samples: int
    epochs: int
    d_model: int
    n_heads: int
    seq_len: int
    batch_size: int
    vocab: int

    @property
    def steps_per_stack(self) -> int:
        return self.epochs * self.samples // self.batch_size


def make_config(plan: Plan, cache: bool, output_dir: Path) -> Config:
    prog: dict[str, Any] = {
        "strategy": "progressive",
        "mode": "blockwise",
        "building_mode": "append",
        "trunk_strategy": "frozen",
        "head_policy": "train_first",
        "time_interpretation": "input",
        "steps_per_stack": plan.steps_per_stack,
        "save_stacks": False,
        "save_rack": True,  # never written: the benchmark does not call save()
    }
    if cache:
        prog["cache"] = {"enabled": True, "storage": "memory", "dtype": "bf16", "mode": "stack"}
    return from_dict(
        {
            "model": {
                "d_model": plan.d_model,
                "n_heads": plan.n_heads,
                "n_stacks": plan.n_stacks,
                "blocks_per_stack": 1,
                "max_seq_len": plan.seq_len,
            },
            "data": {
                "seq_len": plan.seq_len,
                "num_samples": plan.samples,
                "bpe_vocab_size": plan.vocab,
            },
            "objective": {"name": "diffusion"},
            "train": {
                "seed": SEED,
                "batch_size": plan.batch_size,
                "mixed_precision": "no",
                "eval_every": plan.steps_per_stack + 1,  # only the start/end evals of a stage
                "eval_batches": 1,
                **bench.fresh_output(output_dir),
            },
            "logging": bench.quiet_logging(log_every=plan.steps_per_stack),
            "sample": {"num_samples": 0},
            "progressive": prog,
        },
        origin="benchmark",
    )


@dataclass
class StageResult:
    median_ms: float
    median_cpu_ms: float  # the same steps' CPU time (this thread), less sensitive to other load
    hits: int
    misses: int
    bytes: int
    cached_tokens: int
    carry_ms: float


@dataclass
class RunResult:
    stages: list[StageResult] = field(default_factory=list)

    def ratio(self, k: int) -> float:
        return self.stages[k].median_ms / self.stages[0].median_ms

    def cpu_ratio(self, k: int) -> float:
        return self.stages[k].median_cpu_ms / self.stages[0].median_cpu_ms


# -- one run ----------------------------------------------------------------------------------

_current_stage = [-1]
_step_times: dict[int, list[float]] = defaultdict(list)
_step_cpu: dict[int, list[float]] = defaultdict(list)
_carry_times: dict[int, float] = defaultdict(float)


def _install_clocks() -> None:
    """Wrap EnhancedTrainer.optimizer_step (every optimizer step), ProgressiveRecipe.train_stage
    (which stack trains) and advance_cache (the carry-over between stages) in this child
    process."""
    step, stage, advance = (
        EnhancedTrainer.optimizer_step,
        ProgressiveRecipe.train_stage,
        prog_stage_cache.advance_cache,
    )

    def timed_step(self: EnhancedTrainer, batches: Any) -> torch.Tensor | None:
        t0, c0 = time.perf_counter(), time.thread_time()
        loss = step(self, batches)
        _step_times[_current_stage[0]].append(time.perf_counter() - t0)
        _step_cpu[_current_stage[0]].append(time.thread_time() - c0)
        return loss

    def tracked_stage(self: ProgressiveRecipe, index: int, n_stacks: int) -> Any:
        _current_stage[0] = index
        return stage(self, index, n_stacks)

    def timed_advance(*args: Any, **kwargs: Any) -> int:
        t0 = time.perf_counter()
        out = advance(*args, **kwargs)
        _carry_times[_current_stage[0]] += time.perf_counter() - t0
        return out

    EnhancedTrainer.optimizer_step = timed_step  # type: ignore[method-assign]
    ProgressiveRecipe.train_stage = tracked_stage  # type: ignore[method-assign]
    prog_stage_cache.advance_cache = timed_advance  # type: ignore[assignment]


def run_once(plan: Plan, cache: bool, data: PreparedData, workdir: Path) -> RunResult:
    torch.set_num_threads(1)
    _install_clocks()
    torch.manual_seed(SEED)
    recipe = progressive_recipe(
        make_config(plan, cache, workdir), data, output_dir=workdir, quiet=True
    )
    # the records are written at the end of each stage; read the cache's contents then too
    contents: dict[int, tuple[int, int]] = {}
    write_history = GrowingRack.write_history

    def after_stage(growing: GrowingRack) -> None:
        c = recipe.cache
        if c is not None and growing.records:
            entries = sum(len(s.slot_of) for s in c.stores.values())
            contents[len(growing.records) - 1] = (c.nbytes, entries * plan.seq_len)
        write_history(growing)

    GrowingRack.write_history = after_stage  # type: ignore[method-assign]  (this child only)
    result = recipe.train_progressively()
    if torch.get_num_threads() != 1:
        raise RuntimeError(f"the run changed the thread count to {torch.get_num_threads()}")
    out = RunResult()
    for rec in result.stacks:
        times = _step_times[rec.index]
        if len(times) != rec.steps:
            raise RuntimeError(f"stack {rec.index}: timed {len(times)} of {rec.steps} steps")
        nbytes, tokens = contents.get(rec.index, (0, 0))
        out.stages.append(
            StageResult(
                median_ms=1000 * statistics.median(times),
                median_cpu_ms=1000 * statistics.median(_step_cpu[rec.index]),
                hits=rec.cache.get("hits", 0),
                misses=rec.cache.get("misses", 0),
                bytes=nbytes,
                cached_tokens=tokens,
                carry_ms=1000 * _carry_times.get(rec.index, 0.0),
            )
        )
    return out


def run_forked(plan: Plan, cache: bool, data: PreparedData, workdir: Path) -> RunResult:
    return bench.in_fork(f"run (cache {cache})", run_once, plan, cache, data, workdir)


# -- report -----------------------------------------------------------------------------------


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def table(on: list[RunResult], off: list[RunResult], plan: Plan) -> str:
    head = (
        f"{'stack k':>7} {'ms/step cache':>13} {'ms/step none':>12} {'t(k)/t(1) cache':>15} "
        f"{'t(k)/t(1) none':>14} {'cpu ratio cache':>15} {'cpu ratio none':>14} "
        f"{'none/cache':>10} {'hit rate':>8} {'carry ms':>8} {'cache MB':>8} {'B/token':>7}"
    )
    rows = [head, "-" * len(head)]
    for k in range(plan.n_stacks):
        c_ms = med([r.stages[k].median_ms for r in on])
        n_ms = med([r.stages[k].median_ms for r in off])
        paired = med(
            [b.stages[k].median_ms / a.stages[k].median_ms for a, b in zip(on, off, strict=True)]
        )
        s = on[0].stages[k]  # hits, misses and bytes are deterministic: the same in every rep
        looked = s.hits + s.misses
        hit = f"{100 * s.hits / looked:.0f}%" if looked else "-"
        carry = f"{med([r.stages[k].carry_ms for r in on]):.0f}" if k >= 2 else "-"
        mb = f"{s.bytes / 2**20:.2f}" if s.bytes else "-"
        bpt = f"{s.bytes / s.cached_tokens:.0f}" if s.cached_tokens else "-"
        rows.append(
            f"{k + 1:>7} {c_ms:>13.1f} {n_ms:>12.1f} {med([r.ratio(k) for r in on]):>15.3f} "
            f"{med([r.ratio(k) for r in off]):>14.3f} {med([r.cpu_ratio(k) for r in on]):>15.3f} "
            f"{med([r.cpu_ratio(k) for r in off]):>14.3f} {paired:>10.2f} {hit:>8} {carry:>8} "
            f"{mb:>8} {bpt:>7}"
        )
    return "\n".join(rows)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = bench.benchmark_parser(__doc__, "smoke run: 1 rep, 4 stacks, 2 epochs")
    p.add_argument("--reps", type=int, default=None, help="interleaved repetitions (default 5)")
    p.add_argument("--stacks", type=int, default=None, help="stacks to grow (default 8)")
    p.add_argument("--samples", type=int, default=None, help="training sequences (default 64)")
    p.add_argument("--epochs", type=int, default=None, help="epochs per stack (default 4)")
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--vocab", type=int, default=512, help="BPE vocabulary (trained once, cached)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    rec = record.start("progressive_scaling", args.record)
    quick = args.quick
    plan = Plan(
        reps=args.reps or (1 if quick else 5),
        n_stacks=args.stacks or (4 if quick else 8),
        samples=args.samples or (32 if quick else 64),
        epochs=args.epochs or (2 if quick else 4),
        d_model=args.d_model,
        n_heads=args.heads,
        seq_len=args.seq_len,
        batch_size=args.batch,
        vocab=args.vocab,
    )
    if plan.epochs < 2 or plan.samples % plan.batch_size or plan.n_stacks < 2:
        sys.exit("need epochs >= 2, samples a multiple of the batch size, and >= 2 stacks")
    bench.pin_threads()

    with tempfile.TemporaryDirectory(prefix="stackwise-bench-") as tmp:
        data = build_data(make_config(plan, False, Path(tmp)).data)
        print(bench.machine_line())
        print(
            f"model: {plan.n_stacks} stacks x 1 block, d_model {plan.d_model}, {plan.n_heads} "
            f"heads, vocab {len(data.tokenizer)}, seq {plan.seq_len}, batch {plan.batch_size}; "
            f"diffusion, append, frozen trunk, head train_first, time as input"
        )
        print(
            f"plan: {plan.reps} interleaved reps x (cache on, cache off); {len(data.train)} "
            f"training sequences, {plan.epochs} epochs = {plan.steps_per_stack} steps per stack; "
            "each run in a fresh forked child",
            flush=True,
        )
        on: list[RunResult] = []
        off: list[RunResult] = []
        for rep in range(plan.reps):
            for cache, bucket in ((True, on), (False, off)):
                t0 = time.perf_counter()
                r = run_forked(plan, cache, data, Path(tmp) / f"run{rep}-{cache}")
                bucket.append(r)
                ms = " ".join(f"{s.median_ms:5.1f}" for s in r.stages)
                print(
                    f"  rep {rep + 1}/{plan.reps} cache {'on ' if cache else 'off'} "
                    f"({time.perf_counter() - t0:4.0f} s) ms/step by stack: {ms}",
                    flush=True,
                )
    print()
    print(table(on, off, plan))
    print()
    last = plan.n_stacks
    c = med([r.ratio(last - 1) for r in on])
    n = med([r.ratio(last - 1) for r in off])
    cc = med([r.cpu_ratio(last - 1) for r in on])
    nc = med([r.cpu_ratio(last - 1) for r in off])
    print(
        f"headline: t({last})/t(1): cache {c:.2f}, no cache {n:.2f} "
        f"(wall-clock medians; CPU time: cache {cc:.2f}, no cache {nc:.2f})"
    )
    rec.finish(f"t({last})/t(1) with the cache ≤ 1.25", c <= 1.25)


if __name__ == "__main__":
    main()
