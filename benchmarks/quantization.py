"""Frozen-trunk storage formats: bytes per weight, peak RSS and step time of a QLoRA-style stage.

Run from the repository root:

    .venv/bin/python benchmarks/quantization.py           # d=512, 8 stacks: a few minutes
    .venv/bin/python benchmarks/quantization.py --quick   # smoke run, well under a minute

One rack (embeddings, `--stacks` one-block stacks, tied head; d_model `--d-model`) is built from
one seed, through `ProgressiveRackBuilder`, once per format. Its first stacks-1 stacks are the
trunk: stored as fp32, bf16, fp8, nf4 (bitsandbytes, double quantized) or nvfp4, each given a
trainable rank-`--rank` trunk LoRA adapter (PEFT); the last stack is new, fp32 and trainable;
the embeddings/head are frozen. That is `trunk_strategy: qlora` at its last stage.

Measured per format:
- `B/param`: bytes the trunk's linear weights occupy (codes + every scale), over their count.
  `vs fp32` is fp32's bytes over this format's.
- `rel err`: ||h_fmt - h_fp32|| / ||h_fp32|| of the trunk's output hidden states on one batch.
- `step ms`: median wall time of one optimizer step (forward through the whole rack, backward
  into the new stack and the trunk adapters, AdamW), one torch thread. Formats are interleaved
  round by round in one process; `vs bf16` is the ratio of medians to the bf16 trunk's.
- `peak MB`: peak RSS (VmHWM) of a fresh child process that builds that format's rack, frees
  what quantization left behind, resets the kernel's peak counter (/proc/self/clear_refs), then
  runs the training steps; minus the child's RSS before it built anything (interpreter and
  libraries). So: the whole rack's weights plus the step's activations, gradients and AdamW
  state, with that trunk. Embeddings, head and the new stack are fp32 in every row.

The last line is the headline: NF4 trunk bytes per weight and its memory ratio to fp32.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import _record as record
import torch
import torch.nn.functional as F
from _common import benchmark_parser, status_mb

from stackwise.config import ModelConfig
from stackwise.plan import spec_of
from stackwise.progressive.builder import ProgressiveRackBuilder
from stackwise.quant.layers import weight_bytes
from stackwise.quant.lora import TRUNK
from stackwise.spec import AdapterSpec, ModelSpec

FORMATS = ["fp32", "bf16", "fp8", "nf4", "nvfp4"]
VOCAB = 2048


def build(fmt: str, a: argparse.Namespace) -> ProgressiveRackBuilder:
    torch.manual_seed(0)
    cfg = ModelConfig(  # validated as a config's model section, then made a spec
        d_model=a.d_model,
        n_heads=a.d_model // 64,
        n_stacks=a.stacks,
        blocks_per_stack=1,
        max_seq_len=a.seq,
    )
    b = ProgressiveRackBuilder(spec_of(cfg, ModelSpec), VOCAB, causal=True, double_quant=True)
    for _ in range(a.stacks):
        b.append_stack()
    for stack in b.trunk:
        b.store_as(stack, {"fp32": "full"}.get(fmt, fmt))
        b.add_adapter(stack, TRUNK, AdapterSpec(a.rank, 2.0 * a.rank))
    b.freeze_trunk()
    b.set_anchor_trainable(False)
    for stack in b.trunk:
        b.set_trunk_adapter_trainable(stack, True)
    return b


def batch(a: argparse.Namespace) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    return torch.randint(0, VOCAB, (a.batch, a.seq), generator=gen)


def trunk_output(b: ProgressiveRackBuilder, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return b.rack.run_stacks(b.rack.embed(ids), stacks=b.trunk).float()


def make_step(b: ProgressiveRackBuilder, ids: torch.Tensor):
    params = [p for p in b.rack.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4)

    def step() -> None:
        logits = b.rack(ids[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def rss_child(fmt: str, a: argparse.Namespace) -> None:
    """Child mode: print the peak RSS (MB) of `--steps` training steps with a `fmt` trunk."""
    torch.set_num_threads(1)
    gc.collect()
    base = status_mb("VmRSS")  # interpreter, torch, bitsandbytes, peft: no model yet
    b = build(fmt, a)
    ids = batch(a)
    step = make_step(b, ids)
    gc.collect()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)  # hand back the fp32 weights quantized away
    except OSError:
        pass
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    for _ in range(a.steps):
        step()
    print(f"{status_mb('VmHWM') - base:.1f}")


def peak_rss(fmt: str, a: argparse.Namespace) -> float:
    args = [sys.executable, __file__, "--rss-child", fmt, *_shape_args(a)]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    return float(out.strip().splitlines()[-1])


def _shape_args(a: argparse.Namespace) -> list[str]:
    return [
        f"--d-model={a.d_model}",
        f"--stacks={a.stacks}",
        f"--seq={a.seq}",
        f"--batch={a.batch}",
        f"--rank={a.rank}",
        f"--steps={a.steps}",
    ]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = benchmark_parser(__doc__, "d=128, 3 stacks, 2 rounds")
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--stacks", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    p.add_argument("--steps", type=int, default=3, help="steps per round / in the RSS child")
    p.add_argument("--rss-child", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.quick:
        a.d_model, a.stacks, a.rounds, a.steps, a.seq = 128, 3, 2, 2, 64
    return a


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    if a.rss_child:
        rss_child(a.rss_child, a)
        return
    rec = record.start("quantization", a.record)
    torch.set_num_threads(1)
    ids = batch(a)
    builders = {fmt: build(fmt, a) for fmt in FORMATS}
    reference = trunk_output(builders["fp32"], ids)
    rows: dict[str, dict[str, float]] = {}
    for fmt, b in builders.items():
        stored, params = weight_bytes(torch.nn.ModuleList(b.trunk))
        err = trunk_output(b, ids) - reference
        rows[fmt] = {
            "bpp": stored / params,
            "params": params,
            "err": float(err.norm() / reference.norm()),
        }
    steps = {fmt: make_step(b, ids) for fmt, b in builders.items()}
    times: dict[str, list[float]] = {fmt: [] for fmt in FORMATS}
    for fmt in FORMATS:  # warm-up
        steps[fmt]()
    for _ in range(a.rounds):
        for fmt in FORMATS:
            for _ in range(a.steps):
                start = time.perf_counter()
                steps[fmt]()
                times[fmt].append(time.perf_counter() - start)
    del builders, steps
    gc.collect()
    for fmt in FORMATS:
        rows[fmt]["ms"] = 1000 * statistics.median(times[fmt])
        rows[fmt]["rss"] = peak_rss(fmt, a)
    fp32, bf16 = rows["fp32"], rows["bf16"]
    print(
        f"trunk: {a.stacks - 1} stacks x 1 block, d_model {a.d_model}, "
        f"{int(fp32['params']):,} linear weights; LoRA rank {a.rank} on the trunk; new stack "
        f"fp32; batch {a.batch} x seq {a.seq}; torch {torch.__version__}, 1 thread"
    )
    head = (
        f"{'format':<7}{'B/param':>9}{'vs fp32':>9}{'rel err':>10}{'step ms':>10}"
        f"{'vs fp32':>9}{'vs bf16':>9}{'peak MB':>9}"
    )
    print(head)
    print("-" * len(head))
    for fmt in FORMATS:
        r = rows[fmt]
        print(
            f"{fmt:<7}{r['bpp']:>9.3f}{fp32['bpp'] / r['bpp']:>8.2f}x{r['err']:>10.4f}"
            f"{r['ms']:>10.1f}{r['ms'] / fp32['ms']:>8.2f}x{r['ms'] / bf16['ms']:>8.2f}x"
            f"{r['rss']:>9.1f}"
        )
    nf4 = rows["nf4"]
    print(
        f"headline: NF4 trunk {nf4['bpp']:.3f} B/param, {fp32['bpp'] / nf4['bpp']:.2f}x smaller "
        f"than fp32; step time {nf4['ms'] / bf16['ms']:.2f}x a bf16 trunk's"
    )
    small = nf4["bpp"] <= 0.6 and fp32["bpp"] >= 6.0 * nf4["bpp"]
    rec.finish(GOAL, small and nf4["ms"] <= 1.5 * bf16["ms"])


GOAL = "NF4 trunk ≤ 0.6 B/param, ≥ 6x smaller than fp32, step ≤ 1.5x a bf16 trunk's"


if __name__ == "__main__":
    main()
