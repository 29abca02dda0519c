"""Ancestral sampling with and without reusing the logits of rows that a step left unchanged.

Run from the repository root on a trained masked run (for example the default `make train`):

    .venv/bin/python benchmarks/ancestral_cache.py --checkpoint outputs/<run>
        [--steps 256] [--samples 8] [--repeats 5]

Both variants draw from the same generator seed, so their samples must be identical (checked);
they differ only in how many rows run through the rack. They alternate, `--repeats` times each,
with torch pinned to 2 threads; the table gives the median seconds. The last line is the
headline: how much faster reuse is.
"""

from __future__ import annotations

import argparse
import statistics
import time

import _record as record
import torch

from stackwise.data.pack import specials_of
from stackwise.objectives import objective_from
from stackwise.runs import load_trained
from stackwise.samplers import MaskedSampler, MaskedSampling


def sample_once(loaded, settings: MaskedSampling, n: int, reuse: bool):
    plan, rack, tok = loaded
    specials = specials_of(tok)
    banned = [i for i in (specials.mask_id, specials.pad_id, specials.bos_id) if i is not None]
    gen = torch.Generator().manual_seed(0)
    schedule = objective_from(plan.objective, plan.masking, specials).schedule
    sampler = MaskedSampler(
        rack, settings, specials.mask_id, banned, gen, schedule, None, reuse_logits=reuse
    )
    prompt = torch.empty((n, 0), dtype=torch.long)
    start = time.perf_counter()
    with torch.no_grad():
        out = sampler.run(prompt, plan.sample.max_new_tokens)
    return time.perf_counter() - start, out, sampler.stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--steps", type=int, default=256)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    record.add_flag(parser)
    args = parser.parse_args()
    rec = record.start("ancestral_cache", args.record)
    torch.set_num_threads(2)
    loaded = load_trained(args.checkpoint)
    settings = MaskedSampling(sampler="ancestral", steps=args.steps, temperature=1.0)
    times: dict[bool, list[float]] = {True: [], False: []}
    outs, stats = {}, {}
    sample_once(loaded, settings, args.samples, True)  # warm-up
    for _ in range(args.repeats):
        for reuse in (True, False):
            seconds, outs[reuse], stats[reuse] = sample_once(loaded, settings, args.samples, reuse)
            times[reuse].append(seconds)
    if not torch.equal(outs[True], outs[False]):
        raise SystemExit("reuse changed the samples: the cache is wrong")
    length = loaded[0].sample.max_new_tokens
    print(f"{args.samples} samples x {length} tokens, ancestral, {args.steps} steps")
    print(f"{'variant':<10} {'calls':>6} {'row passes':>11} {'median s':>9}")
    print("-" * 40)
    for reuse in (False, True):
        st = stats[reuse]
        name = "reuse" if reuse else "recompute"
        med = statistics.median(times[reuse])
        print(f"{name:<10} {st.forward_passes:>6} {st.row_passes:>11} {med:>9.3f}")
    ratio = statistics.median(times[False]) / statistics.median(times[True])
    print(f"headline: reusing unchanged rows' logits is {ratio:.2f}x faster at {args.steps} steps")
    rec.finish("≥ 2x faster at 256 steps", ratio >= 2.0 if args.steps == 256 else None)


if __name__ == "__main__":
    main()
