"""How much memory FSDP2 sharding saves per process against DDP, at 2 processes.

Each placement trains the same rack for a few steps under `torchrun --nproc_per_node 2`. Every
process measures what it holds, tensor by tensor, at the step's fullest moment: its parameters
(a shard's local part under FSDP), their gradients (measured right before the optimizer step)
and the optimizer state (after it). DDP's gradient buckets, a second copy of the gradients, are
not counted: the comparison is of parameters, gradients and optimizer state only, which
favours DDP. Beside them: the processes' peak RSS up to the last optimizer step (training)
and at the end (a sharded run then gathers the whole model onto rank 0 to save it), and each
run's wall time; the runs' losses must agree (the same training, placed three ways). Runs
alternate A B A B.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _common as bench
import _record as record

PLACEMENTS = {
    "ddp": ["parallel.strategy=ddp"],
    "fsdp full_shard": ["parallel.strategy=fsdp", "parallel.sharding=full_shard"],
    "fsdp shard_grad_op": ["parallel.strategy=fsdp", "parallel.sharding=shard_grad_op"],
}
# 57M parameters: its training state (~0.9 GB a process under DDP) stands out of the ~0.7 GB
# every process holds for its libraries, so peak RSS shows the saving too
MODEL = {"d_model": 768, "n_heads": 12, "n_stacks": 4, "blocks_per_stack": 2, "max_seq_len": 64}
STEPS = 4
BATCH = 8
WORLD = 2


def local_bytes(tensor: Any) -> int:
    """Bytes this process holds of `tensor` (a DTensor's local shard)."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def worker(out: str, overrides: list[str]) -> None:
    """One process of a placement's run: trains, measures, writes its JSON row."""
    import torch

    import stackwise
    from stackwise.config import load_config
    from stackwise.strategies.standard import StandardTrainingStrategy
    from stackwise.train.peak_memory import own_peak_rss_mb
    from stackwise.train.strategy import register_training_strategy

    seen: dict[str, float] = {}

    @register_training_strategy("measured")
    class Measured(StandardTrainingStrategy):
        def update(self, model: Any, optimizer: Any, scheduler: Any) -> None:
            params = list(self.context.raw_model.parameters())
            seen["params"] = sum(local_bytes(p) for p in params)
            seen["grads"] = sum(local_bytes(p.grad) for p in params if p.grad is not None)
            start = time.perf_counter()
            super().update(model, optimizer, scheduler)
            seen.setdefault("first_update", time.perf_counter() - start)
            seen["rss_train_mb"] = own_peak_rss_mb() or 0.0  # not torchrun's agent's size
            state = optimizer.optimizer.state.values()
            seen["optimizer"] = sum(
                local_bytes(v) for s in state for v in s.values() if torch.is_tensor(v)
            )

    torch.set_num_threads(1)
    config = load_config(None, ["objective.name=clm", *bench.CLM_RESETS, *overrides])
    start = time.perf_counter()
    result = stackwise.train_from_config(config, quiet=True, strategy="measured")
    wall = time.perf_counter() - start
    rank = result.trainer.accelerator.process_index
    row = {
        **seen,
        "wall": wall,
        "rss_end_mb": own_peak_rss_mb() or 0.0,
        "loss": result.state.history[-1]["loss"],
    }
    Path(f"{out}.{rank}").write_text(json.dumps(row))


def run(name: str, root: Path, rep: int) -> dict[str, Any]:
    """Both processes' rows of one placement's run."""
    out = root / f"{name.replace(' ', '_')}-{rep}"
    config = [
        *(f"model.{k}={v}" for k, v in MODEL.items()),
        "data.tokenizer=char", "data.seq_len=64", f"train.max_steps={STEPS}",
        f"train.batch_size={BATCH}", "train.mixed_precision=no", "train.eval_every=1000",
        "sample.num_samples=0", f"train.output_dir={out}", "train.overwrite_output_dir=true",
        "logging.console=false", "logging.progress_bar=never", "logging.tensorboard=false",
        *PLACEMENTS[name],
    ]  # fmt: skip
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd += ["--nproc_per_node", str(WORLD), __file__, "--worker", str(out), *config]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parent)}
    bench.run_child(cmd, env)
    rows = [json.loads(Path(f"{out}.{r}").read_text()) for r in range(WORLD)]
    return {k: max(r[k] for r in rows) for k in rows[0]}  # the fuller process


def main() -> None:
    args = bench.quick_flag(__doc__)
    rec = record.start("sharding", args.record)
    bench.pin_threads()  # the table's machine line; each process pins its own
    reps = 1 if args.quick else 2
    names = list(PLACEMENTS)
    found: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(reps):  # A B A B
            for name in names:
                found[name].append(run(name, Path(tmp), rep))
    mb = 2**20
    print(f"# sharding: {WORLD} processes, gloo; {bench.machine_line()}")
    print(f"# rack {MODEL}, AdamW fp32, {STEPS} steps, batch {BATCH} x 64 chars per process")
    print(
        f"{'placement':<20}{'params MB':>10}{'grads MB':>10}{'optim MB':>10}{'total MB':>10}"
        f"{'x ddp':>7}{'RSS train MB':>14}{'RSS end MB':>12}{'s/run':>7}{'loss':>9}"
    )
    totals = {}
    for name in names:
        runs = found[name]
        row = runs[0]
        total = row["params"] + row["grads"] + row["optimizer"]
        totals[name] = total
        print(
            f"{name:<20}{row['params'] / mb:>10.2f}{row['grads'] / mb:>10.2f}"
            f"{row['optimizer'] / mb:>10.2f}{total / mb:>10.2f}{total / totals['ddp']:>7.3f}"
            f"{statistics.median(r['rss_train_mb'] for r in runs):>14.0f}"
            f"{statistics.median(r['rss_end_mb'] for r in runs):>12.0f}"
            f"{statistics.median(r['wall'] for r in runs):>7.1f}{row['loss']:>9.4f}"
        )
    losses = [found[n][0]["loss"] for n in names]
    agree = max(losses) - min(losses)
    ratio = totals["fsdp full_shard"] / totals["ddp"]
    verdict = "MET" if ratio <= 0.55 else "MISSED"
    print(f"losses agree within {agree:.1e} (the same training, placed three ways)")
    print(
        f"headline: full_shard holds {ratio:.3f}x DDP's parameter+gradient+optimizer memory per "
        f"process at {WORLD} processes (goal <= 0.55: {verdict})"
    )
    rec.finish("full_shard ≤ 0.55x DDP's parameter+gradient+optimizer memory", ratio <= 0.55)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3:])
    else:
        main()
