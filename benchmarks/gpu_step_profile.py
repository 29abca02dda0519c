"""Where a GPU training step's time goes, ours against nanoGPT's model: torch.profiler (CPU and
CUDA) over eager bf16 steps at gpu_throughput.py's shapes.

    .venv/bin/python benchmarks/gpu_step_profile.py --nanogpt /tmp/nanogpt --shape gpt2-124M

Three runs, each timed then profiled after warm-up steps:
  trainer      the stackwise Trainer on a clm rack (throughput.py's run_ours settings);
  rack loop    the same rack class in a minimal loop (autocast, cross entropy, backward, clip,
               fused AdamW, loss.item() each step), so the Trainer's own cost shows apart;
  nanoGPT loop nanoGPT's GPT class, imported from its checkout's model.py (nothing of it copied
               here), in the same minimal loop, with its own configure_optimizers.
`--compile`: the Trainer with train.compile true and nanoGPT's model through torch.compile (as
its train.py does); the warm-up steps take the compiling. Per run: wall ms per step, GPU ms per
step (the device time of every op; wall minus it is time the GPU waited on the host), and the
ops with the most device time per step.
"""

from __future__ import annotations

import itertools
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import _common as bench
import _record as record
import gpu_throughput as gt
import throughput as tp
import torch
import torch.nn.functional as F
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, schedule

from stackwise.objectives import Specials, build_objective
from stackwise.pipeline import trainer_for

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # CPU: --quick, to try the script


def measure(
    drive: Callable[[int, Callable[[], None]], None], plan: tp.Plan, rows: int
) -> tuple[float, str]:
    """`drive(n, after_step)` runs n steps, calling after_step after each: `plan.warmup` steps,
    `plan.steps` timed ones, then `plan.steps` profiled ones. Returns (wall ms per step, the
    report)."""
    ticks: list[float] = []
    prof = profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
        schedule=schedule(wait=plan.warmup + plan.steps, warmup=0, active=plan.steps),
    )

    def after_step() -> None:
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        ticks.append(time.perf_counter())
        prof.step()

    with prof:
        drive(plan.warmup + 2 * plan.steps, after_step)
    window = ticks[plan.warmup - 1 : plan.warmup + plan.steps]
    wall = 1000 * statistics.median(b - a for a, b in itertools.pairwise(window))
    averages = prof.key_averages()
    # an op's self device time: the kernels it launched itself (each kernel counted once)
    events = [e for e in averages if e.device_type == DeviceType.CPU and e.self_device_time_total]
    gpu_ms = sum(e.self_device_time_total for e in events) / 1000 / plan.steps
    kernels = [e for e in averages if e.device_type == DeviceType.CUDA]  # compiled: fused ones
    lines = [f"  wall {wall:.2f} ms/step, GPU {gpu_ms:.2f} ms/step"]
    for title, found in (("op", events), ("kernel", kernels)):
        lines.append(f"  {title:<60} {'GPU ms/step':>11} {'calls/step':>10}")
        for e in sorted(found, key=lambda e: e.self_device_time_total, reverse=True)[:rows]:
            per = e.self_device_time_total / 1000 / plan.steps
            lines.append(f"  {e.key[:60]:<60} {per:11.3f} {e.count // plan.steps:>10}")
    return wall, "\n".join(lines)


def loop(step: Callable[[], None]) -> Callable[[int, Callable[[], None]], None]:
    def drive(n: int, after_step: Callable[[], None]) -> None:
        for _ in range(n):
            step()
            after_step()

    return drive


def minimal_step(
    model: torch.nn.Module, opt: torch.optim.Optimizer, shape: tp.Shape, forward: Callable
) -> Callable[[], None]:
    x = torch.randint(2, shape.vocab_size, (shape.batch_size, shape.seq_len), device=DEVICE)
    y = torch.roll(x, -1, 1)

    def step() -> None:
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            loss = forward(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tp.MAX_GRAD_NORM)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()

    return step


def rack_loop(shape: tp.Shape, folder: Path) -> Callable[[], None]:
    config = tp.make_config(shape, tp.Plan(1, 1, 2), folder)
    rack = tp.fresh_rack(config, shape.vocab_size).to(DEVICE)
    opt = torch.optim.AdamW(tp.adamw_groups(rack), lr=tp.LR, betas=tp.BETAS, fused=DEVICE == "cuda")

    def forward(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = rack(x)
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1))

    return minimal_step(rack, opt, shape, forward)


def nanogpt_loop(shape: tp.Shape, nanogpt: Path, compile: bool) -> Callable[[], None]:
    sys.path.insert(0, str(nanogpt))
    from model import GPT, GPTConfig  # nanoGPT's own model.py

    layers = shape.n_stacks * shape.blocks_per_stack
    cfg = GPTConfig(
        block_size=shape.seq_len,
        vocab_size=shape.vocab_size,
        n_layer=layers,
        n_head=shape.n_heads,
        n_embd=shape.d_model,
        dropout=0.0,
        bias=False,
    )
    model = GPT(cfg).to(DEVICE)
    opt = model.configure_optimizers(tp.WEIGHT_DECAY, tp.LR, tp.BETAS, DEVICE)
    run = torch.compile(model) if compile else model  # as its train.py compiles
    return minimal_step(model, opt, shape, lambda x, y: run(x, y)[1])


def trainer_drive(
    shape: tp.Shape, folder: Path, compile: bool
) -> Callable[[int, Callable[[], None]], None]:
    """Trainer.train() for n steps, after_step called after each optimizer step."""

    def drive(n: int, after_step: Callable[[], None]) -> None:
        tp.PRECISION = "bf16"
        plan = tp.Plan(1, 0, n)
        config = tp.make_config(shape, plan, folder, compile)
        rack = tp.fresh_rack(config, shape.vocab_size)
        specials = Specials(vocab_size=shape.vocab_size, pad_id=tp.PAD_ID, mask_id=tp.MASK_ID)
        data = tp.TokenRows(tp.random_tokens(shape, plan))
        trainer = trainer_for(config, rack, build_objective(config, specials), data, None)
        real = trainer.optimizer_step

        def step(batches: Iterator[dict[str, torch.Tensor]]) -> torch.Tensor | None:
            loss = real(batches)
            after_step()
            return loss

        trainer.optimizer_step = step  # type: ignore[method-assign]
        trainer.train()

    return drive


def main() -> None:
    p = bench.benchmark_parser(__doc__)
    p.add_argument("--nanogpt", type=Path, help="a karpathy/nanoGPT checkout (for --runs nanogpt)")
    p.add_argument("--shape", default="gpt2-124M", choices=[s.name for s in gt.SHAPES])
    p.add_argument("--rows", type=int, default=18)
    p.add_argument("--runs", default="trainer,rack,nanogpt")
    p.add_argument(
        "--compile",
        action="store_true",
        help="the trainer and nanoGPT compiled (the rack loop stays eager)",
    )
    args = p.parse_args()
    runs = args.runs.split(",")
    if not set(runs) <= {"trainer", "rack", "nanogpt"}:
        p.error(f"--runs {args.runs}: choose from trainer, rack, nanogpt")
    if "nanogpt" in runs and not (args.nanogpt and (args.nanogpt / "model.py").is_file()):
        p.error(
            f"--runs nanogpt needs --nanogpt DIR, a karpathy/nanoGPT checkout (got {args.nanogpt})"
        )
    if args.rows < 1:
        p.error("--rows must be at least 1")
    rec = record.start("gpu_step_profile", args.record)
    if DEVICE != "cuda" and not args.quick:
        p.error("no CUDA GPU here: this profile is of GPU steps (--quick tries it on the CPU)")
    shape = next(s for s in gt.SHAPES if s.name == args.shape)
    if DEVICE != "cuda":
        shape = gt.QUICK_SHAPE
    plan = tp.Plan(1, 3 if args.quick else 10, 3 if args.quick else 10)
    gpu = torch.cuda.get_device_name() if DEVICE == "cuda" else "no GPU"
    print(f"{bench.machine_line('bf16 autocast')}; {gpu}; {shape}")
    with tempfile.TemporaryDirectory() as tmp:
        drives = {
            "trainer": lambda: trainer_drive(shape, Path(tmp) / "trainer", args.compile),
            "rack": lambda: loop(rack_loop(shape, Path(tmp) / "rack")),
            "nanogpt": lambda: loop(nanogpt_loop(shape, args.nanogpt.resolve(), args.compile)),
        }
        walls = {}
        for name in runs:
            print(f"{name}:", flush=True)
            walls[name], report = measure(drives[name](), plan, args.rows)
            print(report, flush=True)
            torch.cuda.empty_cache()
    mode = "compiled" if args.compile else "eager"
    each = ", ".join(f"{name} {ms:.1f}" for name, ms in walls.items())
    print(f"headline: {shape.name} {mode} wall ms/step (median): {each}")
    rec.finish()


if __name__ == "__main__":
    main()
