"""The training loss's forward and backward on GPT-2-sized logits (12 x 1024 rows, vocab 50304,
bf16, as the rack returns them under autocast), by way of each path a trainer can take to it.

    .venv/bin/python benchmarks/gpu_loss_paths.py            # on a CUDA GPU
    .venv/bin/python benchmarks/gpu_loss_paths.py --quick    # small logits on the CPU, to try it
    .venv/bin/python benchmarks/gpu_loss_paths.py --cpu      # why a CPU run keeps the loss eager

Paths (each weighted by per-position weights, as stackwise's objectives are, except nanoGPT's):
  fp32 copy, then CE   the logits cast to fp32 first (what Accelerate's output cast did before
                       stackwise's loss), then cross entropy: stackwise before 2026-11-26;
  stackwise eager      objectives.base.weighted_ce_sum on the bf16 logits (it upcasts inside):
                       stackwise with train.compile off;
  stackwise compiled   objectives.base.compiled_ce_sum: the same, torch.compile'd into fused
                       kernels: stackwise with train.compile on a GPU;
  blocked rows         objectives.blocked_ce.blocked_ce_sum: a block of rows at a time, never a
                       full-size fp32 tensor (stackwise takes it on the CPU from 64 MB of fp32
                       logits; timed here to decide whether a GPU should too);
  autocast CE          F.cross_entropy(logits) under CUDA autocast, as nanoGPT's eager loop
                       computes it. Autocast runs this log-softmax on the bf16 input with bf16
                       output, so its loss differs from the fp32 one (the |diff| column).
Timing: CUDA events around forward + backward, median (min..max) of --reps after 3 warm-up
calls (the compiled path compiles there). `loss/token` and `|diff|`: the mean loss, and its
distance from the fp32 path's.

--cpu: stackwise eager against stackwise compiled on the CPU, one thread, at throughput.py's
shapes (12 x 64 rows, vocab 65 and 4096, fp32 and bf16 logits), timed by the wall clock:
train.compile leaves the loss eager on a CPU (train.builders.loss_compiles) because of it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import _common as bench
import _record as record
import torch
import torch.nn.functional as F

import stackwise.objectives.blocked_ce as blocked_ce
from stackwise.objectives.base import compiled_ce_sum, weighted_ce_sum

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
Loss = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def fp32_copy_first(logits: torch.Tensor, targets: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return weighted_ce_sum(logits.float(), targets, w)


def autocast_ce(logits: torch.Tensor, targets: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        flat = logits.view(-1, logits.shape[-1])
        return F.cross_entropy(flat, targets.view(-1), reduction="sum")


def timed(loss: Loss, logits: torch.Tensor, targets: torch.Tensor, w: torch.Tensor, reps: int):
    """(ms per forward + backward, each rep; the loss value)."""
    times = []
    for i in range(reps + 3):
        x = logits.detach().requires_grad_(True)
        if logits.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            value = loss(x, targets, w)
            value.backward()
            end.record()
            torch.cuda.synchronize()
            ms = start.elapsed_time(end)
        else:
            t0 = time.perf_counter()
            value = loss(x, targets, w)
            value.backward()
            ms = 1000 * (time.perf_counter() - t0)
        if i >= 3:
            times.append(ms)
    return times, float(value.detach())


def cpu_paths(reps: int) -> None:
    """Eager against compiled on the CPU at the tiny training shapes, one thread."""
    torch.set_num_threads(1)
    print(f"{bench.machine_line('fp32 and bf16 logits')}; eager against compiled")
    head = f"{'vocab':>6} {'logits':>8} {'eager ms':>9} {'compiled ms':>12} {'compiled speed':>15}"
    print(head)
    print("-" * len(head))
    speeds, rows = [], 12 * 64
    for vocab in (65, 4096):
        for dtype in (torch.float32, torch.bfloat16):
            # a fresh compile per case, as a training run (one shape) gets: a shared one would
            # recompile for the second shape with dynamic sizes
            torch._dynamo.reset()
            compiled_ce_sum.cache_clear()
            compiled = compiled_ce_sum()
            gen = torch.Generator().manual_seed(0)
            logits = torch.randn(rows, vocab, generator=gen).to(dtype)
            targets = torch.randint(0, vocab, (rows,), generator=gen)
            ones = torch.ones(rows)
            eager = statistics.median(timed(weighted_ce_sum, logits, targets, ones, reps)[0])
            fused = statistics.median(timed(compiled, logits, targets, ones, reps)[0])
            speeds.append(eager / fused)
            name = str(dtype).removeprefix("torch.")
            print(f"{vocab:>6} {name:>8} {eager:>9.3f} {fused:>12.3f} {eager / fused:>14.2f}x")
    print(
        f"headline: compiled/eager loss speed on this CPU, median of the four: "
        f"{statistics.median(speeds):.2f}x"
    )


def main() -> None:
    p = bench.benchmark_parser(__doc__, "small logits (2 x 64 x 512) on the CPU")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--cpu", action="store_true", help="eager against compiled on the CPU")
    p.add_argument(
        "--block-mb",
        type=float,
        default=None,
        help="fp32 MB per block of the blocked path (default: its CPU setting, 2 MiB; a GPU "
        "likely wants far larger blocks)",
    )
    args = p.parse_args()
    if args.block_mb is not None:
        if args.block_mb <= 0:
            p.error("--block-mb must be above 0")
        blocked_ce.BLOCK_FP32_BYTES = int(args.block_mb * 2**20)
    if args.reps < 1:
        p.error("--reps must be at least 1")
    if args.cpu:
        if args.quick:
            p.error("--cpu already runs the small training shapes; give it without --quick")
        if args.record:  # the section holds the GPU run; a CPU run is added to it by hand
            p.error("--record is for the GPU run; --cpu prints its table only")
        cpu_paths(args.reps)
        return
    if DEVICE != "cuda" and not args.quick:
        p.error("no CUDA GPU here: this measures GPU kernels (--quick tries it on the CPU)")
    rec = record.start("gpu_loss_paths", args.record)
    rows, vocab = (2 * 64, 512) if args.quick else (12 * 1024, 50304)
    gen = torch.Generator(DEVICE).manual_seed(0)
    logits = torch.randn(rows, vocab, device=DEVICE, generator=gen).to(torch.bfloat16)
    targets = torch.randint(0, vocab, (rows,), device=DEVICE, generator=gen)
    ones = torch.ones(rows, device=DEVICE)
    gpu = torch.cuda.get_device_name() if DEVICE == "cuda" else "no GPU"
    print(f"{bench.machine_line('bf16 logits')}; {gpu}; logits {rows} x {vocab}")
    paths: dict[str, Loss] = {
        "fp32 copy, then CE": fp32_copy_first,
        "stackwise eager": weighted_ce_sum,
        "stackwise compiled": compiled_ce_sum(),
        "blocked rows": blocked_ce.blocked_ce_sum,
        "autocast CE": autocast_ce,
    }
    head = f"{'path':<20} {'ms fwd+bwd':>10} {'min..max':>15} {'loss/token':>11} {'|diff|':>9}"
    print(head)
    print("-" * len(head))
    medians, reference = {}, None
    for name, loss in paths.items():
        times, total = timed(loss, logits, targets, ones, args.reps)
        value = total / rows
        reference = value if reference is None else reference
        medians[name] = statistics.median(times)
        span = f"{min(times):.3f}..{max(times):.3f}"
        print(
            f"{name:<20} {medians[name]:>10.3f} {span:>15} {value:>11.6f} "
            f"{abs(value - reference):>9.2e}"
        )
    ratio = medians["fp32 copy, then CE"] / medians["stackwise compiled"]
    print(f"headline: loss time, fp32-copy path / stackwise compiled: {ratio:.2f}x")
    rec.finish()


if __name__ == "__main__":
    main()
