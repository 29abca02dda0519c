"""The default preset (`stackwise train` with no arguments) against its clm twin.

Run from the repository root:

    .venv/bin/python benchmarks/default_preset.py            # both runs, ~10 minutes on 2 cores
    .venv/bin/python benchmarks/default_preset.py --quick    # a smoke run, ~1 minute

Both runs use the default preset unchanged but for `objective.name` (and, for clm, the
sampling and masking settings that only masked racks take): the same rack shape, data,
character tokenizer, steps, batch and learning rates, so the same training tokens. Each runs in
a forked child, one after the other, with every core; `wall s` is the child's whole
`train_from_config` call (stages, evaluations and saving; not data preparation). `val bpc`
is the final evaluation of the run (the same validation batches for both): the NELBO bound per
character for diffusion, the exact NLL per character for clm. The last line is the headline:
diffusion's bpc over clm's.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import _record as record
from _common import CLM_RESETS, in_fork, quick_flag

from stackwise.cli import resolve_config_path
from stackwise.config import load_config
from stackwise.pipeline import train_from_config

QUICK = ["progressive.steps_per_stack=20", "progressive.stacks.0.steps=20"]


def one_run(objective: str, extra: list[str], out: str) -> dict[str, float]:
    overrides = [f"objective.name={objective}", f"train.output_dir={out}", *extra]
    if objective == "clm":
        overrides += CLM_RESETS
    config = load_config(resolve_config_path(None), overrides)
    start = time.perf_counter()
    result = train_from_config(config, quiet=True)
    wall = time.perf_counter() - start
    final = result.progressive.final_eval if result.progressive else result.state.history[-1]
    tokens = sum(r.tokens for r in result.progressive.stacks) if result.progressive else 0
    return {"bpc": final["bpc"], "wall": wall, "tokens": tokens}


def main() -> None:
    args = quick_flag(__doc__)
    rec = record.start("default_preset", args.record)
    extra = QUICK if args.quick else []
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for objective in ("diffusion", "clm"):
            rows[objective] = in_fork(objective, one_run, objective, extra, f"{tmp}/{objective}")
    print(f"{'objective':<10} {'val bpc':>8} {'wall s':>8} {'tokens':>11}")
    print("-" * 40)
    for name, r in rows.items():
        print(f"{name:<10} {r['bpc']:>8.3f} {r['wall']:>8.1f} {int(r['tokens']):>11,}")
    ratio = rows["diffusion"]["bpc"] / rows["clm"]["bpc"]
    print(
        f"headline: default preset diffusion {rows['diffusion']['bpc']:.3f} bpc, "
        f"{ratio:.2f}x clm's {rows['clm']['bpc']:.3f} at the same tokens"
    )
    rec.finish(
        "diffusion ≤ 3.0 bpc and ≤ 1.3x clm's", rows["diffusion"]["bpc"] <= 3.0 and ratio <= 1.3
    )


if __name__ == "__main__":
    main()
