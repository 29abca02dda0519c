"""Mixture of experts and routed memory against a dense rack at an equal token budget, on the
default corpus.

Run from the repository root:

    .venv/bin/python benchmarks/moe_memory.py            # 300 steps a run, several minutes
    .venv/bin/python benchmarks/moe_memory.py --quick    # 30 steps, a smoke run

Four racks of the tiny-clm preset's shape (d_model 128, 2x2 blocks, seq 128, batch 16, BPE
2,048), each trained for the same steps (so the same tokens) with the same seed, data and
schedule, each in a fresh forked child:

  dense    tiny-clm: one SwiGLU of width 344 per block;
  moe      configs/tiny-moe.yaml: 8 experts of width 172, top-2, capacity 1.25, so a token
           runs through as many FFN weights as in dense (equal active parameters);
  moe-lb0  the same with model.moe.load_balance_coef 0 (no balancing pressure);
  memory   configs/tiny-memory.yaml: dense plus a memory layer after block 1 (8 chapters
           of 16 slots, top-2, its gate starting closed).

Reported: the final validation loss and bits per character, training tokens/s (the median of
the logged windows, every 20 steps; evaluation falls outside them), the child's peak RSS, and
the load coefficient of variation (std/mean of the share of routed choices per expert or
chapter, averaged over layers) at the last logged training step. The headline compares each
with dense: val loss, and step time as the ratio of tokens/s.
"""

from __future__ import annotations

import json
import resource
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import _common as bench
import _record as record
import torch

from stackwise.cli.common import resolve_config_path
from stackwise.config import derive, load_config

VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "dense": ("tiny-clm", {}),
    "moe": ("tiny-moe", {}),
    "moe-lb0": ("tiny-moe", {"model.moe.load_balance_coef": 0.0}),
    "memory": ("tiny-memory", {}),
}


def run(name: str, steps: int, workdir: Path) -> dict[str, float]:
    """One variant in this (forked) process."""
    from stackwise.pipeline import train_from_config

    torch.set_num_threads(1)
    preset, changes = VARIANTS[name]
    config = load_config(resolve_config_path(preset))
    train = {f"train.{k}": v for k, v in bench.fresh_output(workdir / name).items()}
    logging = {f"logging.{k}": v for k, v in bench.quiet_logging(jsonl=True).items()}
    changes = {**changes, **train, **logging, "train.max_steps": steps}
    changes |= {"train.eval_every": steps, "sample.num_samples": 0, "train.seed": 0}
    config = derive(config, changes, "benchmark")
    result = train_from_config(config, quiet=True)
    final = result.state.history[-1]
    rows = [json.loads(line) for line in (workdir / name / "metrics.jsonl").open()]
    logged = [r for r in rows if "train/tokens_per_s" in r]  # each log window's training rate
    last = logged[-1]  # the last logged training step
    cv = last.get("train/expert_load_cv", last.get("train/chapter_load_cv", float("nan")))
    return {
        "val_loss": final["loss"],
        "bpc": final.get("bpc", float("nan")),
        "tokens_per_s": statistics.median(r["train/tokens_per_s"] for r in logged),
        "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "load_cv": cv,
        "params": sum(p.numel() for p in result.rack.parameters()),
    }


def main() -> None:
    parser = bench.benchmark_parser(__doc__, "30 steps a run")
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default 300)")
    args = parser.parse_args()
    rec = record.start("moe_memory", args.record)
    steps = args.steps or (30 if args.quick else 300)
    bench.pin_threads()  # the forked runs inherit it
    print(f"{bench.machine_line('mixed_precision auto')}; {steps} steps x 16 x 128 tokens a run")
    results = {}
    with tempfile.TemporaryDirectory(prefix="sw-moe-") as tmp:
        for name in VARIANTS:
            results[name] = bench.in_fork(name, run, name, steps, Path(tmp))
            print(f"  {name}: {results[name]}", file=sys.stderr, flush=True)
    print(
        f"{'variant':<8} {'params':>10} {'val loss':>8} {'bpc':>6} {'tok/s':>7} "
        f"{'peak RSS MB':>11} {'load CV':>7}"
    )
    for name, r in results.items():
        print(
            f"{name:<8} {r['params']:>10,} {r['val_loss']:>8.3f} {r['bpc']:>6.3f} "
            f"{r['tokens_per_s']:>7,.0f} {r['rss_mb']:>11,.0f} {r['load_cv']:>7.3f}"
        )
    dense, moe, lb0, mem = (results[n] for n in ("dense", "moe", "moe-lb0", "memory"))
    ratio = lb0["load_cv"] / moe["load_cv"] if moe["load_cv"] else float("inf")
    print(
        f"headline: val loss moe {moe['val_loss']:.3f}, memory {mem['val_loss']:.3f} vs dense "
        f"{dense['val_loss']:.3f}; load CV without/with balancing {ratio:.2f}x; step time "
        f"moe/dense {dense['tokens_per_s'] / moe['tokens_per_s']:.2f}x, memory/dense "
        f"{dense['tokens_per_s'] / mem['tokens_per_s']:.2f}x"
    )
    met = (
        moe["val_loss"] < dense["val_loss"] and ratio >= 2.0 and mem["val_loss"] < dense["val_loss"]
    )
    rec.finish(GOAL, met and dense["tokens_per_s"] <= 1.3 * mem["tokens_per_s"])


GOAL = (
    "MoE below dense's val loss; balancing cuts the load CV ≥ 2x; memory below dense at ≤ 1.3x "
    "its step time"
)


if __name__ == "__main__":
    main()
