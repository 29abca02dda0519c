"""Where masked diffusion's gap to clm comes from: one setting changed at a time, equal tokens.

Run from the repository root:

    .venv/bin/python benchmarks/diffusion_study.py --seeds 0,1,2     # ~25 minutes on 2 cores
    .venv/bin/python benchmarks/diffusion_study.py --quick          # a smoke run

Each run is the default preset's rack (4 stacks x 1 block, d_model 128, characters, 64
sequences of 64 per step) trained end to end for `--steps` steps, as diffusion_quality's
"diff no-time" row (cosine mask schedule, antithetic noise levels, no time input):

  clm               the causal rack (the reference)
  base              masked diffusion as above
  no antithetic     independent noise levels per sequence
  linear            the linear mask schedule (alpha = 1 - t)
  uniform weight    objective.weighting: uniform (every masked token weighs 1 in training;
                    the eval's NELBO keeps its weights)
  loglinear         MDLM's log-linear schedule
  batch 32          32 sequences per step, twice the steps (the same tokens)
  batch 128         128 sequences per step, half the steps
  block B           block diffusion, blocks of B characters (4, 8, 16), token j predicted at
                    position j - 1 (objective.block_shift: true)
  block B own       the same, each masked position predicting its own token (BD3-LM)
  block 4 uniform   block 4 with objective.weighting: uniform

`--runs` picks some of them (clm is always run: the reference).

`val bpc` is each run's final evaluation (the NELBO bound for diffusion, the exact NLL for clm)
on the same validation batches. Per seed: a table; then the median over seeds of each run's
bpc, its change against base, and its ratio to clm's with the spread (max - min) of that
ratio. The last line names the best diffusion run and its ratio to clm.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import _record as record
from _common import CLM_RESETS, in_fork
from diffusion_quality import train


def variants(steps: int, seed: int, extra: list[str]) -> dict[str, list[str]]:
    run = [f"train.max_steps={steps}", f"train.seed={seed}", *extra]
    blocks = {}
    for size in (4, 8, 16):
        for own in (False, True):
            blocks[f"block {size}{' own' if own else ''}"] = [
                "objective.name=block_diffusion",
                f"objective.block_size={size}",
                f"objective.block_shift={str(not own).lower()}",
                "sample.sampler=auto",
                "sample.block_length=0",
                *run,
            ]
    blocks["block 4 uniform"] = [*blocks["block 4"], "objective.weighting=uniform"]
    return {
        "clm": ["objective.name=clm", *CLM_RESETS, *run],
        "base": run,
        "no antithetic": ["masking.antithetic=false", *run],
        "linear": ["masking.schedule=linear", *run],
        "uniform weight": ["objective.weighting=uniform", *run],
        "loglinear": ["masking.schedule=loglinear", *run],
        "batch 32": [
            "train.batch_size=32",
            f"train.max_steps={2 * steps}",
            f"train.seed={seed}",
            *extra,
        ],
        "batch 128": [
            "train.batch_size=128",
            f"train.max_steps={steps // 2}",
            f"train.seed={seed}",
            *extra,
        ],
        **blocks,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=800, help="optimizer steps at batch 64")
    parser.add_argument("--seeds", default="0", help="comma-separated train.seed values")
    parser.add_argument("--set", nargs="*", default=[], help="extra overrides for every run")
    parser.add_argument("--runs", default=None, help="comma-separated run names (and clm)")
    parser.add_argument("--quick", action="store_true", help="--steps 40, one seed")
    record.add_flag(parser)
    args = parser.parse_args()
    rec = record.start("diffusion_study", args.record)
    steps = 40 if args.quick else args.steps
    seeds = [0] if args.quick else [int(x) for x in args.seeds.split(",")]
    runs = None if args.runs is None else {"clm", *args.runs.split(",")}
    bpc: dict[str, list[float]] = {}
    for seed in seeds:
        print(f"== seed {seed}")
        with tempfile.TemporaryDirectory() as tmp:
            for name, overrides in variants(steps, seed, args.set).items():
                if runs is not None and name not in runs:
                    continue
                out = f"{tmp}/{name.replace(' ', '_')}"
                got = in_fork(name, train, name, overrides, out)
                bpc.setdefault(name, []).append(got["bpc"])
                print(f"{name:<14} val bpc {got['bpc']:.3f}  wall {got['wall']:.0f} s", flush=True)
    print(f"\n== over seeds {seeds}: medians")
    print(f"{'run':<14} {'val bpc':>8} {'vs base':>8} {'vs clm':>7} {'spread':>7}")
    print("-" * 48)
    base = statistics.median(bpc.get("base", bpc["clm"]))
    ratios = {n: [b / c for b, c in zip(v, bpc["clm"], strict=True)] for n, v in bpc.items()}
    for name, values in bpc.items():
        mid, r = statistics.median(values), ratios[name]
        print(
            f"{name:<14} {mid:>8.3f} {mid - base:>+8.3f} {statistics.median(r):>6.3f}x "
            f"{max(r) - min(r):>7.3f}"
        )
    best = min((n for n in bpc if n != "clm"), key=lambda n: statistics.median(ratios[n]))
    print(
        f"headline: best diffusion run '{best}' at {statistics.median(ratios[best]):.3f}x "
        f"clm's bpc"
        + (f" (base {statistics.median(ratios['base']):.3f}x)" if "base" in bpc else "")
    )
    rec.finish()


if __name__ == "__main__":
    main()
