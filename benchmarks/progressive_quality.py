"""Progressive growth against end-to-end training: validation NELBO, wall time and peak RSS.

Run from the repository root:

    .venv/bin/python benchmarks/progressive_quality.py            # full run, ~15-20 minutes
    .venv/bin/python benchmarks/progressive_quality.py --quick    # smoke run, ~2 minutes

The same rack (4 stacks x 1 block, d_model 128, 4 heads, seq 128, the default BPE vocabulary of
2048, tied embeddings, fp32) is trained on the built-in Shakespeare corpus with the masked
diffusion objective, with the SAME total number of optimizer steps (so the same training tokens:
steps x batch x seq_len; the table checks it) by:

  prog+cache     progressive growth, append, frozen trunk, head train_first, time as input, the
                 activation cache on; steps/4 steps per stack;
  prog fused     the same growth with (steps - joint)/4 steps per stack, then `joint` steps of
                 whole-rack tuning (mode fused);
  e2e stackwise  end to end, every stack with its own detached loss through the shared head;
  e2e rackwise   ordinary end-to-end training of the whole rack (the reference);

and, unless --no-variations, variations of the progressive run: head_policy always (embeddings and
head train in every stage, which needs the cache off), time as depth (stack g trains at noise
t in (g/4, (g+1)/4], cache on), and no cache (to separate the cache's effect from growth's); and,
unless --no-clm, a clm pair (prog+cache vs rackwise, same data and steps; validation loss, the mean
token cross entropy, instead of NELBO).

Data: every method trains on the same first `--samples` training sequences. The default is the
number of sequences one progressive stage draws (steps/4 x batch), i.e. each stack trains one
epoch over them: the regime where the cache pays (stack 2 fills it, stacks 3 and 4 read the
entries carried over from the stage before); the end-to-end runs see the same sequences 4 times.
`--samples 0` uses the whole training split instead (every method < 1 epoch; the cache then
almost never hits within a stage).

Quality: every final rack is scored by one common function (stackwise's `evaluate_model`) on the
validation split (all of its sequences, or the first --eval-seqs; batch 32), with the base
objective (full noise range) and one fixed seed, so every rack sees the same validation
batches, time steps and masks.
`val NELBO` is that number (for clm, the mean token cross entropy). The number each run reports
itself (progressive `final_eval`, end-to-end last `history` entry, both on the first
`--eval-batches` validation batches with the same masks) is shown too as `in-run`.

Timing: `wall s` is the wall time of the training call (`ProgressiveRecipe.train_progressively`
or `EnhancedTrainer.train`): all optimizer steps, the in-run evaluations (start and end of each
stage or run, `--eval-batches` batches each), cache carry-over and stage set-up, but not data
loading or the common evaluation; `cpu s` is the process CPU time of the same call (less
sensitive than wall time to other processes on a shared machine). `steps s` is the wall time of
the `EnhancedTrainer.optimizer_step` calls alone (one optimizer step each). Each run happens
in a fresh child forked after the corpus is loaded and tokenized, with one torch thread; `peak RSS`
is the child's VmHWM and `+RSS` its growth over the RSS it started with (the parent's imports and
data, shared by every run). Each configuration runs once (quality is deterministic for a seed;
time is a single measurement on a noisy machine, with the prog+cache and rackwise runs next to
each other). The last line printed is the headline.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _common as bench
import _record as record
import torch
from accelerate.utils import set_seed

from stackwise.config import Config, from_dict
from stackwise.data.pack import PreparedData, TokenBlocks, build_data
from stackwise.io.trained import build_rack
from stackwise.objectives import objective_from
from stackwise.pipeline import plan_for, progressive_recipe, resolve_vocab, trainer_for
from stackwise.spec import Plan as RunPlan
from stackwise.strategies import LocalLossStrategy
from stackwise.train.evaluation import eval_generator, evaluate_model
from stackwise.train.trainer import EnhancedTrainer

SEED = 0
EVAL_SEED = 4242  # the common evaluation's masks and time steps
EVAL_BATCH = 32


@dataclass(frozen=True)
class Plan:
    steps: int  # total optimizer steps of every method
    joint: int  # fused: joint-tuning steps out of `steps`
    samples: int  # training sequences (0 = all)
    n_stacks: int = 4
    d_model: int = 128
    n_heads: int = 4
    seq_len: int = 128
    batch_size: int = 8
    eval_batches: int = 2  # in-run evaluations
    eval_seqs: int = 0  # common evaluation: the first eval_seqs validation sequences (0 = all)


@dataclass(frozen=True)
class Variant:
    name: str
    objective: str = "diffusion"
    strategy: str = "progressive"  # or end_to_end
    scope: str = "rackwise"  # end_to_end only
    cache: bool = True
    fused: bool = False
    head_policy: str = "train_first"
    time: str = "input"


MAIN = (
    Variant("e2e rackwise", strategy="end_to_end"),
    Variant("prog+cache"),
    Variant("e2e stackwise", strategy="end_to_end", scope="stackwise"),
    Variant("prog fused", fused=True),
)
EXTRA = (
    Variant("prog, head always", cache=False, head_policy="always"),
    Variant("prog+cache, depth", time="depth"),
    Variant("prog, no cache", cache=False),
)
CLM = (
    Variant("clm e2e rackwise", objective="clm", strategy="end_to_end"),
    Variant("clm prog+cache", objective="clm"),
)


def make_config(plan: Plan, v: Variant, output_dir: Path) -> Config:
    prog: dict[str, Any] = {"strategy": v.strategy}
    if v.strategy == "end_to_end":
        if v.scope != "rackwise":
            prog["end_to_end_scope"] = v.scope
    else:
        grow = plan.steps - (plan.joint if v.fused else 0)
        prog.update(
            {
                "mode": "fused" if v.fused else "blockwise",
                "building_mode": "append",
                "trunk_strategy": "frozen",
                "head_policy": v.head_policy,
                "time_interpretation": v.time,
                "steps_per_stack": grow // plan.n_stacks,
                "save_stacks": False,
                "save_rack": True,  # never written: the benchmark does not call save()
            }
        )
        if v.fused:
            prog["joint_tuning_steps"] = plan.joint
        if v.cache:
            prog["cache"] = {"enabled": True, "storage": "memory", "dtype": "bf16"}
    train: dict[str, Any] = {}
    if v.strategy == "end_to_end":  # progressive budgets come from steps_per_stack
        train["max_steps"] = plan.steps
    data: dict[str, Any] = {"seq_len": plan.seq_len}
    if plan.samples:
        data["num_samples"] = plan.samples
    return from_dict(
        {
            "model": {
                "d_model": plan.d_model,
                "n_heads": plan.n_heads,
                "n_stacks": plan.n_stacks,
                "blocks_per_stack": 1,
                "max_seq_len": plan.seq_len,
            },
            "data": data,
            "objective": {"name": v.objective},
            "train": {
                "seed": SEED,
                **train,
                "batch_size": plan.batch_size,
                "mixed_precision": "no",
                "eval_every": plan.steps + 1,  # only the start and end evaluations
                "eval_batches": plan.eval_batches,
                **bench.fresh_output(output_dir),
            },
            "logging": bench.quiet_logging(log_every=50),
            "sample": {"num_samples": 0},
            "progressive": prog,
        },
        origin="benchmark",
    )


@dataclass
class Result:
    name: str
    objective: str
    metric: float  # common evaluation: NELBO (diffusion) or mean CE (clm)
    in_run: float
    wall_s: float
    cpu_s: float  # process CPU time of the same training call
    steps_s: float
    steps: int
    tokens: int
    peak_rss_mb: float
    rss_growth_mb: float
    stages: list[str] = field(default_factory=list)  # per-stack notes of progressive runs


def common_eval(
    rack: torch.nn.Module, run: RunPlan, data: PreparedData, acc: Any, n_seqs: int
) -> float:
    """One scoring for every rack: the validation split, base objective, fixed masks."""
    objective = objective_from(run.objective, run.masking, data.specials)
    val = TokenBlocks(data.val.blocks[:n_seqs]) if n_seqs else data.val
    tc = dataclasses.replace(run.train, batch_size=EVAL_BATCH, eval_batches=10**6)
    gen = torch.Generator(device=acc.device)
    out = evaluate_model(
        rack,
        objective,
        val,
        acc,
        tc,
        bool(getattr(rack, "uses_time", False)),
        lambda i: eval_generator(gen, EVAL_SEED, i, 0),
    )
    return out["nelbo"] if "nelbo" in out else out["loss"]


def run_once(plan: Plan, v: Variant, data: PreparedData, workdir: Path) -> Result:
    torch.set_num_threads(1)
    start_rss = bench.status_mb("VmRSS")
    step_time = [0.0]
    step = EnhancedTrainer.optimizer_step

    def timed_step(self: EnhancedTrainer, batches: Any) -> torch.Tensor | None:
        t0 = time.perf_counter()
        loss = step(self, batches)
        step_time[0] += time.perf_counter() - t0
        return loss

    EnhancedTrainer.optimizer_step = timed_step  # type: ignore[method-assign]
    config = resolve_vocab(make_config(plan, v, workdir), len(data.tokenizer))
    key = "nelbo" if v.objective == "diffusion" else "loss"
    set_seed(config.train.seed)
    stages: list[str] = []
    if v.strategy == "progressive":
        pt = progressive_recipe(config, data, output_dir=workdir, quiet=True)
        run = pt.plan
        t0, c0 = time.perf_counter(), time.process_time()
        res = pt.train_progressively()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        rack, acc = res.rack, pt.accelerator
        in_run = res.final_eval[key]
        steps = sum(r.steps for r in res.stacks) + (res.joint["steps"] if res.joint else 0)
        tokens = sum(r.tokens for r in res.stacks) + (res.joint["tokens"] if res.joint else 0)
        for r in res.stacks:
            c = r.cache
            hit = f"{100 * c['hits'] / max(1, c['hits'] + c['misses']):.0f}%" if c else "-"
            tr = f" t({r.t_range[0]:.2f},{r.t_range[1]:.2f}]" if r.t_range else ""
            stages.append(
                f"stack {r.index + 1}: {r.steps} steps, {r.seconds:.1f} s, stage eval "
                f"{key} {r.eval.get(key, float('nan')):.3f}{tr}, cache hits {hit}"
            )
        if res.joint:
            stages.append(
                f"joint: {res.joint['steps']} steps, {res.joint['seconds']:.1f} s, eval "
                f"{key} {res.joint['eval'].get(key, float('nan')):.3f}"
            )
    else:
        run = plan_for(config, data.train_size)
        assert run.model.vocab_size is not None
        rack = build_rack(run, run.model.vocab_size)
        objective = objective_from(run.objective, run.masking, data.specials)
        strategy = LocalLossStrategy() if v.scope == "stackwise" else None
        trainer = trainer_for(
            run, rack, objective, data.train, data.val, output_dir=workdir, strategy=strategy
        )
        t0, c0 = time.perf_counter(), time.process_time()
        state = trainer.train()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        rack, acc = trainer.raw_model, trainer.accelerator
        evals = [h for h in state.history if key in h]
        in_run = evals[-1][key]
        steps, tokens = state.step, state.tokens_seen
    metric = common_eval(rack, run, data, acc, plan.eval_seqs)
    if torch.get_num_threads() != 1:
        raise RuntimeError(f"the run changed the thread count to {torch.get_num_threads()}")
    peak = bench.status_mb("VmHWM")
    return Result(
        name=v.name,
        objective=v.objective,
        metric=metric,
        in_run=in_run,
        wall_s=wall,
        cpu_s=cpu,
        steps_s=step_time[0],
        steps=steps,
        tokens=tokens,
        peak_rss_mb=peak,
        rss_growth_mb=peak - start_rss,
        stages=stages,
    )


def run_forked(plan: Plan, v: Variant, data: PreparedData, workdir: Path) -> Result:
    return bench.in_fork(v.name, run_once, plan, v, data, workdir)


def table(results: list[Result]) -> str:
    head = (
        f"{'method':<19} {'objective':<9} {'val metric':>10} {'in-run':>7} {'vs rackwise':>11} "
        f"{'wall s':>7} {'cpu s':>7} {'steps s':>7} {'wall vs rw':>10} {'cpu vs rw':>9} "
        f"{'steps':>6} {'tokens':>9} "
        f"{'peak RSS MB':>11} {'+RSS MB':>7}"
    )
    rows = [head, "-" * len(head)]
    ref = {r.objective: r for r in results if r.name.endswith("e2e rackwise")}
    for r in results:
        base = ref.get(r.objective)
        rel = f"{r.metric / base.metric:.3f}" if base else "-"
        wrel = f"{r.wall_s / base.wall_s:.2f}" if base else "-"
        crel = f"{r.cpu_s / base.cpu_s:.2f}" if base else "-"
        rows.append(
            f"{r.name:<19} {r.objective:<9} {r.metric:>10.3f} {r.in_run:>7.3f} {rel:>11} "
            f"{r.wall_s:>7.1f} {r.cpu_s:>7.1f} {r.steps_s:>7.1f} {wrel:>10} {crel:>9} "
            f"{r.steps:>6} {r.tokens:>9,} "
            f"{r.peak_rss_mb:>11.0f} {r.rss_growth_mb:>7.0f}"
        )
    return "\n".join(rows)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = bench.benchmark_parser(__doc__, "smoke run: 48 steps, main methods only")
    p.add_argument("--steps", type=int, default=None, help="total steps per method (default 320)")
    p.add_argument("--joint", type=int, default=None, help="fused: joint steps (default steps/4)")
    p.add_argument(
        "--samples",
        type=int,
        default=None,
        help="training sequences; default: one progressive stage's draws; 0 = all",
    )
    p.add_argument("--eval-batches", type=int, default=2, help="batches of each in-run eval")
    p.add_argument(
        "--eval-seqs",
        type=int,
        default=None,
        help="validation sequences of the common evaluation (default all; --quick 128)",
    )
    p.add_argument("--no-variations", action="store_true", help="skip the extra progressive runs")
    p.add_argument("--no-clm", action="store_true", help="skip the clm pair")
    p.add_argument("--only", nargs="*", default=None, help="run only these method names")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    rec = record.start("progressive_quality", args.record)
    steps = args.steps or (48 if args.quick else 320)
    joint = args.joint if args.joint is not None else steps // 4
    n_stacks, batch = 4, 8
    if steps % n_stacks or (steps - joint) % n_stacks or not 0 < joint < steps:
        sys.exit("steps and steps - joint must be multiples of 4 stacks, with 0 < joint < steps")
    samples = args.samples if args.samples is not None else steps // n_stacks * batch
    eval_seqs = args.eval_seqs if args.eval_seqs is not None else (128 if args.quick else 0)
    plan = Plan(
        steps=steps,
        joint=joint,
        samples=samples,
        eval_batches=args.eval_batches,
        eval_seqs=eval_seqs,
    )
    variants = list(MAIN)
    if not (args.quick or args.no_variations):
        variants += EXTRA
    if not (args.quick or args.no_clm):
        variants += CLM
    if args.only:
        variants = [v for v in variants if v.name in args.only]
    bench.pin_threads()

    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="stackwise-bench-") as tmp:
        data = build_data(make_config(plan, MAIN[0], Path(tmp)).data)
        print(bench.machine_line())
        print(
            f"model: {plan.n_stacks} stacks x 1 block, d_model {plan.d_model}, {plan.n_heads} "
            f"heads, vocab {len(data.tokenizer)}, seq {plan.seq_len}, batch {plan.batch_size}; "
            f"{plan.steps} steps per method (fused: {(plan.steps - plan.joint) // 4} per stack + "
            f"{plan.joint} joint); {len(data.train):,} training sequences "
            f"({plan.steps * plan.batch_size / len(data.train):.2f} end-to-end epochs); "
            f"common eval on {plan.eval_seqs or len(data.val)} of {len(data.val)} validation "
            "sequences"
        )
        print("each run in a fresh forked child, once", flush=True)
        for v in variants:
            t0 = time.perf_counter()
            r = run_forked(plan, v, data, Path(tmp) / v.name.replace(" ", "_"))
            results.append(r)
            print(
                f"  {v.name:<19} val {r.metric:.3f} (in-run {r.in_run:.3f}), wall "
                f"{r.wall_s:.1f} s (CPU {r.cpu_s:.1f} s), steps {r.steps_s:.1f} s, "
                f"peak RSS {r.peak_rss_mb:.0f} MB "
                f"(+{r.rss_growth_mb:.0f}); {time.perf_counter() - t0:.0f} s with the eval",
                flush=True,
            )
            for note in r.stages:
                print(f"      {note}", flush=True)
    print()
    print(table(results))
    print()
    by = {r.name: r for r in results}
    a, d = by.get("prog+cache"), by.get("e2e rackwise")
    if a and d:
        print(
            f"headline: prog+cache vs e2e rackwise: val NELBO {a.metric / d.metric:.3f}x "
            f"({a.metric:.3f} vs {d.metric:.3f}; goal <= 1.05), wall time "
            f"{a.wall_s / d.wall_s:.2f}x ({a.wall_s:.0f} s vs {d.wall_s:.0f} s; goal <= 0.60), "
            f"CPU time {a.cpu_s / d.cpu_s:.2f}x"
        )
    met = a.metric <= 1.05 * d.metric and a.wall_s <= 0.60 * d.wall_s if a and d else None
    rec.finish("prog+cache val NELBO ≤ 1.05x e2e rackwise's in ≤ 0.60x its wall time", met)


if __name__ == "__main__":
    main()
