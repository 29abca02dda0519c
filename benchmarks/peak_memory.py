"""Memory against nanoGPT's own code: what a training step keeps for backward, and the peak RSS
of a whole 300-step run side by side.

    git clone https://github.com/karpathy/nanoGPT /tmp/nanogpt
    .venv/bin/python benchmarks/peak_memory.py --nanogpt /tmp/nanogpt

1. Activations: the bytes autograd keeps for backward in one training step (counted by a
   saved-tensor hook, parameters aside), for our rack as it is, for our rack with the plain
   ops (`F.rms_norm`, `F.silu(gate) * up`: what it ran before model/lean_autograd.py), and
   for nanoGPT's `GPT` from its own model.py, at the side-by-side shape and a larger one.
2. Peak RSS: `stackwise train` and nanoGPT's `train.py` (its shakespeare_char config with the
   issue's shape: 4 layers, d_model 128, 4 heads, seq 64, batch 12, fp32, no compile, 300
   iterations) on the same 1.1M characters, one thread, reps alternating; the peak is each
   child's own (wait4). Both runs must learn (final validation loss well under the text's
   unigram entropy) for their memory to compare. Our token store is built once beforehand.
3. With --parts, where each side's peak lies: one more run each, followed from inside by
   _peak_parts.py (what malloc holds in use and free, the other anonymous memory, the pages
   of mapped files).

Nothing of nanoGPT is copied: its model.py is imported from the checkout, its train.py runs as
a child in a temporary folder holding its data in its own format (nanogpt_reference.py).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import statistics
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import _common as bench
import _peak_parts as peak_parts
import _record as record
import nanogpt_reference as ref
import numpy as np
import torch
import torch.nn.functional as F
import yaml

from stackwise.config import from_dict
from stackwise.io.trained import build_rack
from stackwise.model import layers, moe
from stackwise.model.lean_autograd import kept_for_backward

SHAPES = {  # name: (layers, d_model, heads, seq, batch, vocab)
    "side-by-side": (4, 128, 4, 64, 12, 65),
    "larger": (8, 512, 8, 256, 8, 4096),
}
STEPS = 300
SPLITS = ("train", "val")
NANOGPT_VAL = re.compile(r"step (\d+): train loss [\d.]+, val loss ([\d.]+)")
Runs = dict[str, list[tuple[float, float]]]  # run: (peak RSS MB, validation loss) per rep
OUR_VAL = re.compile(r"final eval \(step \d+\): val loss ([\d.]+)")


def our_rack(shape: tuple[int, ...]) -> torch.nn.Module:
    n_layers, d, heads, seq, _, vocab = shape
    model = {"d_model": d, "n_heads": heads, "n_stacks": 1, "blocks_per_stack": n_layers}
    cfg = from_dict(
        {"model": {**model, "max_seq_len": seq}, "data": {"seq_len": seq}}, origin="benchmark"
    )
    torch.manual_seed(0)
    return build_rack(cfg, vocab)


def nanogpt_model(nanogpt: Path, shape: tuple[int, ...]) -> torch.nn.Module:
    spec = importlib.util.spec_from_file_location("nanogpt_model", nanogpt / "model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    n_layers, d, heads, seq, _, vocab = shape
    conf = module.GPTConfig(
        block_size=seq, vocab_size=vocab, n_layer=n_layers, n_head=heads, n_embd=d, dropout=0.0
    )
    conf.bias = False
    torch.manual_seed(0)
    return module.GPT(conf)


def plain_ops() -> dict[str, Any]:
    """Swap the rack's lean RMSNorm and SwiGLU product for the plain ops; returns the lean ones."""
    lean = {"rms_norm": layers.rms_norm, "silu_mul": layers.silu_mul}
    layers.rms_norm = lambda x, w, eps: F.rms_norm(x, (x.shape[-1],), w, eps)
    layers.silu_mul = moe.silu_mul = lambda gate, up: F.silu(gate) * up
    return lean


def shape_rows(nanogpt: Path, name: str, shape: tuple[int, ...]) -> list[tuple[str, str, int, int]]:
    """(shape, model, parameters, bytes kept) for our rack, before and after, and nanoGPT's."""
    seq, batch, vocab = shape[3:]
    ids = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(0))
    rack, gpt = our_rack(shape), nanogpt_model(nanogpt, shape)

    def our_step() -> torch.Tensor:
        return F.cross_entropy(rack(ids).flatten(0, 1), ids.flatten())

    size = sum(p.numel() for p in rack.parameters())
    rows = [(name, "rack", size, kept_for_backward(rack, our_step))]
    lean = plain_ops()
    try:
        rows.append((name, "rack, plain ops (before)", size, kept_for_backward(rack, our_step)))
    finally:
        layers.rms_norm, layers.silu_mul = lean["rms_norm"], lean["silu_mul"]
        moe.silu_mul = lean["silu_mul"]
    size = sum(p.numel() for p in gpt.parameters())
    rows.append((name, "nanoGPT model.py", size, kept_for_backward(gpt, lambda: gpt(ids, ids)[1])))
    return rows


def our_config(text_file: Path) -> dict[str, Any]:
    """The side-by-side run for `stackwise train`: nanoGPT's shape, fp32, no samples."""
    return {
        "model": {"d_model": 128, "n_heads": 4, "n_stacks": 1, "blocks_per_stack": 4},
        "data": {"source": "files", "files": [str(text_file)], "tokenizer": "char", "seq_len": 64},
        "objective": {"name": "clm"},
        "train": {"max_steps": STEPS, "batch_size": 12, "eval_every": 250, "mixed_precision": "no"},
        "sample": {"num_samples": 0},
    }


def write_side_by_side(work: Path, nanogpt: Path) -> tuple[Path, float]:
    """nanoGPT's data folder and our config over the same text; the text's unigram entropy."""
    ref.prepare(work, nanogpt, random_tokens=False)
    _, kept = ref.char_vocab()
    ids = [np.fromfile(work / "data" / "vocab65" / f"{split}.bin", np.uint16) for split in SPLITS]
    text = "".join(kept[i] for i in np.concatenate(ids).tolist())  # what nanoGPT trains on
    (work / "input.txt").write_text(text, encoding="utf-8")
    counts = Counter(text)
    unigram = -sum(n / len(text) * math.log(n / len(text)) for n in counts.values())
    (work / "side.yaml").write_text(yaml.safe_dump(our_config(work / "input.txt")), "utf-8")
    return work / "side.yaml", unigram


def nanogpt_command(nanogpt: Path, out: Path) -> list[str]:
    """nanoGPT's train.py with its shakespeare_char config and the issue's shape."""
    overrides = {
        "dataset": "vocab65", "device": "cpu", "compile": False, "dtype": "float32",
        "n_layer": 4, "n_head": 4, "n_embd": 128, "block_size": 64, "batch_size": 12,
        "dropout": 0.0, "max_iters": STEPS, "lr_decay_iters": 2000, "eval_interval": 250,
        "eval_iters": 20, "log_interval": 50, "out_dir": out,
    }  # fmt: skip
    config = str(nanogpt / "config" / "train_shakespeare_char.py")
    args = [f"--{k}={v}" for k, v in overrides.items()]
    return [sys.executable, str(nanogpt / "train.py"), config, *args]


def nanogpt_run(nanogpt: Path, work: Path, rep: int, **extra: str) -> tuple[float, float]:
    """(peak RSS MB, last validation loss) of nanoGPT's train.py; `extra`: environment."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", **extra}
    cwd = os.getcwd()
    os.chdir(work)  # train.py reads configurator.py and data/ from its working folder
    try:
        out, _, _, peak = bench.run_child(nanogpt_command(nanogpt, work / f"ng{rep}"), env)
    finally:
        os.chdir(cwd)
    return peak, float(NANOGPT_VAL.findall(out)[-1][1])


def our_run(
    side: Path, out: Path, checkout: Path | None, *extra: str, **more_env: str
) -> tuple[float, float]:
    """(peak RSS MB, final validation loss) of `stackwise train`, from `checkout` if given."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", **more_env}
    env["PYTHONSAFEPATH"] = "1"  # `-m` would put the working folder's package first
    if checkout is not None:  # that checkout's package ahead of the installed one
        env["PYTHONPATH"] = str(checkout)
    cmd = [sys.executable, "-m", "stackwise", "train", str(side), f"train.output_dir={out}"]
    stdout, _, _, peak = bench.run_child([*cmd, *extra], env)
    return peak, float(OUR_VAL.findall(stdout)[-1])


def part_rows(nanogpt: Path, work: Path, side: Path) -> dict[str, dict[str, Any]]:
    """One more run of each side with _peak_parts.py following it: its peak (VmHWM, from
    outside) and where its sampled high lies (its VmHWM alone where no record was written)."""
    parts: dict[str, dict[str, Any]] = {}
    for run in ("nanoGPT train.py", "stackwise train"):
        record = work / f"parts-{len(parts)}.json"
        extra = peak_parts.probe_env(work / "probe", record, os.environ.get("PYTHONPATH", ""))
        if run.startswith("nanoGPT"):
            peak, _ = nanogpt_run(nanogpt, work, 99, **extra)
        else:
            peak, _ = our_run(side, work / "parts", None, **extra)
        found = json.loads(record.read_text()) if record.is_file() else {}
        parts[run] = {"VmHWM": peak, **found}
    return parts


def peak_rows(
    nanogpt: Path, reps: int, before: Path | None, parts: bool
) -> tuple[Runs, float, dict[str, dict[str, Any]]]:
    """Each run's (peak, loss) per rep, alternating, the text's unigram entropy, and with
    `parts` each side's peak by kind."""
    runs: Runs = {}
    with tempfile.TemporaryDirectory(prefix="peak-memory-") as tmp:
        work = Path(tmp)
        side, unigram = write_side_by_side(work, nanogpt)
        our_run(side, work / "warm", None, "train.max_steps=1")  # builds the token store
        for rep in range(reps):
            results = {"nanoGPT train.py": nanogpt_run(nanogpt, work, rep)}
            if before is not None:
                results["stackwise, before"] = our_run(side, work / f"old{rep}", before)
            results["stackwise train"] = our_run(side, work / f"sw{rep}", None)
            for run, (peak, loss) in results.items():
                runs.setdefault(run, []).append((peak, loss))
                print(f"  rep {rep + 1}/{reps}: {run:<17} {peak:7.1f} MB, val loss {loss:.3f}")
        found = part_rows(nanogpt, work, side) if parts else {}
    return runs, unigram, found


def print_activations(rows: list[tuple[str, str, int, int]]) -> dict[str, float]:
    head = (
        f"{'shape':<13} {'model':<26} {'parameters':>11} {'kept for backward':>18} {'x nanoGPT':>9}"
    )
    print(head)
    print("-" * len(head))
    ratios = {}
    for name, model, size, kept in rows:
        theirs = next(k for n, m, _, k in rows if n == name and m.startswith("nanoGPT"))
        print(f"{name:<13} {model:<26} {size:>11,} {kept / 2**20:>15.2f} MB {kept / theirs:>9.3f}")
        if model == "rack":
            ratios[name] = kept / theirs
    return ratios


def print_peaks(runs: Runs, unigram: float) -> float:
    head = f"{'run':<17} {'peak RSS MB':>11} {'min..max':>13} {'val loss':>8} {'x nanoGPT':>9}"
    print(head)
    print("-" * len(head))
    theirs = statistics.median(r for r, _ in runs["nanoGPT train.py"])
    for run, results in runs.items():
        peaks = [r for r, _ in results]
        loss = statistics.median(v for _, v in results)
        span = f"{min(peaks):.1f}..{max(peaks):.1f}"
        print(f"{run:<17} {statistics.median(peaks):>11.1f} {span:>13} {loss:>8.3f} "
              f"{statistics.median(peaks) / theirs:>9.3f}")  # fmt: skip
    learned = all(v < 0.8 * unigram for results in runs.values() for _, v in results)
    print(f"unigram entropy of the text {unigram:.3f} nats/char: both learned: {learned}")
    if not learned:
        sys.exit("a run did not learn: its memory says nothing")
    return statistics.median(r for r, _ in runs["stackwise train"]) / theirs


def print_parts(parts: dict[str, dict[str, Any]]) -> None:
    kinds = ["VmHWM", *peak_parts.KINDS]
    ours, theirs = parts["stackwise train"], parts["nanoGPT train.py"]
    gap = {k: ours[k] - theirs[k] if _known(ours, k) and _known(theirs, k) else None for k in kinds}
    head = f"{'run':<17} " + " ".join(f"{k:>15}" for k in kinds)
    print(head)
    print("-" * len(head))
    for run, got in (*parts.items(), ("ours - nanoGPT", gap)):
        cells = (f"{got[k]:>12.1f} MB" if _known(got, k) else f"{'n/a':>15}" for k in kinds)
        print(f"{run:<17} " + " ".join(cells))
    for run, got in parts.items():
        if got.get("error") or len(got) == 1:
            print(f"{run}: the follower failed ({got.get('error') or 'no record written'})")


def _known(parts: dict[str, Any], kind: str) -> bool:
    return parts.get(kind) is not None


def main(argv: list[str] | None = None) -> None:
    p = bench.benchmark_parser(__doc__, "one rep of the side-by-side run")
    p.add_argument("--nanogpt", type=Path, required=True, help="a checkout of karpathy/nanoGPT")
    p.add_argument("--reps", type=int, default=3, help="alternating reps of the side-by-side run")
    p.add_argument(
        "--before",
        type=Path,
        help="another stackwise checkout to run beside this one (a git worktree)",
    )
    p.add_argument(
        "--parts",
        action="store_true",
        help="one more run of each side, its peak split by kind (Linux; _peak_parts.py)",
    )
    args = p.parse_args(argv)
    args.nanogpt = args.nanogpt.resolve()
    if not (args.nanogpt / "train.py").is_file():
        p.error(f"--nanogpt {args.nanogpt}: no train.py there; clone karpathy/nanoGPT first")
    rec = record.start("peak_memory", args.record)
    bench.pin_threads()
    print(bench.machine_line())
    print("1. activations kept for backward in one training step (fp32)")
    rows = [row for name, shape in SHAPES.items() for row in shape_rows(args.nanogpt, name, shape)]
    act = print_activations(rows)
    print(f"\n2. peak RSS of the side-by-side run ({STEPS} steps, one thread, reps alternating)")
    runs, unigram, parts = peak_rows(
        args.nanogpt, 1 if args.quick else args.reps, args.before, args.parts
    )
    peak = print_peaks(runs, unigram)
    if parts:
        print("\n3. where each peak lies: one more run each, its VmHWM, and the breakdown at its")
        print("   sampled high (malloc's counts cover all its arenas and its mapped blocks)")
        print_parts(parts)
    print(
        f"\nheadline: peak RSS ours/nanoGPT = {peak:.3f}; activations kept ours/nanoGPT = "
        + ", ".join(f"{r:.3f} ({n})" for n, r in act.items())
    )
    rec.finish("peak RSS <= 1.0x nanoGPT's", peak <= 1.0)


if __name__ == "__main__":
    main()
