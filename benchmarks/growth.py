"""Does growing a rack stack by stack reach end-to-end quality for less compute, and how?

Run from the repository root:

    .venv/bin/python benchmarks/growth.py --objective clm --seeds 0 --recipes all
    .venv/bin/python benchmarks/growth.py --objective clm --seeds 0,1,2 --recipes e2e,full/stack_all
    .venv/bin/python benchmarks/growth.py --report                  # tables from every run so far
    .venv/bin/python benchmarks/growth.py --quick                   # a smoke run, ~2 minutes

The rack: 4 stacks x 1 block, d_model 128, 4 heads, characters of the built-in Shakespeare
corpus, 64 per sequence, the run's default precision (bf16 autocast where it pays). The
reference is the end-to-end run of the final rack (`e2e`): clm trains 1,000 steps of 32
sequences, diffusion 1,500 of 64, with a cosine LR schedule; its training FLOPs F (counted by
stackwise.train.flops, logged with every row) are the budget of every other recipe.

A progressive recipe grows the same rack in 4 stages with one global LR schedule (warmup once,
one decay over all stages; the `wsd` recipes keep the LR flat until the last 20%). Its stage
budgets are set so that its training FLOPs equal F: a 2-step probe run measures each stage's
FLOPs per step, and the steps per stage follow from the schedule (fixed: equal steps; share:
stack k gets a weight k + 1; plateau: the fixed budgets, a stage ending early when its val loss
stops improving and passing its steps on). Every run evaluates every 50 steps on the same
validation batches (same masks and noise levels), so each is a curve of val bits per character
against training FLOPs and wall seconds.

The headline: the FLOPs (and wall time) each recipe needs to reach the end-to-end run's final val
bpc of the same seed, as a ratio to the end-to-end run's FLOPs (wall time), mean over seeds with
the spread; a recipe that never gets there within the budget shows its final bpc instead. Each
run is a fresh forked process; with --jobs 2 two run side by side, each on one torch thread
(wall ratios then compare runs that shared the machine alike). A run only counts if it learned:
the table shows the corpus's unigram entropy, and each final bpc must sit far below it.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import statistics
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import _common as bench
import _record as record

N_STACKS = 4
EVAL_EVERY = 50
SETTINGS: dict[str, dict[str, Any]] = {
    "clm": {
        "objective": {"name": "clm"},
        "train": {"batch_size": 32, "lr": 0.003, "warmup_steps": 50, "max_steps": 1000},
    },
    "diffusion": {
        "objective": {"name": "diffusion"},
        "masking": {"schedule": "cosine"},
        "train": {"batch_size": 64, "lr": 0.005, "warmup_steps": 100, "max_steps": 1500},
    },
}
THREADS = [1]  # torch threads per run (--threads), set before the runs are forked
FINGERPRINT = [""]  # the settings a run was made with: results of other settings are not mixed
TARGETS = {"clm": 2.4, "diffusion": 3.1}  # the bar for an end-to-end run that learned


def grow(trunk: str, init: str, schedule: str = "fixed", wsd: bool = False) -> dict[str, Any]:
    """The config sections of one progressive recipe."""
    progressive: dict[str, Any] = {
        "strategy": "progressive",
        "building_mode": "append",
        "trunk_strategy": trunk,
        "head_policy": "always" if trunk == "full" else "train_first",
        "lr_schedule": "global",
        "growth": {"init": init, "schedule": schedule},
    }
    sections: dict[str, Any] = {"progressive": progressive}
    if trunk == "frozen":
        progressive["cache"] = {"enabled": True}
    if trunk == "qlora":
        sections["quant"] = {"enabled": True, "type": "nf4"}
        sections["lora"] = {
            "enabled": True,
            "trunk_adapters": True,
            "trunk_rank": 8,
            "trunk_alpha": 16,
        }
    if wsd:
        sections["train"] = {"scheduler": "wsd", "decay_ratio": 0.2}
    if schedule == "plateau":
        progressive["growth"].update({"patience": 2, "min_delta": 0.005})
    return sections


OPERATORS = ("random", "copy_last", "copy_middle", "stack_all", "zero_out")
RECIPES: dict[str, dict[str, Any]] = {
    "e2e": {"progressive": {"strategy": "end_to_end"}},
    "e2e/wsd": {
        "progressive": {"strategy": "end_to_end"},
        "train": {"scheduler": "wsd", "decay_ratio": 0.2},
    },
    **{f"full/{op}": grow("full", op) for op in OPERATORS},
    "frozen+cache/random": grow("frozen", "random"),
    "frozen+cache/copy_last": grow("frozen", "copy_last"),
    "qlora/copy_last": grow("qlora", "copy_last"),
    "full/stack_all/share+wsd": grow("full", "stack_all", "budget_share", wsd=True),
    "full/stack_all/plateau": grow("full", "stack_all", "plateau"),
    "full/zero_out/share+wsd": grow("full", "zero_out", "budget_share", wsd=True),
    "full/copy_last/share+wsd": grow("full", "copy_last", "budget_share", wsd=True),
    "full/copy_middle/share+wsd": grow("full", "copy_middle", "budget_share", wsd=True),
}


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        out[key] = merge(out.get(key, {}), value) if isinstance(value, dict) else value
    return out


def config_for(objective: str, recipe: str, seed: int, out: Path, **train: Any) -> dict[str, Any]:
    base = {
        "model": {"d_model": 128, "n_heads": 4, "n_stacks": N_STACKS, "blocks_per_stack": 1},
        "data": {"tokenizer": "char", "seq_len": 64},
        "train": {
            "seed": seed,
            "scheduler": "cosine",
            "min_lr_ratio": 0.1,
            "eval_every": EVAL_EVERY,
            "eval_batches": 8,
            **bench.fresh_output(out),
        },
        "logging": bench.quiet_logging(jsonl=True),
        "sample": {"num_samples": 0},
    }
    cfg = merge(merge(base, SETTINGS[objective]), RECIPES[recipe])
    return merge(cfg, {"train": train})


def train(config: dict[str, Any]) -> float:
    """One run in this (forked) process; its wall seconds."""
    import time

    import torch

    bench.pin_threads()
    torch.set_num_threads(THREADS[0])
    import stackwise
    from stackwise.config import from_dict

    start = time.perf_counter()
    stackwise.train_from_config(from_dict(config), quiet=True)
    return time.perf_counter() - start


def curve(run_dir: Path) -> list[tuple[float, float, float]]:
    """(training FLOPs, val bpc, seconds since the run began) at every evaluation, stages in
    order; the final eval of a grown rack is its last stage's last point."""
    files = sorted(run_dir.glob("stack_*/metrics.jsonl")) or [run_dir / "metrics.jsonl"]
    rows = [json.loads(line) for f in files for line in f.read_text().splitlines()]
    start = rows[0]["time"] if rows else 0.0
    return [(r["train/flops"], r["val/bpc"], r["time"] - start) for r in rows if "val/bpc" in r]


PROBED: dict[str, list[float]] = {}


def stage_costs(objective: str, recipe: str, seed: int, work: Path) -> list[float]:
    """FLOPs per step of each stage of a progressive recipe, from a 2-step-per-stage probe
    (once per trunk and objective: the operator and schedule do not change a step's work)."""
    sections = {k: v for k, v in RECIPES[recipe].items() if k != "train"}
    key = json.dumps(
        [
            objective,
            {
                **sections,
                "progressive": {k: v for k, v in sections["progressive"].items() if k != "growth"},
            },
        ],
        sort_keys=True,
    )
    if key not in PROBED:
        PROBED[key] = probe(objective, recipe, seed, work)
    return PROBED[key]


def probe(objective: str, recipe: str, seed: int, work: Path) -> list[float]:
    out = work / f"probe-{objective}-{recipe.replace('/', '_')}-{seed}"
    cfg = config_for(objective, recipe, seed, out, eval_every=2, eval_batches=1)
    cfg["progressive"]["steps_per_stack"] = 2
    cfg["progressive"]["growth"] = {"init": cfg["progressive"]["growth"]["init"]}
    cfg["train"].pop("max_steps")
    cfg["train"].pop("decay_ratio", None)
    cfg["train"]["scheduler"] = "cosine"
    bench.in_fork(f"probe {recipe}", train, cfg)
    history = json.loads((out / "progressive_history.json").read_text())
    return [s["flops"] / s["steps"] for s in history["stacks"]]


def budgets(cfg: dict[str, Any], costs: list[float], flops: float) -> dict[str, Any]:
    """The recipe's step budget that spends `flops` (the end-to-end run's) over its stages."""
    schedule = cfg["progressive"]["growth"]["schedule"]
    if schedule == "budget_share":
        weights = [k + 1.0 for k in range(len(costs))]
        per_weight = flops / sum(w * c for w, c in zip(weights, costs, strict=True))
        return {"train": {"max_steps": round(per_weight * sum(weights))}}
    steps = math.floor(flops / sum(costs))
    return {"progressive": {"steps_per_stack": steps}}


def run(job: tuple[str, str, int, Path, dict[str, Any], str]) -> dict[str, Any]:
    """One recipe's run; `label` is the recipe, with `@share` when it gets another budget."""
    objective, recipe, seed, work, extra, label = job
    out = work / f"{objective}-{label.replace('/', '_')}-{seed}"
    cfg = merge(config_for(objective, recipe, seed, out), extra)
    if "steps_per_stack" in cfg.get("progressive", {}):
        cfg["train"].pop("max_steps")  # the stages' budgets are the run's
    wall = train(cfg)
    points = curve(out)
    history = out / "progressive_history.json"
    stages = json.loads(history.read_text())["stacks"] if history.is_file() else []
    return {
        "settings": FINGERPRINT[0],
        "stages": [(s["steps"], s["flops"], s["seconds"]) for s in stages],
        "objective": objective,
        "recipe": label,
        "seed": seed,
        "wall": wall,
        "flops": points[-1][0],
        "final_bpc": points[-1][1],
        "curve": points,
        "config": {k: cfg[k] for k in ("train", "progressive") if k in cfg},
    }


def pool(jobs: list[Any], workers: int, results: Path) -> list[dict[str, Any]]:
    """Every job in a fresh forked process, `workers` at a time; each result is recorded in
    `results` as soon as it is in, so an interrupted sweep keeps what it finished."""
    done = []
    with ThreadPoolExecutor(workers) as ex:  # each thread waits on its own forked run
        futures = [ex.submit(bench.in_fork, f"{job[1]} seed {job[2]}", run, job) for job in jobs]
        for future in as_completed(futures):
            done.append(future.result())
            with results.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps(done[-1]) + "\n")
    return done


def reach(points: list[list[float]], target: float, axis: int) -> float | None:
    """The FLOPs (axis 0) or seconds (axis 2) at which the curve first reaches `target` bpc,
    interpolated linearly between the evaluations around it; None if it never does."""
    for before, at in zip([points[0], *points], points, strict=False):
        if at[1] <= target:
            if before is at or before[1] == at[1]:
                return at[axis]
            share = (before[1] - target) / (before[1] - at[1])
            return before[axis] + share * (at[axis] - before[axis])
    return None


def bpc_at(points: list[list[float]], flops: float) -> float | None:
    """The curve's bpc at `flops` training FLOPs, interpolated between the evaluations around
    it; None past its last evaluation."""
    for before, at in itertools.pairwise(points):
        if before[0] <= flops <= at[0]:
            share = (flops - before[0]) / max(at[0] - before[0], 1e-9)
            return before[1] + share * (at[1] - before[1])
    return None


def unigram_bpc() -> float:
    """Bits per character of the training text under its own character frequencies."""
    from collections import Counter

    from stackwise.config import from_dict
    from stackwise.data.documents import Corpus

    cfg = from_dict({"data": {"tokenizer": "char"}})
    counts = Counter("".join(Corpus(cfg.data)))
    total = sum(counts.values())
    return -sum(c / total * math.log2(c / total) for c in counts.values())


def spread(values: list[float], digits: int = 2) -> str:
    """The mean over seeds, with the range (min..max) when there is more than one."""
    if not values:
        return "-"
    mean = statistics.fmean(values)
    if len(values) == 1:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ({min(values):.{digits}f}..{max(values):.{digits}f})"


def report(results: list[dict[str, Any]]) -> str:
    unigram = unigram_bpc()
    lines = [
        bench.machine_line(f"the run's default precision, {THREADS[0]} thread(s) per run"),
        f"unigram entropy of the text: {unigram:.3f} bits per character; a run learned if its "
        f"final bpc is below {LEARNED * unigram:.2f}",
    ]
    headline = []
    for objective in SETTINGS:
        runs = [r for r in results if r["objective"] == objective]
        ref = {r["seed"]: r for r in runs if r["recipe"] == "e2e"}
        if ref:
            table, best = objective_table(objective, runs, ref, unigram)
            lines += table
            if best:
                headline.append(f"{objective}: {best}")
    lines += ["", "headline: " + ("; ".join(headline) or "no recipe with 3 seeds yet")]
    return "\n".join(lines)


LEARNED = 0.75  # a final bpc below this share of the unigram entropy: the run learned


def objective_table(
    objective: str, runs: list[dict[str, Any]], ref: dict[int, dict[str, Any]], unigram: float
) -> tuple[list[str], str | None]:
    """One objective's table (a row per recipe, seeds pooled) and its best recipe at 3 seeds."""
    finals = [r["final_bpc"] for r in ref.values()]
    met = "met" if max(finals) <= TARGETS[objective] else "MISSED"
    lines = [
        "",
        f"{objective}: end-to-end final val bpc {spread(finals)} over seeds {sorted(ref)} "
        f"(goal <= {TARGETS[objective]}: {met})",
        f"{'recipe':<26} {'seeds':>5} {'final bpc':>21} {'learned':>7} {'FLOPs x e2e':>11} "
        f"{'FLOPs to e2e bpc':>18} {'wall to e2e bpc':>18} {'bpc@0.5F x e2e':>21} "
        f"{'GFLOP/s':>7}",
    ]
    best: tuple[float, str] | None = None
    order = list(RECIPES)
    labels = sorted({r["recipe"] for r in runs}, key=lambda x: (order.index(x.split("@")[0]), x))
    for recipe in labels:
        mine = [r for r in runs if r["recipe"] == recipe and r["seed"] in ref]
        if not mine:
            continue
        flops_to, wall_to, half = [], [], []
        for r in mine:
            e2e = ref[r["seed"]]
            at_half = bpc_at(r["curve"], 0.5 * e2e["flops"])
            half += [at_half / e2e["final_bpc"]] if at_half is not None else []
            # only the points within the end-to-end budget count (plateau may pass on more)
            points = [p for p in r["curve"] if p[0] <= 1.01 * e2e["flops"]]
            f, w = reach(points, e2e["final_bpc"], 0), reach(points, e2e["final_bpc"], 2)
            flops_to += [f / e2e["flops"]] if f is not None else []
            wall_to += [w / e2e["curve"][-1][2]] if w is not None else []
        reached = len(flops_to) == len(mine)
        learned = all(r["final_bpc"] < LEARNED * unigram for r in mine)
        rate = statistics.fmean(r["flops"] / r["curve"][-1][2] / 1e9 for r in mine)
        spent = statistics.fmean(r["flops"] / ref[r["seed"]]["flops"] for r in mine)
        to = spread(flops_to) if reached else f"{len(flops_to)}/{len(mine)} reach"
        lines.append(
            f"{recipe:<26} {len(mine):>5} {spread([r['final_bpc'] for r in mine], 3):>21} "
            f"{'yes' if learned else 'NO':>7} {spent:>11.2f} {to:>18} "
            f"{(spread(wall_to) if reached else '-'):>18} {spread(half, 3):>21} {rate:>7.1f}"
        )
        if recipe != "e2e" and reached and learned and len(mine) >= 3:
            mean = statistics.fmean(flops_to)
            best = min(best, (mean, recipe)) if best else (mean, recipe)
    lines += stage_times(runs)
    if best is None:
        return lines, None
    recipe = best[1]
    ratios = [r for r in runs if r["recipe"] == recipe]
    return lines, (
        f"{recipe} reaches end-to-end's final bpc with {best[0]:.2f}x its training FLOPs "
        f"(mean of {len(ratios)} seeds; goal <= 0.6: {'met' if best[0] <= 0.6 else 'MISSED'})"
    )


def stage_times(runs: list[dict[str, Any]]) -> list[str]:
    """Each grown run's stages: FLOPs per step against seconds per step, both as multiples of
    stage 0's, so the counted compute can be checked against the time it took."""
    lines = [
        "",
        "per stage (first seed of each recipe): FLOPs/step | s/step, both x stage 0's; then the "
        "largest jump of val bpc at a growth (the grown rack's first eval minus the trunk's last)",
    ]
    seen = set()
    for r in sorted(runs, key=lambda r: r["seed"]):
        if not r.get("stages") or r["recipe"] in seen:
            continue
        seen.add(r["recipe"])
        base = r["stages"][0]
        cells = [
            f"{(f / n) / (base[1] / base[0]):.2f}|{(t / n) / (base[2] / base[0]):.2f}"
            for n, f, t in r["stages"]
        ]
        c = r["curve"]
        jump = max(b[1] - a[1] for a, b in itertools.pairwise(c) if b[0] == a[0])
        lines.append(f"  {r['recipe']:<26} " + "  ".join(cells) + f"   jump {jump:+.5f}")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = bench.benchmark_parser(__doc__)
    parser.add_argument("--objective", choices=sorted(SETTINGS), default="clm")
    parser.add_argument("--recipes", default="all", help="comma-separated names, or all")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--jobs", type=int, default=1, help="runs side by side")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run")
    parser.add_argument("--results", type=Path, help="every run, one per line (default: temp)")
    parser.add_argument("--report", action="store_true", help="only print the tables")
    parser.add_argument(
        "--budget",
        type=float,
        default=1.0,
        help="each recipe's FLOPs as a share of end-to-end's (its label gets @share); with "
        "e2e named, end-to-end reruns on that share of its steps",
    )
    args = parser.parse_args(argv)
    rec = record.start("growth", args.record)
    THREADS[0] = args.threads
    if args.quick:
        for settings in SETTINGS.values():
            settings["train"].update(max_steps=100, eval_every=10)
    FINGERPRINT[0] = json.dumps(SETTINGS, sort_keys=True)
    name = "growth-quick.jsonl" if args.quick else "growth.jsonl"
    results = args.results or Path(tempfile.gettempdir()) / name
    if not args.report:
        sweep(args, results)
    text = report(load(results))
    print(text)
    verdicts = re.findall(r"goal <= 0\.6: (met|MISSED)", text.split("headline: ")[-1])
    met = all(v == "met" for v in verdicts) if verdicts else None
    rec.finish("the best recipe reaches e2e's final bpc with ≤ 0.6x its FLOPs", met)


def sweep(args: Any, results: Path) -> None:
    """The end-to-end references first (their FLOPs are every recipe's budget), then each
    recipe's probe and runs; a recipe that fails is named and the others go on."""
    names = list(RECIPES) if args.recipes == "all" else args.recipes.split(",")
    unknown = [n for n in names if n not in RECIPES]
    if unknown:
        sys.exit(f"unknown recipes {unknown}; known: {list(RECIPES)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    work = Path(tempfile.mkdtemp(prefix="stackwise-growth-"))
    check_configs(args.objective, names, work)
    ref = {
        r["seed"]: r
        for r in load(results)
        if r["objective"] == args.objective and r["recipe"] == "e2e"
    }
    todo = [s for s in seeds if s not in ref or "e2e" in names]
    share = args.budget
    if share == 1.0:
        e2e = [(args.objective, "e2e", s, work, {}, "e2e") for s in todo]
        for r in pool(e2e, args.jobs, results):
            ref[r["seed"]] = r
    jobs = []
    label = "" if share == 1.0 else f"@{share:g}"
    steps = round(SETTINGS[args.objective]["train"]["max_steps"] * share)
    if share != 1.0 and "e2e" in names:  # the reference itself on the smaller budget
        jobs += [
            (args.objective, "e2e", s, work, {"train": {"max_steps": steps}}, f"e2e{label}")
            for s in seeds
        ]
    for recipe in (n for n in names if n != "e2e"):
        for seed in seeds:
            if RECIPES[recipe]["progressive"]["strategy"] == "end_to_end":
                budget: dict[str, Any] = {"train": {"max_steps": steps}}
            else:
                costs = stage_costs(args.objective, recipe, seed, work)
                cfg = config_for(args.objective, recipe, seed, work)
                budget = budgets(cfg, costs, share * ref[seed]["flops"])
            jobs.append((args.objective, recipe, seed, work, budget, recipe + label))
    pool(jobs, args.jobs, results)


def check_configs(objective: str, names: list[str], work: Path) -> None:
    """Every recipe's config loads, before hours are spent on the ones before it."""
    from stackwise.config import from_dict

    for recipe in names:
        from_dict(config_for(objective, recipe, 0, work / "check"))


def load(path: Path) -> list[dict[str, Any]]:
    """The runs recorded with the current settings, the latest of each recipe and seed."""
    rows = [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []
    latest = {
        (r["objective"], r["recipe"], r["seed"]): r
        for r in rows
        if r.get("settings") == FINGERPRINT[0]
    }
    return list(latest.values())


if __name__ == "__main__":
    main()
