"""UnifiedTrainer on a toy task: the same layers-and-DataLoader call trains layer by layer,
block by block, fused (the stages, then the whole rack together) and end to end with QLoRA.

    python examples/unified_trainer_example.py            # a minute or so on a CPU
    python examples/unified_trainer_example.py --steps 8  # a quick look

The data is rows of one repeating pattern at random shifts, as token ids (no tokenizer: the ids
are the vocabulary); any DataLoader yielding {"input_ids": (batch, length)} works the same way.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from stackwise import TrainingConfig, UnifiedTrainer

MODES: dict[str, dict[str, Any]] = {
    "layerwise": {"mode": "layerwise"},
    "blockwise": {"mode": "blockwise", "block_size": 2, "time_step_masking": True},
    "fused": {"mode": "fused", "block_size": 2, "progressive": {"joint_tuning_steps": 20}},
    "rackwise": {
        "strategy": "end_to_end",
        "end_to_end_scope": "rackwise",
        "quantization_enabled": True,
        "quantization_type": "nf_fp8",
        "qlora_enabled": True,
        "qlora_rank": 8,
    },
}


def toy_loader(rows: int = 256, length: int = 32, period: int = 10) -> DataLoader:
    base = torch.arange(length) % period
    shifts = torch.randint(0, period, (rows,), generator=torch.Generator().manual_seed(0))
    data = [{"input_ids": torch.roll(base, int(s))} for s in shifts]
    return DataLoader(data, batch_size=32)


def main(
    steps: int = 200, d_model: int = 64, output_dir: str | Path | None = None, quiet: bool = False
) -> dict[str, Any]:
    """Train four copies of the same four layers, one per way of training; returns each
    UnifiedResult (per-stage losses, the trained rack, where the run was saved)."""
    out = Path(output_dir or tempfile.mkdtemp(prefix="unified-"))
    results = {}
    for name, keywords in MODES.items():
        config = TrainingConfig(**keywords)
        config.model.d_model, config.model.n_heads = d_model, 2
        config.train.max_steps, config.train.batch_size = steps, 16
        config.train.eval_every = max(steps, 1)
        config.logging.console = config.logging.tensorboard = False
        trainer = UnifiedTrainer(config, output_dir=out / name, quiet=quiet)
        layers = trainer.new_layers(4)
        results[name] = trainer.train_all_layers(toy_loader(), layers)
        if not quiet:
            for stage in results[name].stages:
                print(
                    f"{name:>9} stage {stage.stage!s:>5} layers {stage.layers}: "
                    f"loss {stage.first:.3f} -> {stage.last:.3f}"
                )
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--output-dir", default=None)
    args = parser.parse_args()
    main(args.steps, output_dir=args.output_dir)
