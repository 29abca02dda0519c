"""Is throughput.py's nanoGPT as fast as nanoGPT? Its rebuilt model and loop against nanoGPT's
own train.py, run from a checkout outside this repository.

    git clone https://github.com/karpathy/nanoGPT /tmp/nanogpt
    .venv/bin/python benchmarks/nanogpt_reference.py --nanogpt /tmp/nanogpt

Nothing of nanoGPT is copied here: its train.py runs as a child process, in a temporary folder
that holds a link to its configurator.py and the data this script writes in nanoGPT's format
(`train.bin`/`val.bin` of uint16 tokens and a `meta.pkl` with the vocabulary size):
- vocab 65: the default corpus's text, kept to its 65 most frequent characters (the size of
  nanoGPT's shakespeare_char), the first 1.1M characters, split 90/10 as its prepare.py does;
- vocab 4096: random tokens.
Both sides run the same shape (4 layers, d_model 128, 4 heads, seq 64, batch 12, no dropout,
no bias, no compile) with the same number of torch threads (OMP_NUM_THREADS for the child,
torch.set_num_threads for the rebuilt one). nanoGPT prints each iteration's wall time; its
tokens/s is tokens over the summed times of the iterations after the warm-up, the same span
throughput.py's clock measures for the rebuilt loop.

bf16: nanoGPT's train.py autocasts only on a GPU (on a CPU its context is `nullcontext()`).
Its bf16 row therefore runs train.py with that one context swapped for CPU autocast in bf16,
by a launcher that changes nothing else. Repetitions alternate (nanoGPT, rebuilt, nanoGPT,
...); the table gives medians and spreads, and the last line the rebuilt/nanoGPT ratios (the
goal: within 5%, 0.95-1.05).
"""

from __future__ import annotations

import os
import pickle
import re
import statistics
import sys
import tempfile
from collections import Counter
from pathlib import Path

import _common as bench
import _record as record
import numpy as np
import throughput as tp

# Runs nanoGPT's train.py as its own __main__. For bf16, the `nullcontext()` that train.py
# calls on a CPU returns CPU autocast instead; any other caller still gets the real one.
LAUNCHER = """
import contextlib, os, runpy, sys, torch
script = sys.argv[1]
sys.path.insert(0, os.path.dirname(script))  # its `from model import GPT`
if sys.argv[2] == "bf16":
    class Context(contextlib.nullcontext):
        def __new__(cls, *args):
            if cls is Context and not args and sys._getframe(1).f_code.co_filename == script:
                return torch.autocast("cpu", dtype=torch.bfloat16)
            return super().__new__(cls)
    contextlib.nullcontext = Context
sys.argv = [script] + sys.argv[3:]
runpy.run_path(script, run_name="__main__")
"""
ITER_LINE = re.compile(r"^iter (\d+): loss [-\d.naif]+, time ([\d.]+)ms", re.MULTILINE)


def char_vocab(vocab: int = 65) -> tuple[str, list[str]]:
    """The default corpus and its `vocab` most frequent characters, sorted: id i is kept[i]."""
    from stackwise.data.corpus import shakespeare_dir

    text = "".join(p.read_text("utf-8", "ignore") for p in sorted(shakespeare_dir().glob("*.txt")))
    return text, sorted(ch for ch, _ in Counter(text).most_common(vocab))


def char_tokens(limit: int = 1_115_394, vocab: int = 65) -> np.ndarray:
    """The default corpus as ids of its `vocab` most frequent characters, others dropped."""
    text, kept = char_vocab(vocab)
    index = {ch: i for i, ch in enumerate(kept)}
    return np.array([index[ch] for ch in text if ch in index][:limit], dtype=np.uint16)


def write_dataset(folder: Path, tokens: np.ndarray, vocab: int) -> None:
    """nanoGPT's dataset layout: train.bin and val.bin (uint16), meta.pkl with vocab_size."""
    folder.mkdir(parents=True, exist_ok=True)
    cut = int(0.9 * len(tokens))
    tokens[:cut].tofile(folder / "train.bin")
    tokens[cut:].tofile(folder / "val.bin")
    with open(folder / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": vocab}, f)


def prepare(work: Path, nanogpt: Path, random_tokens: bool = True) -> None:
    """nanoGPT's working folder: its configurator and the vocab65 (and vocab4096) datasets."""
    (work / "configurator.py").symlink_to(nanogpt / "configurator.py")
    write_dataset(work / "data" / "vocab65", char_tokens(), 65)
    if random_tokens:
        rng = np.random.default_rng(1234)
        tokens = rng.integers(0, 4096, 1_100_000, np.uint16)
        write_dataset(work / "data" / "vocab4096", tokens, 4096)


def nanogpt_args(
    shape: tp.Shape,
    plan: tp.Plan,
    precision: str,
    out: Path,
    device: str = "cpu",
    compile: bool = False,
) -> list[str]:
    """train.py's command line for one run of `shape` (benchmarks/gpu_throughput.py passes a
    CUDA device and compile)."""
    return [
        f"--dataset=vocab{shape.vocab_size}",
        f"--device={device}",
        f"--compile={compile}",
        f"--dtype={'bfloat16' if precision == 'bf16' else 'float32'}",
        f"--n_layer={shape.n_stacks * shape.blocks_per_stack}",
        f"--n_head={shape.n_heads}",
        f"--n_embd={shape.d_model}",
        f"--block_size={shape.seq_len}",
        f"--batch_size={shape.batch_size}",
        "--gradient_accumulation_steps=1",
        "--dropout=0.0",
        "--bias=False",
        f"--learning_rate={tp.LR}",
        f"--beta2={tp.BETAS[1]}",
        f"--max_iters={plan.total_steps - 1}",  # iterations 0 .. max_iters
        "--lr_decay_iters=2000",
        "--eval_interval=1000000",  # evaluates once, inside iteration 0 (a warm-up one)
        "--eval_iters=1",
        "--log_interval=1",
        "--always_save_checkpoint=False",
        f"--out_dir={out}",
    ]


def run_nanogpt(
    nanogpt: Path, work: Path, shape: tp.Shape, plan: tp.Plan, precision: str, threads: int
) -> tuple[float, float]:
    """(tokens/s over the iterations after warm-up, peak RSS in MB) of nanoGPT's train.py."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONWARNINGS": "ignore"}
    script = str(nanogpt / "train.py")
    args = nanogpt_args(shape, plan, precision, work / "out")
    cwd = os.getcwd()
    os.chdir(work)  # train.py reads configurator.py and data/ from its working folder
    try:
        cmd = [sys.executable, "-c", LAUNCHER, script, precision, *args]
        stdout, _, _, rss = bench.run_child(cmd, env)
    finally:
        os.chdir(cwd)
    times = {int(i): float(ms) for i, ms in ITER_LINE.findall(stdout)}
    timed = [times[i] for i in range(plan.warmup, plan.total_steps)]
    return len(timed) * shape.tokens_per_step / (sum(timed) / 1000), rss


REBUILT = """
import sys, tempfile
from pathlib import Path
import torch
import throughput as tp
vocab, precision, threads, warmup, steps = sys.argv[1:6]
tp.PRECISION, tp.THREADS = precision, int(threads)
torch.set_num_threads(int(threads))
shape, plan = tp.Shape(f"vocab {vocab}", int(vocab)), tp.Plan(1, int(warmup), int(steps))
with tempfile.TemporaryDirectory() as folder:
    result = tp.run_nanogpt(shape, plan, tp.random_tokens(shape, plan), Path(folder))
print(result.tokens_per_s)
"""


def run_rebuilt(shape: tp.Shape, plan: tp.Plan, precision: str, threads: int) -> float:
    """tokens/s of throughput.py's rebuilt nanoGPT, in a fresh process as nanoGPT's own runs
    (a forked child would inherit this process's allocator state, which changes page faults)."""
    here = str(Path(__file__).resolve().parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])}
    args = [str(shape.vocab_size), precision, str(threads), str(plan.warmup), str(plan.steps)]
    stdout, _, _, _ = bench.run_child([sys.executable, "-c", REBUILT, *args], env)
    return float(stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    p = bench.benchmark_parser(__doc__, "smoke run: 2 reps of 3 + 10 iterations")
    p.add_argument("--nanogpt", type=Path, required=True, help="a karpathy/nanoGPT checkout")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--steps", type=int, default=60, help="timed iterations per rep")
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    p.add_argument("--precisions", default="fp32,bf16", help="fp32, bf16 or both")
    p.add_argument("--vocabs", default="65,4096", help="comma-separated: 65, 4096 or both")
    args = p.parse_args(argv)
    rec = record.start("nanogpt_reference", args.record)
    args.nanogpt = args.nanogpt.resolve()  # its train.py runs from another folder
    if not (args.nanogpt / "train.py").is_file():
        p.error(f"--nanogpt {args.nanogpt}: no train.py there; clone karpathy/nanoGPT first")
    plan = tp.Plan(2, 3, 10) if args.quick else tp.Plan(args.reps, 10, args.steps)
    threads = [int(t) for t in args.threads.split(",")]
    precisions = args.precisions.split(",")
    bench.pin_threads()
    print(bench.machine_line("fp32 and bf16 rows"))
    print(f"plan: {plan.reps} alternating reps x ({plan.warmup} warm-up + {plan.steps} timed)")
    rows = []
    with tempfile.TemporaryDirectory(prefix="nanogpt-ref-") as tmp:
        work = Path(tmp)
        prepare(work, args.nanogpt)
        vocabs = {int(v) for v in args.vocabs.split(",")}
        for shape in (s for s in tp.SHAPES if s.vocab_size in vocabs):
            for precision in precisions:
                for n in threads:
                    real, clone, rss = [], [], []
                    for _ in range(plan.reps):
                        tps, peak = run_nanogpt(args.nanogpt, work, shape, plan, precision, n)
                        real.append(tps)
                        rss.append(peak)
                        clone.append(run_rebuilt(shape, plan, precision, n))
                    rows.append((shape.name, precision, n, real, clone, rss))
                    print(
                        f"  {shape.name} {precision} {n} thread(s): nanoGPT {real} rebuilt {clone}"
                    )
    print()
    head = (
        f"{'shape':<11} {'prec':<5} {'threads':>7} {'nanoGPT tok/s':>13} {'min..max':>15} "
        f"{'rebuilt tok/s':>13} {'min..max':>15} {'rebuilt/nanoGPT':>15} {'nanoGPT RSS MB':>14}"
    )
    print(head)
    print("-" * len(head))
    ratios = []
    for name, precision, n, real, clone, rss in rows:
        ratio = statistics.median(c / r for c, r in zip(clone, real, strict=True))
        ratios.append(ratio)
        print(
            f"{name:<11} {precision:<5} {n:>7} {statistics.median(real):>13,.0f} "
            f"{f'{min(real):,.0f}..{max(real):,.0f}':>15} {statistics.median(clone):>13,.0f} "
            f"{f'{min(clone):,.0f}..{max(clone):,.0f}':>15} {ratio:>15.3f} "
            f"{statistics.median(rss):>14,.0f}"
        )
    print()
    worst = max(ratios, key=lambda r: abs(r - 1.0))
    print(
        "headline: rebuilt/nanoGPT tokens/s (median of paired reps) = "
        + ", ".join(f"{r:.3f}" for r in ratios)
        + f"; furthest from 1: {worst:.3f} (goal 0.95..1.05)"
    )
    rec.finish("every rebuilt/nanoGPT ratio in 0.95..1.05", all(0.95 <= r <= 1.05 for r in ratios))


if __name__ == "__main__":
    main()
