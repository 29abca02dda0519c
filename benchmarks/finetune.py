"""LoRA and QLoRA fine-tuning of one tiny Llama on a chat file: our CLI against a hand-written
transformers.Trainer + PEFT script (benchmarks/hf_trainer_baseline.py) with the same
hyperparameters and assistant-only labels, and ours again with packing.

Each run is its own process (peak RSS is that process's); the runs are interleaved, repeated
with a new seed each repetition (the same seed on both sides, so the batch order is a fresh draw
each time), and reported as medians. Speed is supervised (target) tokens per second of the
training loop (HF: train_runtime; ours: from the step-0 evaluation to the last training log
line), and of the whole process beside it. Ours runs padding-free by default (each batch's
examples end to end in rows no longer than its longest: the same examples and loss); the
"padded" row turns that off, so the two engines also meet on padded batches ("tokens run"
counts the padding each side ran). The data: Shakespeare lines as prompts, each answered by the
next 1 to 8 lines, so the lengths vary as chat data does.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import _record as record
from _common import benchmark_parser, run_child

HERE = Path(__file__).resolve().parent
HYPER = {"lr": 1e-3, "batch": 4, "rank": 16, "alpha": 32.0, "seq_len": 512}


def build_inputs(root: Path, n_train: int, n_eval: int) -> tuple[Path, Path, Path]:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from stackwise.chat.template import use_template
    from stackwise.data.corpus import shakespeare_documents
    from stackwise.data.tokenizer import byte_tokenizer

    tok = byte_tokenizer()
    use_template(tok, None)  # both sides render with the same template
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=256,
        intermediate_size=704,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    model_dir = root / "model"
    LlamaForCausalLM(cfg).save_pretrained(str(model_dir))
    tok.save_pretrained(str(model_dir))
    lines = [
        ln.strip()
        for _, text in shakespeare_documents(None)
        for ln in text.splitlines()
        if len(ln.strip()) > 20
    ]
    rng = random.Random(0)
    rows = []
    for _ in range(n_train + n_eval):
        i = rng.randrange(len(lines) - 9)
        rows.append(
            {"prompt": lines[i], "completion": "\n".join(lines[i + 1 : i + 1 + rng.randint(1, 8)])}
        )
    train, evals = root / "train.jsonl", root / "eval.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows[:n_train]))
    evals.write_text("".join(json.dumps(r) + "\n" for r in rows[n_train:]))
    return model_dir, train, evals


def run_offline(cmd: list[str]) -> tuple[str, float, float]:
    """(stdout, wall seconds, peak RSS in MB) of a run with W&B offline."""
    stdout, _, wall, rss = run_child(cmd, {**os.environ, "WANDB_MODE": "offline"})
    return stdout, wall, rss


def ours(
    model: Path, train: Path, evals: Path, out: Path, mode: str, layout: str, seed: int
) -> dict:
    config = {
        "data": {"packing": layout == "packed", "padding_free": layout != "padded"},
        "train": {
            "scheduler": "linear",
            "weight_decay": 0.0,
            "max_grad_norm": 1.0,
            "eval_every": 100000,
            "eval_batches": 1000,
            "seed": seed,
        },
        "logging": {"tensorboard": False, "progress_bar": "never", "log_every": 5},
        "sample": {"num_samples": 0},
    }
    cfg_file = out.parent / f"{out.name}.json"
    cfg_file.write_text(json.dumps(config))
    cmd = [
        sys.executable, "-m", "stackwise.cli", "finetune",
        "--model_name_or_path", str(model), "--train_file", str(train), "--eval_file", str(evals),
        "--use_lora", "True", "--load_in_4bit", str(mode == "qlora"),
        "--num_train_epochs", "1", "--learning_rate", str(HYPER["lr"]),
        "--train_batch_size", str(HYPER["batch"]), "--gradient_accumulation_steps", "1",
        "--lora_r", str(HYPER["rank"]), "--lora_alpha", str(HYPER["alpha"]),
        "--max_seq_length", str(HYPER["seq_len"]), "--bf16", "True",
        "--output_dir", str(out), "--config", str(cfg_file),
        "train.overwrite_output_dir=true",
    ]  # fmt: skip
    _, wall, rss = run_offline(cmd)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    start = next(r["time"] for r in rows if r["step"] == 0 and "val/loss" in r)
    end = [r["time"] for r in rows if "train/loss" in r][-1]
    state = json.loads((out / "history.json").read_text())
    return {
        "loop": end - start,
        "wall": wall,
        "rss": rss,
        "eval_loss": state["history"][-1]["loss"],
        "padded": state["tokens_seen"],
    }


def theirs(model: Path, train: Path, evals: Path, out: Path, mode: str, seed: int) -> dict:
    script = str(HERE / "hf_trainer_baseline.py")
    cmd = [sys.executable, script, str(model), str(train), str(evals), str(out), mode, str(seed)]
    stdout, wall, rss = run_offline(cmd)
    result = json.loads(stdout.strip().splitlines()[-1])
    return {
        "loop": result["train_runtime"],
        "wall": wall,
        "rss": rss,
        "eval_loss": result["eval_loss"],
        "padded": result["padded_tokens"],
        "supervised": result["supervised_tokens"],
    }


def supervised_tokens(model: Path, train: Path) -> int:
    """Target tokens in one epoch under our labels (the baseline reports its own count)."""
    from stackwise.chat.data import ChatStats, examples_of
    from stackwise.chat.template import use_template
    from stackwise.config import DataConfig
    from stackwise.hf.load import load_tokenizer
    from stackwise.plan import spec_of
    from stackwise.spec import DataSpec

    tok = load_tokenizer(str(model), False)
    use_template(tok, None)
    rows = [json.loads(x) for x in train.read_text().splitlines()]
    stats = ChatStats()
    data = DataConfig(mode="instruction", files=[str(train)], seq_len=HYPER["seq_len"])
    examples_of(rows, tok, spec_of(data, DataSpec), stats)
    return stats.supervised


def plan(
    root: Path, model: Path, train: Path, evals: Path, seed: int
) -> list[tuple[str, Callable[[], dict]]]:
    """One repetition's runs, in the order they run."""

    def mine(mode: str, layout: str) -> Callable[[], dict]:
        out = root / f"o-{mode}-{layout}"
        return lambda: ours(model, train, evals, out, mode, layout, seed)

    def hf(mode: str) -> Callable[[], dict]:
        return lambda: theirs(model, train, evals, root / f"h-{mode}", mode, seed)

    return [
        ("ours lora", mine("lora", "free")),
        ("HF Trainer lora", hf("lora")),
        ("ours lora padded", mine("lora", "padded")),
        ("ours lora packed", mine("lora", "packed")),
        ("ours qlora", mine("qlora", "free")),
        ("HF Trainer qlora", hf("qlora")),
        ("ours qlora packed", mine("qlora", "packed")),
    ]


def main() -> None:
    parser = benchmark_parser(__doc__, "60 training rows, one repetition")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    rec = record.start("finetune", args.record)
    n_train, reps = (60, 1) if args.quick else (480, args.reps)
    root = Path(tempfile.mkdtemp(prefix="sw-finetune-"))
    model, train, evals = build_inputs(root, n_train, 40)
    ours_tokens = supervised_tokens(model, train)
    runs: dict[str, list[dict]] = {}
    for rep in range(reps):
        for name, fn in plan(root, model, train, evals, rep):
            runs.setdefault(name, []).append(fn())
            print(f"rep {rep + 1}/{reps} {name}: {runs[name][-1]}", file=sys.stderr, flush=True)
    keys = ("loop", "wall", "rss", "eval_loss", "padded")
    med = {n: {k: statistics.median(r[k] for r in rs) for k in keys} for n, rs in runs.items()}
    their_tokens = runs["HF Trainer lora"][0]["supervised"]
    speed = report(med, ours_tokens, their_tokens, n_train, reps)
    rec.finish(GOAL, goal_met(med, speed))


GOAL = (
    "LoRA ≥ 1.0x HF Trainer's tokens/s at ≤ its peak RSS and eval loss within 0.01; packing ≥ 1.5x"
)


def goal_met(med: dict, speed: dict) -> bool:
    ours, theirs = med["ours lora"], med["HF Trainer lora"]
    return (
        speed["ours lora"] >= speed["HF Trainer lora"]
        and ours["rss"] <= theirs["rss"]
        and abs(ours["eval_loss"] - theirs["eval_loss"]) <= 0.01
        and speed["ours lora packed"] >= 1.5 * speed["ours lora"]
    )


def report(med: dict, ours_tokens: int, their_tokens: int, n_train: int, reps: int) -> dict:
    """Prints the table and the headline; returns each run's loop tokens/s."""
    print(
        f"{n_train} chat rows, 1 epoch, batch {HYPER['batch']}, LoRA r{HYPER['rank']} "
        f"all-linear, bf16 autocast; target tokens: ours {ours_tokens:,}, HF script "
        f"{their_tokens:,}; medians of {reps} interleaved reps, seeds 0..{reps - 1}"
    )
    print(
        f"{'run':<20} {'tok/s loop':>11} {'tok/s e2e':>10} {'tokens run':>11} "
        f"{'peak RSS MB':>12} {'eval loss':>10}"
    )
    speed = {}
    for name, m in med.items():
        tokens = their_tokens if name.startswith("HF") else ours_tokens
        speed[name] = tokens / m["loop"]
        print(
            f"{name:<20} {speed[name]:>11,.0f} {tokens / m['wall']:>10,.0f} {m['padded']:>11,.0f} "
            f"{m['rss']:>12,.0f} {m['eval_loss']:>10.4f}"
        )
    for mode in ("lora", "qlora"):
        ours, theirs, packed = f"ours {mode}", f"HF Trainer {mode}", f"ours {mode} packed"
        print(
            f"{mode}: ours / HF Trainer tokens/s {speed[ours] / speed[theirs]:.2f}x, peak RSS "
            f"{med[ours]['rss'] / med[theirs]['rss']:.2f}x; packing speed-up "
            f"{speed[packed] / speed[ours]:.2f}x"
        )
    print(
        "lora, padded batches on both sides: ours / HF Trainer tokens/s "
        f"{speed['ours lora padded'] / speed['HF Trainer lora']:.2f}x"
    )
    print(
        "headline: ours LoRA / HF Trainer LoRA supervised tokens/s = "
        f"{speed['ours lora'] / speed['HF Trainer lora']:.2f}x, with packing "
        f"{speed['ours lora packed'] / speed['HF Trainer lora']:.2f}x"
    )
    return speed


if __name__ == "__main__":
    main()
