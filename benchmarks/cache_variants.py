"""How many masked variants the activation cache should keep per sample: quality against work.

Run from the repository root:

    .venv/bin/python benchmarks/cache_variants.py            # ~8 minutes on 2 cores
    .venv/bin/python benchmarks/cache_variants.py --quick    # a smoke run, ~1 minute

The cached preset (`tiny-diffusion-progressive-cached`: frozen trunk, activation cache, 4 stacks)
is trained with `progressive.cache.time_step_cache_size` = 1, 2, 4, 8 and with the cache off, on
the same data and steps. Later stacks see a sample only under the masks its cached variants were
made with, so few variants mean few distinct noisy inputs per sample (overfitting), many mean
few cache hits (more trunk forwards). `val bpc` is the final evaluation (same validation
batches for all); `hit %` the cache hits over the later stacks; `wall s` the training call.
Each run is a forked child, one after the other. The last line is the headline.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import _record as record
from _common import in_fork, quick_flag

from stackwise.cli import resolve_config_path
from stackwise.config import from_dict, load_config
from stackwise.pipeline import train_from_config

PRESET = "tiny-diffusion-progressive-cached"
QUICK = ["progressive.steps_per_stack=20", "progressive.stacks.0.steps=20", "data.num_samples=320"]


def run(variants: int | None, extra: list[str], out: str) -> dict[str, float]:
    if variants is None:  # the preset's cache settings need the cache: drop the section
        config = load_config(resolve_config_path(PRESET), [f"train.output_dir={out}", *extra])
        data = config.model_dump(mode="json")
        data["progressive"]["cache"] = {"enabled": False}
        config = from_dict(data)
    else:
        size = f"progressive.cache.time_step_cache_size={variants}"
        config = load_config(resolve_config_path(PRESET), [f"train.output_dir={out}", size, *extra])
    start = time.perf_counter()
    result = train_from_config(config, quiet=True)
    wall = time.perf_counter() - start
    hits = sum(r.cache["hits"] for r in result.progressive.stacks[1:] if r.cache)
    misses = sum(r.cache["misses"] for r in result.progressive.stacks[1:] if r.cache)
    return {
        "bpc": result.progressive.final_eval["bpc"],
        "hit": 100 * hits / max(1, hits + misses),
        "wall": wall,
    }


def main() -> None:
    args = quick_flag(__doc__)
    rec = record.start("cache_variants", args.record)
    extra = QUICK if args.quick else []
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for variants in (1, 2, 4, 8, None):
            label = "off" if variants is None else str(variants)
            rows[label] = in_fork(label, run, variants, extra, f"{tmp}/{label}")
    print(f"{'variants':<9} {'val bpc':>8} {'hit %':>6} {'wall s':>7}")
    print("-" * 33)
    for label, r in rows.items():
        print(f"{label:<9} {r['bpc']:>8.3f} {r['hit']:>6.1f} {r['wall']:>7.1f}")
    cached = {k: v for k, v in rows.items() if k != "off"}
    best = min(cached, key=lambda k: cached[k]["bpc"])
    print(
        f"headline: {best} variants per sample give the best cached bound, "
        f"{cached[best]['bpc']:.3f} bpc vs {cached['1']['bpc']:.3f} with 1 and "
        f"{rows['off']['bpc']:.3f} without the cache"
    )
    rec.finish()


if __name__ == "__main__":
    main()
