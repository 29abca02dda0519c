"""Tokens/s and MFU on one CUDA GPU: the stackwise Trainer against nanoGPT's own train.py, bf16,
each eager and compiled.

    git clone https://github.com/karpathy/nanoGPT /tmp/nanogpt
    .venv/bin/python benchmarks/gpu_throughput.py --nanogpt /tmp/nanogpt

Shapes: nanoGPT's two GPU configurations, its GPT-2 124M (12 layers, d 768, 12 heads, seq 1024,
batch 12, vocab 50304, as its bench.py) and its shakespeare_char model (6 layers, d 384, 6 heads,
seq 256, batch 64, vocab 65), on random tokens (speed does not depend on their values; the CPU
side-by-side in nanogpt_reference.py and throughput.py checks what each learns).

Runs, each in a fresh process, interleaved per repetition (nanoGPT eager, ours eager, nanoGPT
compiled, ours compiled, ...):
  nanogpt   nanoGPT's train.py from its own checkout, run as benchmarks/nanogpt_reference.py runs
            it (data written in its format, its command-line overrides), `--device=cuda
            --dtype=bfloat16 --compile=False|True` (compile: `torch.compile` of the whole model);
  ours      throughput.py's run_ours: the stackwise Trainer on a clm rack of the same depth, width
            and heads, mixed_precision bf16, train.compile false|true (regional: each block).
Both time the iterations after `--warmup` (compiling and nanoGPT's one evaluation happen before):
our clock synchronises the device at the end of every step; nanoGPT reads its clock just before
its loss.item(), so its span ends up to one step's queued work early (within 1/--steps).

MFU, one formula for both: tokens/s x (6 x the weights of every matmul, the head included, +
12 x layers x d_model x seq, the attention scores and their weighted sum counted whole as
nanoGPT counts them) / the GPU's dense bf16 peak (989 TFLOP/s for an H100/H200 SXM). nanoGPT's
own MFU print (a moving average, against an A100's 312 TFLOP/s) is rescaled to the same peak
as a check of the formula. Attention: both call SDPA with a causal flag (on an H200 with torch
2.11 both ran its cuDNN backend: gpu_step_profile.py); each of our runs also checks, outside the
timed window, that one eager forward and backward of its rack runs under the flash backend alone
("flash-capable").
The table gives medians and ranges; the last line the ours/nanoGPT ratios of tokens/s and MFU.
`--budget-s` skips the runs that would start after that many seconds, keeping what finished; a
failed run skips all the rest.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import _common as bench
import _record as record
import nanogpt_reference as ref
import numpy as np
import throughput as tp
import torch
from torch import nn

SHAPES = (
    tp.Shape("gpt2-124M", 50304, 3, 4, n_heads=12, d_model=768, seq_len=1024, batch_size=12),
    tp.Shape("char-6x384", 65, 2, 3, n_heads=6, d_model=384, seq_len=256, batch_size=64),
)
QUICK_SHAPE = tp.Shape("tiny", 65)  # --quick: the CPU shape, to try the script anywhere
METHODS = (("nanogpt", False), ("ours", False), ("nanogpt", True), ("ours", True))
# dense bf16 peaks of the SXM parts; PCIe and NVL cards differ, and get no MFU
PEAK_BF16 = {"H100": 989.4e12, "H200": 989.4e12, "A100": 312e12}
NANOGPT_PEAK = 312e12  # what nanoGPT's estimate_mfu divides by

# nanoGPT's train.py run by nanogpt_reference's launcher, then its peak GPU memory
LAUNCHER = (
    ref.LAUNCHER
    + "\nif torch.cuda.is_available():\n"
    + "    print('peak_gpu_mb', torch.cuda.max_memory_allocated() / 2**20)\n"
)
MFU_LINE = r"mfu ([-\d.]+)%"


@dataclass(frozen=True)
class Result:
    tokens_per_s: float
    peak_gpu_mb: float
    note: str = ""  # ours: the flash check; nanoGPT: its own MFU estimate, rescaled


def matmul_weights(model: nn.Module) -> int:
    """in x out summed over the model's matmuls (nn.Linear and our tied head)."""
    from stackwise.train.flops import linear_shape

    total = 0
    for module in model.modules():
        shape = linear_shape(module)
        if shape is not None:
            total += shape[0] * shape[1]
    return total


def flops_per_token(model: nn.Module, shape: tp.Shape) -> float:
    layers = shape.n_stacks * shape.blocks_per_stack
    return 6 * matmul_weights(model) + 12 * layers * shape.d_model * shape.seq_len


def peak_flops(device: str) -> float | None:
    if not device.startswith("cuda"):
        return None
    name = torch.cuda.get_device_name()
    if "PCIe" in name or "NVL" in name:
        return None
    return next((v for k, v in PEAK_BF16.items() if k in name), None)


def measured_matmul_tflops() -> float:
    """bf16 8192^3 matmuls, mean of 10 after 3 warm-ups: what this GPU really reaches."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(10):
        a @ b
    torch.cuda.synchronize()
    return 10 * 2 * 8192**3 / (time.perf_counter() - start) / 1e12


# -- the two runners, each in its own process ---------------------------------------------


def run_nanogpt(
    nanogpt: Path, work: Path, shape: tp.Shape, plan: tp.Plan, compile: bool, device: str
) -> Result:
    precision = "bf16"
    args = ref.nanogpt_args(shape, plan, precision, work / "out", device, compile)
    cwd = os.getcwd()
    os.chdir(work)  # train.py reads configurator.py and data/ from its working folder
    try:
        launcher_precision = precision if device == "cpu" else "fp32"  # on CUDA it autocasts
        cmd = [sys.executable, "-c", LAUNCHER, str(nanogpt / "train.py"), launcher_precision]
        stdout, _, _, _ = bench.run_child(cmd + args, {**os.environ, "PYTHONWARNINGS": "ignore"})
    finally:
        os.chdir(cwd)
    times = {int(i): float(ms) for i, ms in ref.ITER_LINE.findall(stdout)}
    timed = [times[i] for i in range(plan.warmup, plan.total_steps)]
    peak = [float(line.split()[1]) for line in stdout.splitlines() if line.startswith("peak_gpu")]
    own = [float(m) for m in re.findall(MFU_LINE, stdout) if float(m) > 0]
    gpu_peak = peak_flops(device)
    note = ""
    if own and gpu_peak:
        note = f"its own MFU estimate {own[-1] * NANOGPT_PEAK / gpu_peak:.1f}%"
    return Result(
        len(timed) * shape.tokens_per_step / (sum(timed) / 1000), peak[-1] if peak else 0, note
    )


OURS_CHILD = """
import json, sys
import gpu_throughput as g
print("RESULT " + json.dumps(g.ours_child(*sys.argv[1:])))
"""


def ours_child(shape_name: str, warmup: str, steps: str, compile: str) -> dict:
    """One run of ours in this (fresh) process: tokens/s, peak GPU memory, the flash check."""
    shape = next(s for s in (*SHAPES, QUICK_SHAPE) if s.name == shape_name)
    plan = tp.Plan(1, int(warmup), int(steps))
    tp.PRECISION = "bf16"
    with tempfile.TemporaryDirectory() as folder:
        result = tp.run_ours(
            shape, plan, tp.random_tokens(shape, plan), Path(folder), compile=compile == "True"
        )
    peak = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else 0.0
    return {"tokens_per_s": result.tokens_per_s, "peak_gpu_mb": peak, "note": flash_check(shape)}


def flash_check(shape: tp.Shape) -> str:
    """Does one forward and backward of a fresh (eager) rack run with SDPA's flash backend
    alone? Which backend the timed runs used is gpu_step_profile's to show."""
    if not torch.cuda.is_available():
        return "flash-capable: no GPU"
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with tempfile.TemporaryDirectory() as folder:
        config = tp.make_config(shape, tp.Plan(1, 1, 2), Path(folder))
    rack = tp.fresh_rack(config, shape.vocab_size).cuda()
    ids = torch.randint(2, shape.vocab_size, (2, shape.seq_len), device="cuda")
    try:
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]), torch.autocast("cuda", torch.bfloat16):
            rack(ids).float().sum().backward()
    except RuntimeError as err:
        return f"flash-capable: no ({str(err).splitlines()[0][:80]})"
    return "flash-capable: yes"


def run_ours(shape: tp.Shape, plan: tp.Plan, compile: bool) -> Result:
    here = str(Path(__file__).resolve().parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])}
    args = [shape.name, str(plan.warmup), str(plan.steps), str(compile)]
    stdout, _, _, _ = bench.run_child([sys.executable, "-c", OURS_CHILD, *args], env)
    line = next(x for x in reversed(stdout.splitlines()) if x.startswith("RESULT "))
    return Result(**json.loads(line[len("RESULT ") :]))


# -- the driver --------------------------------------------------------------------------------


def label(method: str, compile: bool) -> str:
    return f"{method} {'compiled' if compile else 'eager'}"


def prepare(work: Path, nanogpt: Path, shapes: tuple[tp.Shape, ...]) -> None:
    """nanoGPT's working folder: its configurator and random tokens in its data layout."""
    (work / "configurator.py").symlink_to(nanogpt / "configurator.py")
    rng = np.random.default_rng(1234)
    for shape in shapes:
        tokens = rng.integers(0, shape.vocab_size, 2_000_000, np.uint16)
        ref.write_dataset(work / "data" / f"vocab{shape.vocab_size}", tokens, shape.vocab_size)


def mfu(tokens_per_s: float, per_token: float, peak: float | None) -> float | None:
    return None if peak is None else tokens_per_s * per_token / peak


def print_table(rows: dict, costs: dict, peak: float | None) -> list[tuple[str, float, float]]:
    """The table; returns (shape and mode, ours/nanoGPT tokens/s, ours/nanoGPT MFU) for each
    shape and mode both sides finished."""
    head = (
        f"{'shape':<11} {'run':<17} {'reps':>4} {'median tok/s':>13} {'min..max':>21} "
        f"{'MFU':>6} {'peak GPU MB':>11}  note"
    )
    print(head)
    print("-" * len(head))
    ratios = []
    for (name, method, compile), results in rows.items():
        if not results:
            continue
        tps = [r.tokens_per_s for r in results]
        med = statistics.median(tps)
        use = mfu(med, costs[(name, method)], peak)
        print(
            f"{name:<11} {label(method, compile):<17} {len(tps):>4} {med:>13,.0f} "
            f"{f'{min(tps):,.0f}..{max(tps):,.0f}':>21} "
            f"{'n/a' if use is None else f'{100 * use:.1f}%':>6} "
            f"{statistics.median(r.peak_gpu_mb for r in results):>11,.0f}  {results[-1].note}"
        )
    for shape in dict.fromkeys(k[0] for k in rows):
        for compile in (False, True):
            ours = rows.get((shape, "ours", compile), [])
            theirs = rows.get((shape, "nanogpt", compile), [])
            if not (ours and theirs):
                continue
            speed = statistics.median(r.tokens_per_s for r in ours) / statistics.median(
                r.tokens_per_s for r in theirs
            )
            work = costs[(shape, "ours")] / costs[(shape, "nanogpt")]
            ratios.append((f"{shape} {'compiled' if compile else 'eager'}", speed, speed * work))
    return ratios


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = bench.benchmark_parser(__doc__, "smoke run on the CPU shape: 1 rep of 2 + 3 steps")
    p.add_argument("--nanogpt", type=Path, required=True, help="a karpathy/nanoGPT checkout")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--warmup", type=int, default=10, help="untimed iterations (compiles there)")
    p.add_argument("--steps", type=int, default=40, help="timed iterations per run")
    p.add_argument("--budget-s", type=float, default=1e9, help="start no run after this long")
    p.add_argument("--shapes", default=",".join(s.name for s in SHAPES), help="comma-separated")
    p.add_argument("--modes", default="eager,compiled", help="eager, compiled or both")
    args = p.parse_args(argv)
    args.modes = set(args.modes.split(","))
    if not args.modes or not args.modes <= {"eager", "compiled"}:
        p.error("--modes: eager, compiled, or eager,compiled")
    if min(args.reps, args.warmup, args.steps) < 1:
        p.error("--reps, --warmup and --steps must each be at least 1")
    args.nanogpt = args.nanogpt.resolve()
    if not (args.nanogpt / "train.py").is_file():
        p.error(f"--nanogpt {args.nanogpt}: no train.py there; clone karpathy/nanoGPT first")
    if not torch.cuda.is_available() and not args.quick:
        p.error("no CUDA GPU here: this benchmark measures one (--quick tries it on the CPU)")
    unknown = set(args.shapes.split(",")) - {s.name for s in SHAPES}
    if unknown:
        p.error(f"--shapes: unknown {sorted(unknown)}; choose from {[s.name for s in SHAPES]}")
    return args


def work_per_token(shape: tp.Shape, plan: tp.Plan) -> dict[tuple[str, str], float]:
    """FLOPs per token of ours (the rack the Trainer builds) and of nanoGPT's GPT."""
    with tempfile.TemporaryDirectory() as folder:
        rack = tp.fresh_rack(tp.make_config(shape, plan, Path(folder)), shape.vocab_size)
    costs = {
        (shape.name, "ours"): flops_per_token(rack, shape),
        (shape.name, "nanogpt"): flops_per_token(tp.GPT(shape), shape),
    }
    print(
        f"{shape.name}: FLOPs/token ours {costs[(shape.name, 'ours')]:,.0f}, "
        f"nanoGPT {costs[(shape.name, 'nanogpt')]:,.0f}",
        flush=True,
    )
    return costs


Rows = dict[tuple[str, str, bool], list[Result]]


def measure(args: argparse.Namespace, shapes: tuple[tp.Shape, ...], plan: tp.Plan) -> Rows:
    """Every shape's reps of METHODS, interleaved; stops starting runs past --budget-s or
    after a failure (later runs would only spend GPU time)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    methods = [(m, c) for m, c in METHODS if ("compiled" if c else "eager") in args.modes]
    rows: Rows = {(s.name, m, c): [] for s in shapes for m, c in methods}
    start, budget = time.perf_counter(), args.budget_s
    with tempfile.TemporaryDirectory(prefix="gpu-throughput-") as tmp:
        prepare(Path(tmp), args.nanogpt, shapes)
        for shape, rep, (method, compile) in itertools.product(shapes, range(plan.reps), methods):
            name = f"{shape.name} rep {rep + 1} {label(method, compile)}"
            if time.perf_counter() - start > budget:
                print(f"  skipped {name}: over --budget-s or after a failure", flush=True)
                continue
            t0 = time.perf_counter()
            try:
                if method == "nanogpt":
                    r = run_nanogpt(args.nanogpt, Path(tmp), shape, plan, compile, device)
                else:
                    r = run_ours(shape, plan, compile)
            except (RuntimeError, KeyError, StopIteration, ValueError) as err:
                detail = str(err).strip().splitlines()[-1:] or [type(err).__name__]
                print(f"  {name} FAILED: {type(err).__name__}: {detail[0][:300]}", flush=True)
                budget = 0.0
                continue
            rows[(shape.name, method, compile)].append(r)
            print(
                f"  {name:<33} {r.tokens_per_s:>10,.0f} tok/s  {r.peak_gpu_mb:>8,.0f} MB  "
                f"({time.perf_counter() - t0:.0f} s)  {r.note}",
                flush=True,
            )
    return rows


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    rec = record.start("gpu_throughput", args.record)
    wanted = args.shapes.split(",")
    shapes = (QUICK_SHAPE,) if args.quick else tuple(s for s in SHAPES if s.name in wanted)
    plan = tp.Plan(1, 2, 3) if args.quick else tp.Plan(args.reps, args.warmup, args.steps)
    peak = peak_flops("cuda" if torch.cuda.is_available() else "cpu")
    print(bench.machine_line("bf16 autocast"))
    if torch.cuda.is_available():
        print(
            f"GPU: {torch.cuda.get_device_name()}; dense bf16 peak used for MFU: "
            f"{peak / 1e12 if peak else float('nan'):.0f} TFLOP/s; measured 8192^3 bf16 matmul: "
            f"{measured_matmul_tflops():.0f} TFLOP/s"
        )
    print(f"plan: {plan.reps} interleaved reps x ({plan.warmup} warm-up + {plan.steps} timed)")
    costs = {k: v for shape in shapes for k, v in work_per_token(shape, plan).items()}
    rows = measure(args, shapes, plan)
    print()
    ratios = print_table(rows, costs, peak)
    print()
    print(
        "headline: ours/nanoGPT (tokens/s, MFU): "
        + "; ".join(f"{name} {speed:.2f}, {use:.2f}" for name, speed, use in ratios)
    )
    met = bool(ratios) and all(use >= 1.0 for _, _, use in ratios)
    rec.finish(f"MFU ours ≥ nanoGPT's at each shape, {' and '.join(sorted(args.modes))}", met)
    if not ratios:
        sys.exit("no shape finished on both sides: nothing to compare (see the FAILED lines)")


if __name__ == "__main__":
    main()
