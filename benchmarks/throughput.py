"""Training throughput: the stackwise Trainer against a plain PyTorch loop and transformers.Trainer.

Run from the repository root:

    .venv/bin/python benchmarks/throughput.py            # full run, several minutes
    .venv/bin/python benchmarks/throughput.py --quick    # smoke run, well under a minute

Five ways to train a causal model of the same size on the same random tokens, with the same
batch, sequence length, step counts and one CPU thread (torch.set_num_threads(1), --threads to
change it); all five use the same autocast (--precision; bf16 only where the CPU runs it
natively), torch.optim.AdamW (weight decay 0.1 on matrices only) and gradient clipping at 1.0.
Each runs at its own defaults: ours with torch's fused AdamW kernel (train.fused_adamw auto)
and train.compile auto (eager for runs this short), the others with the per-tensor AdamW that
they use on a CPU (nanoGPT enables fused AdamW on CUDA only):

  ours   stackwise.train.Trainer.train() on a clm Rack, built from a Config (defaults);
  compiled  ours with train.compile: true (each Block through one torch.compile'd function;
         compiling happens in the warm-up steps, outside the timed window);
  plain  a hand-written loop over the same Rack class: DataLoader, torch.autocast, shifted
         cross entropy, clip_grad_norm_, AdamW, nothing else;
  nanogpt  nanoGPT's model and training loop (karpathy/nanoGPT's model.py and train.py),
         rebuilt here from their description: LayerNorm without bias, learned positions, one
         qkv projection into SDPA, a 4x GELU MLP, a tied head, the loss inside forward; random
         windows of a token stream, the LR set each step, loss.item() each step. Same depth,
         width and heads as the rack (both parameter counts are printed).
         benchmarks/nanogpt_reference.py checks it against nanoGPT's own train.py.
  hf     transformers.Trainer.train() on a LlamaForCausalLM of the same shape (the rack's
         weights are loaded into it, so ours, plain and hf start from identical parameters).

What is timed, for all five alike: the wall time from the end of optimizer step `warmup` to the
end of step `warmup + steps`, read at the same point of each loop (a wrapper around
`Trainer.train_step` for ours, `on_step_end` callbacks for hf, a clock read after
`optimizer.zero_grad` for plain). It covers fetching and collating batches, forward, loss,
backward, clipping, the optimizer and scheduler, and the per-step bookkeeping of each loop; it
excludes model and trainer construction, the warm-up steps and anything after the last step.
Our trainer gets no validation set and `eval_every` > `max_steps`, so it never evaluates.

Repetitions are interleaved (ours, compiled, plain, nanogpt, hf, ours, ...) so that drifts
in the machine's load hit all five alike. Each repetition runs in a fresh child forked from this
process after the imports (`--in-process` turns that off), so every run starts from the same
clean heap, as a real training run does, instead of inheriting the allocator state left by the
run before it; each builds its own model and trainer. The table reports the median tokens/s per
method and the minor page faults per timed step (fresh memory the allocator had to map). The
last line printed is the headline.

Ours and plain run the same `Rack`, so both get its CPU attention core (fp32 SDPA for short bf16
sequences). Our Trainer also sets glibc's malloc thresholds (stackwise.train.hardware); a plain loop
does not, and `--plain-allocator` gives them to it too, to show what that part is worth
(`--nanogpt-allocator` the same for the nanoGPT-style loop).
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _common as bench
import _record as record
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from stackwise.config import Config, from_dict
from stackwise.io.lock import release_run_folder
from stackwise.io.trained import build_rack
from stackwise.model.hf import llama_config, llama_state_dict
from stackwise.model.rack import Rack
from stackwise.objectives import Specials, build_objective
from stackwise.pipeline import trainer_for

LR = 2e-3
BETAS = (0.9, 0.95)
WEIGHT_DECAY = 0.1
MAX_GRAD_NORM = 1.0
SEED = 0
PAD_ID, MASK_ID = 0, 1  # random tokens are drawn from [2, vocab) so no position is padding

METHODS = ("ours", "compiled", "plain", "nanogpt", "hf")
LABELS = {
    "ours": "stackwise Trainer",
    "compiled": "stackwise, compile",
    "plain": "plain PyTorch loop",
    "nanogpt": "nanoGPT-style GPT",
    "hf": "transformers Trainer",
}


@dataclass(frozen=True)
class Shape:
    name: str
    vocab_size: int
    n_stacks: int = 2
    blocks_per_stack: int = 2
    n_heads: int = 4
    d_model: int = 128
    seq_len: int = 64
    batch_size: int = 12

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len


@dataclass(frozen=True)
class Plan:
    reps: int
    warmup: int
    steps: int

    @property
    def total_steps(self) -> int:
        return self.warmup + self.steps


PRECISION = "bf16"  # set by main() from --precision before any run is forked
THREADS = 1  # torch threads per run, set by main() from --threads

SHAPES = (Shape("vocab 65", 65), Shape("vocab 4096", 4096))


class TokenRows(Dataset[dict[str, torch.Tensor]]):
    """Rows of a (N, L) token tensor as {"input_ids": row}; with `labels`, also {"labels": row}."""

    def __init__(self, tokens: torch.Tensor, labels: bool = False) -> None:
        self.tokens = tokens
        self.labels = labels

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        row = self.tokens[i]
        return {"input_ids": row, "labels": row} if self.labels else {"input_ids": row}


def random_tokens(shape: Shape, plan: Plan) -> torch.Tensor:
    """Exactly one epoch of data for warmup + timed steps, the same for every method."""
    g = torch.Generator().manual_seed(1234)
    rows = shape.batch_size * plan.total_steps
    return torch.randint(2, shape.vocab_size, (rows, shape.seq_len), generator=g)


def make_config(
    shape: Shape,
    plan: Plan,
    output_dir: Path,
    compile: bool | None = None,
    objective: dict[str, Any] | None = None,
) -> Config:
    return from_dict(
        {
            "model": {
                "vocab_size": shape.vocab_size,
                "d_model": shape.d_model,
                "n_heads": shape.n_heads,
                "n_stacks": shape.n_stacks,
                "blocks_per_stack": shape.blocks_per_stack,
                "max_seq_len": shape.seq_len,
            },
            "data": {"seq_len": shape.seq_len},
            "objective": objective or {"name": "clm"},
            "train": {
                "seed": SEED,
                "max_steps": plan.total_steps,
                "batch_size": shape.batch_size,
                "lr": LR,
                "betas": list(BETAS),
                "weight_decay": WEIGHT_DECAY,
                "max_grad_norm": MAX_GRAD_NORM,
                "mixed_precision": PRECISION,
                "eval_every": plan.total_steps + 1,
                "compile": compile,
                **bench.fresh_output(output_dir),
            },
            "logging": bench.quiet_logging(),
        },
        origin="benchmark",
    )


def fresh_rack(config: Config, vocab_size: int) -> Rack:
    torch.manual_seed(SEED)
    return build_rack(config, vocab_size)


@dataclass(frozen=True)
class RunResult:
    tokens_per_s: float
    faults_per_step: float  # minor page faults per timed step (fresh memory touched)


class StepClock:
    """Clock and page-fault count read at the end of every optimizer step."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.faults: list[int] = []

    def tick(self) -> None:
        if torch.cuda.is_initialized():  # a GPU step is over when its kernels are
            torch.cuda.synchronize()
        self.faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)
        self.times.append(time.perf_counter())

    def result(self, shape: Shape, plan: Plan) -> RunResult:
        """Steps warmup+1 .. warmup+steps: from the end of step `warmup` to the end of the last."""
        if len(self.times) != plan.total_steps:
            raise RuntimeError(f"expected {plan.total_steps} steps, saw {len(self.times)}")
        first = max(plan.warmup, 1) - 1
        steps = plan.total_steps - 1 - first
        elapsed = self.times[-1] - self.times[first]
        return RunResult(
            tokens_per_s=steps * shape.tokens_per_step / elapsed,
            faults_per_step=(self.faults[-1] - self.faults[first]) / steps,
        )


# -- (a) the stackwise Trainer ----------------------------------------------------------------


def run_ours(
    shape: Shape, plan: Plan, tokens: torch.Tensor, workdir: Path, compile: bool | None = None
) -> RunResult:
    config = make_config(shape, plan, workdir / ("compiled" if compile else "ours"), compile)
    rack = fresh_rack(config, shape.vocab_size)
    specials = Specials(vocab_size=shape.vocab_size, pad_id=PAD_ID, mask_id=MASK_ID)
    objective = build_objective(config, specials)
    trainer = trainer_for(config, rack, objective, TokenRows(tokens), val_data=None)
    clock = StepClock()
    step = trainer.optimizer_step

    def timed_step(batches: Iterator[dict[str, torch.Tensor]]) -> torch.Tensor | None:
        loss = step(batches)
        clock.tick()
        return loss

    trainer.optimizer_step = timed_step  # type: ignore[method-assign]
    trainer.train()
    release_run_folder(trainer.output_dir)  # the forked child skips atexit: free it as a run does
    return clock.result(shape, plan)


# -- (b) a plain PyTorch loop over the same Rack ----------------------------------------------


def adamw_groups(model: nn.Module) -> list[dict[str, Any]]:
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": WEIGHT_DECAY},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]


def run_plain(shape: Shape, plan: Plan, tokens: torch.Tensor, workdir: Path) -> RunResult:
    config = make_config(shape, plan, workdir / "plain")
    return plain_loop(fresh_rack(config, shape.vocab_size), shape, plan, tokens)


def plain_loop(model: nn.Module, shape: Shape, plan: Plan, tokens: torch.Tensor) -> RunResult:
    """DataLoader, autocast, shifted cross entropy, clipping, AdamW: nothing else."""
    model.train()
    opt = torch.optim.AdamW(adamw_groups(model), lr=LR, betas=BETAS, eps=1e-8)
    loader = DataLoader(
        TokenRows(tokens),
        batch_size=shape.batch_size,
        shuffle=True,
        drop_last=True,
        generator=torch.Generator().manual_seed(SEED),
    )
    clock = StepClock()
    for batch in loader:
        ids = batch["input_ids"]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=PRECISION == "bf16"):
            logits = model(ids)
        loss = F.cross_entropy(
            logits[:, :-1].float().reshape(-1, shape.vocab_size), ids[:, 1:].reshape(-1)
        )
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
        opt.step()
        opt.zero_grad(set_to_none=True)
        clock.tick()
    return clock.result(shape, plan)


# -- (d) nanoGPT's model and loop, rebuilt here ------------------------------------------------


class BiaslessLayerNorm(nn.Module):
    """LayerNorm with a weight and no bias (nanoGPT trains with bias=False)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, None, 1e-5)


class GPTBlock(nn.Module):
    """The GPT-2 layer as nanoGPT writes it: one qkv projection split into heads, SDPA,
    a 4x GELU MLP, dropout modules (p = 0) after attention and MLP, no biases."""

    def __init__(self, d: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.ln_1, self.ln_2 = BiaslessLayerNorm(d), BiaslessLayerNorm(d)
        self.c_attn = nn.Linear(d, 3 * d, bias=False)
        self.attn_proj = nn.Linear(d, d, bias=False)
        self.c_fc = nn.Linear(d, 4 * d, bias=False)
        self.gelu = nn.GELU()
        self.mlp_proj = nn.Linear(4 * d, d, bias=False)
        self.attn_drop, self.resid_drop, self.mlp_drop = (nn.Dropout(0.0) for _ in range(3))

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)
        q, k, v = (t.view(b, n, self.n_heads, d // self.n_heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, is_causal=True)
        return self.resid_drop(self.attn_proj(y.transpose(1, 2).contiguous().view(b, n, d)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.ln_1(x))
        return x + self.mlp_drop(self.mlp_proj(self.gelu(self.c_fc(self.ln_2(x)))))


class GPT(nn.Module):
    """Token and learned position embeddings, GPT blocks, a final LayerNorm, a head tied to the
    token embedding; forward returns the logits and the loss over every position."""

    def __init__(self, shape: Shape) -> None:
        super().__init__()
        d, layers = shape.d_model, shape.n_stacks * shape.blocks_per_stack
        self.wte = nn.Embedding(shape.vocab_size, d)
        self.wpe = nn.Embedding(shape.seq_len, d)
        self.drop = nn.Dropout(0.0)
        self.blocks = nn.ModuleList(GPTBlock(d, shape.n_heads) for _ in range(layers))
        self.ln_f = BiaslessLayerNorm(d)
        self.lm_head = nn.Linear(d, shape.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):  # GPT-2's scaled residual projections
                nn.init.normal_(p, std=0.02 / (2 * layers) ** 0.5)
            elif p.ndim == 2:
                nn.init.normal_(p, std=0.02)

    def forward(
        self, ids: torch.Tensor, targets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits, loss), as nanoGPT's forward returns them."""
        positions = torch.arange(ids.shape[1], dtype=torch.long, device=ids.device)
        x = self.drop(self.wte(ids) + self.wpe(positions))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        flat = logits.view(-1, logits.shape[-1])
        return logits, F.cross_entropy(flat, targets.view(-1), ignore_index=-1)


def nanogpt_groups(model: nn.Module) -> list[dict[str, Any]]:
    """nanoGPT's two groups: every matrix decays (the tied embedding once), nothing else."""
    params = list(model.parameters())  # parameters() yields a tied tensor once
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": WEIGHT_DECAY},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def run_nanogpt(shape: Shape, plan: Plan, tokens: torch.Tensor, workdir: Path) -> RunResult:
    """nanoGPT's training loop: windows at random offsets of one token stream read from a
    uint16 file (x and the shifted y), the LR set on every group each step, loss.item() every
    step (its log_interval=1), clipping, AdamW with its defaults on a CPU (not fused)."""
    torch.manual_seed(SEED)
    model = GPT(shape)
    model.train()
    opt = torch.optim.AdamW(nanogpt_groups(model), lr=LR, betas=BETAS)
    stream_file = workdir / f"nanogpt-tokens-{os.getpid()}.bin"
    tokens.flatten().numpy().astype(np.uint16).tofile(stream_file)
    size, n = shape.batch_size, shape.seq_len

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        """As nanoGPT reads its train.bin: a fresh memmap per batch, int64 rows."""
        stream = np.memmap(stream_file, dtype=np.uint16, mode="r")
        starts = torch.randint(len(stream) - n, (size,))
        x = torch.stack([torch.from_numpy(stream[i : i + n].astype(np.int64)) for i in starts])
        y = [torch.from_numpy(stream[i + 1 : i + 1 + n].astype(np.int64)) for i in starts]
        return x, torch.stack(y)

    clock = StepClock()
    x, y = batch()
    for step in range(plan.total_steps):
        for group in opt.param_groups:
            group["lr"] = LR * min(1.0, (step + 1) / 100)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=PRECISION == "bf16"):
            # the logits stay referenced until the next step's replace them, as in nanoGPT's
            # loop: at vocab 4096 that is a 12 MB buffer the allocator cannot reuse
            _logits, loss = model(x, y)  # _logits: kept alive on purpose
        x, y = batch()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
        clock.tick()
    stream_file.unlink()
    return clock.result(shape, plan)


# -- (c) transformers.Trainer on the equivalent LlamaForCausalLM ------------------------------


def run_hf(shape: Shape, plan: Plan, tokens: torch.Tensor, workdir: Path) -> RunResult:
    # imported by main() before any run is forked; here they only bind the names
    from transformers import LlamaForCausalLM, TrainerCallback, TrainingArguments
    from transformers import Trainer as HFTrainer
    from transformers.trainer_callback import PrinterCallback

    config = make_config(shape, plan, workdir / "hf")
    rack = fresh_rack(config, shape.vocab_size)
    model = LlamaForCausalLM(llama_config(rack))
    missing, unexpected = model.load_state_dict(llama_state_dict(rack), strict=False)
    if unexpected or any(k != "lm_head.weight" for k in missing):
        raise RuntimeError(f"weight mapping failed: missing {missing}, unexpected {unexpected}")
    if model.config._attn_implementation != "sdpa":
        raise RuntimeError(f"expected sdpa attention, got {model.config._attn_implementation}")

    clock = StepClock()

    class OnStepEnd(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            clock.tick()

    args = TrainingArguments(
        output_dir=str(workdir / "hf"),
        max_steps=plan.total_steps,
        per_device_train_batch_size=shape.batch_size,
        learning_rate=LR,
        adam_beta1=BETAS[0],
        adam_beta2=BETAS[1],
        adam_epsilon=1e-8,
        weight_decay=WEIGHT_DECAY,
        max_grad_norm=MAX_GRAD_NORM,
        optim="adamw_torch",  # torch's AdamW, per tensor on a CPU (as plain and nanogpt)
        bf16=PRECISION == "bf16",
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        eval_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        dataloader_pin_memory=False,
        dataloader_drop_last=True,
        seed=SEED,
    )
    trainer = HFTrainer(
        model=model,
        args=args,
        train_dataset=TokenRows(tokens, labels=True),
        callbacks=[OnStepEnd()],
    )
    trainer.remove_callback(PrinterCallback)  # it prints the end-of-training summary
    trainer.train()
    return clock.result(shape, plan)


RUNNERS: dict[str, Callable[[Shape, Plan, torch.Tensor, Path], RunResult]] = {
    "ours": run_ours,
    "compiled": lambda *args: run_ours(*args, compile=True),
    "plain": run_plain,
    "nanogpt": run_nanogpt,
    "hf": run_hf,
}


# -- driver -----------------------------------------------------------------------------------


# -- what stackwise does on the CPU that a plain loop does not ------------------------------


def with_our_allocator() -> None:
    """--plain-allocator / --nanogpt-allocator: give that loop the Trainer's malloc settings
    too, to show how much of ours' lead over it comes from them
    (stackwise.train.hardware.keep_freed_memory)."""
    from stackwise.train.hardware import keep_freed_memory

    if not keep_freed_memory():
        raise RuntimeError("mallopt is unavailable here (not glibc?)")


def run_once(
    method: str, shape: Shape, plan: Plan, workdir: Path, patches: tuple[str, ...]
) -> RunResult:
    """One repetition of one method in this process."""
    torch.set_num_threads(THREADS)
    gc.collect()
    if f"{method}-allocator" in patches:  # plain-allocator, nanogpt-allocator
        with_our_allocator()
    result = RUNNERS[method](shape, plan, random_tokens(shape, plan), workdir)
    if torch.get_num_threads() != THREADS:
        raise RuntimeError(f"{method} changed the thread count to {torch.get_num_threads()}")
    return result


def run_forked(
    method: str, shape: Shape, plan: Plan, workdir: Path, patches: tuple[str, ...]
) -> RunResult:
    """One repetition in a fresh forked child (see benchmarks/_forked.py)."""
    return bench.in_fork(f"{method} run", run_once, method, shape, plan, workdir, patches)


Results = dict[str, list[RunResult]]


def measure(
    shape: Shape, plan: Plan, workdir: Path, isolate: bool, patches: tuple[str, ...]
) -> Results:
    """Interleaved repetitions (ours, plain, hf, ours, ...): one RunResult per method and rep."""
    run = run_forked if isolate else run_once
    results: Results = {m: [] for m in METHODS}
    for rep in range(plan.reps):
        line = []
        for method in METHODS:
            r = run(method, shape, plan, workdir, patches)
            results[method].append(r)
            line.append(f"{method} {r.tokens_per_s:7,.0f} tok/s {r.faults_per_step:6,.0f} flt")
        print(f"  {shape.name:<10} rep {rep + 1}/{plan.reps}: " + "  ".join(line), flush=True)
    return results


def median_tps(results: Results, method: str) -> float:
    return statistics.median(r.tokens_per_s for r in results[method])


def ratio_of_medians(results: Results, a: str, b: str) -> float:
    return median_tps(results, a) / median_tps(results, b)


def paired_ratio(results: Results, a: str, b: str) -> float:
    """Median over repetitions of a/b within one repetition (runs that are neighbours in time)."""
    pairs = zip(results[a], results[b], strict=True)
    return statistics.median(x.tokens_per_s / y.tokens_per_s for x, y in pairs)


OURS = ("ours", "compiled")
RIVALS = ("plain", "nanogpt", "hf")  # the ratio columns: ours (and compiled) over each


def rivals() -> tuple[str, ...]:
    return tuple(r for r in RIVALS if r in METHODS)


def table(all_results: dict[str, Results], shapes: tuple[Shape, ...]) -> str:
    ratios = "".join(f" {'ours/' + r:>12}" for r in rivals())
    head = (
        f"{'shape':<11} {'method':<21} {'median tok/s':>12} {'min..max tok/s':>15} "
        f"{'ms/step':>7} {'faults/step':>11}{ratios}"
    )
    rows = [head, "-" * len(head)]
    for shape in shapes:
        res = all_results[shape.name]
        for method in METHODS:
            tps = [r.tokens_per_s for r in res[method]]
            med = statistics.median(tps)
            faults = statistics.median(r.faults_per_step for r in res[method])
            spread = f"{min(tps):,.0f}..{max(tps):,.0f}"
            cells = ""
            if method in OURS:
                cells = "".join(f" {ratio_of_medians(res, method, r):>12.3f}" for r in rivals())
            line = (
                f"{shape.name:<11} {LABELS[method]:<21} {med:>12,.0f} {spread:>15} "
                f"{1000 * shape.tokens_per_step / med:>7.1f} {faults:>11,.0f}{cells}"
            )
            rows.append(line.rstrip())
        if "ours" not in METHODS:
            continue
        paired = "".join(f" {paired_ratio(res, 'ours', r):>12.3f}" for r in rivals())
        rows.append(f"{shape.name:<11} {'ours, paired per rep':<21} {'':>47}{paired}")
    return "\n".join(rows)


def headline(all_results: dict[str, Results], shapes: tuple[Shape, ...]) -> str:
    parts = []
    mine_all = [m for m in OURS if m in METHODS]
    for mine, rival in [(m, r) for m in mine_all for r in rivals()]:
        each = ", ".join(
            f"{ratio_of_medians(all_results[s.name], mine, rival):.2f}" for s in shapes
        )
        parts.append(f"{mine}/{rival} = {each}")
    names = ", ".join(s.name for s in shapes)
    return f"headline ({names}): " + "; ".join(parts)


def nanogpt_goal(all_results: dict[str, Results], shapes: tuple[Shape, ...]) -> tuple:
    """Issue 34's goal, (text, met), where the run has nanogpt and ours or compiled; else
    ("—", None)."""
    bars = {m: bar for m, bar in (("ours", 1.1), ("compiled", 1.3)) if m in METHODS}
    if "nanogpt" not in METHODS or not bars:
        return "—", None
    met = all(
        ratio_of_medians(all_results[s.name], m, "nanogpt") >= bar
        for s in shapes
        for m, bar in bars.items()
    )
    return " and ".join(f"{m}/nanogpt ≥ {bar}" for m, bar in bars.items()) + " at every shape", met


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = bench.benchmark_parser(__doc__, "smoke run: 2 reps of 2 + 5 steps")
    p.add_argument("--reps", type=int, default=None, help="repetitions per method (default 7)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps per rep (default 5)")
    p.add_argument("--steps", type=int, default=None, help="timed steps per rep (default 30)")
    p.add_argument(
        "--in-process",
        action="store_true",
        help="run every repetition in this process instead of a forked child per run",
    )
    p.add_argument(
        "--plain-allocator",
        action="store_true",
        help="apply the Trainer's glibc malloc settings to the plain loop as well",
    )
    p.add_argument(
        "--nanogpt-allocator",
        action="store_true",
        help="apply them to the nanoGPT-style loop as well (nanoGPT's own code does not set "
        "them; nanogpt_reference.py --allocators kept does the same against its train.py)",
    )
    p.add_argument(
        "--precision",
        choices=("auto", "bf16", "no"),
        default="auto",
        help="autocast for all five; auto = bf16 where this CPU runs it natively, else fp32",
    )
    p.add_argument("--threads", type=int, default=1, help="torch threads per run (default 1)")
    p.add_argument(
        "--methods",
        default=",".join(METHODS),
        help=f"comma-separated subset of {', '.join(METHODS)} (default: all)",
    )
    args = p.parse_args(argv)
    args.methods = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    unknown = [m for m in args.methods if m not in METHODS]
    if unknown or not args.methods:
        p.error(f"--methods: unknown {unknown}; choose from {', '.join(METHODS)}")
    if args.threads < 1:
        p.error("--threads must be at least 1")
    chosen = {"plain-allocator": args.plain_allocator, "nanogpt-allocator": args.nanogpt_allocator}
    args.patch = [name for name, on in chosen.items() if on]
    if args.patch and args.in_process:
        p.error(f"--{args.patch[0]} changes the whole process; it needs the forked runs")
    return args


def shape_line(shape: Shape, plan: Plan, folder: Path) -> str:
    """The shape and both models' parameter counts (the rack's config is written to `folder`)."""
    config = make_config(shape, plan, folder)
    rack = sum(p.numel() for p in fresh_rack(config, shape.vocab_size).parameters())
    gpt = GPT(shape)
    return (
        f"{shape.name}: {shape.n_stacks}x{shape.blocks_per_stack} layers, "
        f"d_model {shape.d_model}, {shape.n_heads} heads, seq {shape.seq_len}, "
        f"batch {shape.batch_size}; parameters: rack {rack:,}, nanoGPT-style "
        f"{sum(p.numel() for p in gpt.parameters()):,} (MLP width "
        f"{gpt.blocks[0].c_fc.out_features})"
    )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    rec = record.start("throughput", args.record)
    quick = Plan(reps=2, warmup=2, steps=5)
    full = Plan(reps=7, warmup=5, steps=30)
    base = quick if args.quick else full
    plan = Plan(
        reps=args.reps or base.reps,
        warmup=base.warmup if args.warmup is None else args.warmup,
        steps=args.steps or base.steps,
    )
    if plan.reps < 1 or plan.steps < 2 or plan.warmup < 0:
        sys.exit("need reps >= 1, steps >= 2, warmup >= 0")

    global PRECISION, THREADS, METHODS
    METHODS, THREADS = args.methods, args.threads
    from stackwise.train.hardware import resolve_precision

    PRECISION = resolve_precision(args.precision, torch.device("cpu"))
    bench.pin_threads()
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)  # an optional-kernel notice
    import transformers
    import transformers.trainer  # the slow import, done once before the runs are forked

    transformers.logging.set_verbosity_error()

    malloc_env = " ".join(f"{k}={v}" for k, v in os.environ.items() if k.startswith("MALLOC_"))
    print(
        f"{bench.machine_line(f'precision {PRECISION} (--precision {args.precision})')}; "
        f"transformers {transformers.__version__}; malloc env: {malloc_env or 'default'}"
    )
    print(
        f"plan: {THREADS} torch thread(s) per run; {plan.reps} interleaved reps x "
        f"({plan.warmup} warmup + {plan.steps} timed steps) "
        "per method; timed: end of step warmup .. end of the last step; "
        + ("all runs in one process" if args.in_process else "each run in a fresh forked child")
        + "".join(f"; {name.split('-')[0]} loop with our allocator settings" for name in args.patch)
    )
    all_results: dict[str, Results] = {}
    with tempfile.TemporaryDirectory(prefix="stackwise-bench-") as tmp:
        for shape in SHAPES:
            print(shape_line(shape, plan, Path(tmp) / "count"), flush=True)
            all_results[shape.name] = measure(
                shape, plan, Path(tmp), isolate=not args.in_process, patches=tuple(args.patch)
            )
    print()
    print(table(all_results, SHAPES))
    print()
    print(headline(all_results, SHAPES))
    rec.finish(*nanogpt_goal(all_results, SHAPES))


if __name__ == "__main__":
    main()
