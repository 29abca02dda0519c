"""Cross entropy in row blocks (stackwise.objectives.blocked_ce) against the library's
F.cross_entropy, on the CPU: the training loss's forward and backward over (rows, vocab) logits.

    .venv/bin/python benchmarks/blocked_ce.py            # the table below, 7 reps
    .venv/bin/python benchmarks/blocked_ce.py --quick    # two small sizes, 2 reps
    .venv/bin/python benchmarks/blocked_ce.py --threads 2  # as a Trainer on 2 cores runs it

Time: one torch thread (--threads N for more), the two paths alternating within each rep (the
first changing from rep to rep), median (min..max) ms of a forward + backward. Memory: each path
once in a fresh process at the largest size, its peak RSS rise over the logits it was given
(VmHWM). glibc's allocator as the Trainer sets it (stackwise.train.hardware.keep_freed_memory).
Both paths are weighted as stackwise's objectives weigh positions; the loss and gradient columns
compare them. The blocked path is taken from MIN_FP32_BYTES (64 MB of fp32) up.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

import _common as bench
import _record as record
import torch
import torch.nn.functional as F

import stackwise.objectives.blocked_ce as blocked
from stackwise.objectives.base import IGNORE
from stackwise.train.hardware import keep_freed_memory

SIZES = [(768, 4096), (2048, 8192), (1024, 32768), (4096, 32768), (512, 131072)]
QUICK = [(768, 4096), (1024, 32768)]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def library(logits: torch.Tensor, targets: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    ce = F.cross_entropy(logits.float(), targets, ignore_index=IGNORE, reduction="none")
    return (ce * w).sum()


PATHS = {"library": library, "blocked": blocked.blocked_ce_sum}


def problem(rows: int, vocab: int, dtype: torch.dtype) -> tuple:
    gen = torch.Generator().manual_seed(0)
    logits = torch.empty(rows, vocab, dtype=dtype).normal_(0, 2, generator=gen)
    targets = torch.randint(0, vocab, (rows,), generator=gen)
    return logits, targets, torch.ones(rows)


def once(name: str, logits: torch.Tensor, targets: torch.Tensor, w: torch.Tensor) -> tuple:
    """(ms, loss, gradient) of one forward + backward."""
    x = logits.detach().requires_grad_(True)
    t0 = time.perf_counter()
    loss = PATHS[name](x, targets, w)
    loss.backward()
    return 1000 * (time.perf_counter() - t0), float(loss), x.grad


def timing_rows(sizes: list[tuple[int, int]], reps: int) -> list[float]:
    print(f"{'rows':>5} {'vocab':>7} {'dtype':>5} {'fp32 MB':>8} {'library ms':>18} "
          f"{'blocked ms':>18} {'speed':>6} {'loss rel':>8} {'grad max':>8}")  # fmt: skip
    speeds = []
    for rows, vocab in sizes:
        for label, dtype in DTYPES.items():
            args = problem(rows, vocab, dtype)
            times: dict[str, list[float]] = {name: [] for name in PATHS}
            for rep in range(reps + 1):  # the first round warms up
                order = list(PATHS) if rep % 2 else list(PATHS)[::-1]
                for name in order:
                    ms, _, _ = once(name, *args)
                    if rep:
                        times[name].append(ms)
            _, lib_loss, lib_grad = once("library", *args)
            _, our_loss, our_grad = once("blocked", *args)
            rel = abs(our_loss - lib_loss) / abs(lib_loss)
            grad = (our_grad.float() - lib_grad.float()).abs().max().item()
            lib, ours = (statistics.median(times[n]) for n in PATHS)
            speeds.append(lib / ours)
            cells = [
                f"{n:>8.2f} ({min(times[k]):.1f}..{max(times[k]):.1f})"
                for n, k in ((lib, "library"), (ours, "blocked"))
            ]
            size = rows * vocab * 4 / 2**20
            print(f"{rows:>5} {vocab:>7} {label:>5} {size:>8.0f} {cells[0]:>18} {cells[1]:>18} "
                  f"{lib / ours:>5.2f}x {rel:>8.0e} {grad:>8.0e}")  # fmt: skip
    return speeds


def peak_rise(name: str, rows: int, vocab: int, dtype: str, threads: int) -> float:
    """MB the peak RSS rises over the logits during one forward + backward, in a fresh process."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import blocked_ce as b, _common as c;"
        "b.keep_freed_memory(); b.torch.set_num_threads(int(sys.argv[6]));"
        "args = b.problem(int(sys.argv[3]), int(sys.argv[4]), b.DTYPES[sys.argv[5]]);"
        "before = c.status_mb('VmHWM'); b.once(sys.argv[2], *args);"
        "print(c.status_mb('VmHWM') - before)"
    )  # fmt: skip
    here = str(bench.Path(__file__).resolve().parent)
    cmd = [sys.executable, "-c", code, here, name, str(rows), str(vocab), dtype, str(threads)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = bench.benchmark_parser(__doc__, "two small sizes, 2 reps")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--threads", type=int, default=1, help="torch threads (a Trainer uses all)")
    args = p.parse_args()
    if args.reps < 1 or args.threads < 1:
        p.error("--reps and --threads must be at least 1")
    bench.pin_threads()
    torch.set_num_threads(args.threads)
    keep_freed_memory()  # as the Trainer runs: freed blocks reused, not faulted in anew
    rec = record.start("blocked_ce", args.record)
    sizes, reps = (QUICK, 2) if args.quick else (SIZES, args.reps)
    print(f"{bench.machine_line('fp32 and bf16 logits')}; {reps} reps, paths alternating")
    speeds = timing_rows(sizes, reps)
    rows, vocab = max(sizes, key=lambda s: s[0] * s[1])
    print(f"\npeak RSS rise during one forward + backward, {rows} x {vocab}, fresh processes:")
    rises = {}
    for label in DTYPES:
        rises[label] = {name: peak_rise(name, rows, vocab, label, args.threads) for name in PATHS}
        lib, ours = rises[label]["library"], rises[label]["blocked"]
        print(f"  {label}: library {lib:7.0f} MB, blocked {ours:7.0f} MB ({ours / lib:.2f}x)")
    largest = sizes.index((rows, vocab))
    big = speeds[2 * largest : 2 * largest + 2]  # its fp32 and bf16 rows
    rise = {label: r["blocked"] / r["library"] for label, r in rises.items()}
    print(
        f"headline: at {rows} x {vocab} blocked/library speed {big[0]:.2f}x fp32, "
        f"{big[1]:.2f}x bf16; peak RSS rise {rise['fp32']:.2f}x fp32, {rise['bf16']:.2f}x bf16"
    )
    rec.finish()


if __name__ == "__main__":
    main()
