"""The EnhancedTrainer's files: checkpoints it saves and resumes from, the final save, and
env.json (the machine it trained on).

A mixin of the Trainer's own methods, kept apart so the loop reads on its own; it uses the
Trainer's parts (placement, checkpoints, extensions, metrics, live state).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from stackwise.errors import StackWiseError
from stackwise.io import checkpoints as ckpt
from stackwise.io.files import write_atomic
from stackwise.machine import run_machine
from stackwise.train.checkpoint_manager import CheckpointContents
from stackwise.train.state import TrainState

Writer = Callable[[Path], None] | None  # writes more final files into the folder it is given


class RunFiles:
    """Checkpoint and final-save methods of the EnhancedTrainer."""

    # the Trainer's parts these methods use
    placement: Any
    accelerator: Any
    adapter: Any
    plan: Any
    checkpoints: Any
    extensions: Any
    metrics: Any
    stage: Any
    live: Any
    state: TrainState
    output_dir: Path
    logger_note: Callable[[str], None]
    call_hook: Callable[..., None]
    unwrapped: Callable[[], Any]

    def write_machine(self) -> None:
        """env.json: the machine and library versions this run trains on (its report shows
        them); rewritten when a run resumes, perhaps elsewhere."""
        if self.accelerator.is_main_process:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            write_atomic(self.output_dir / "env.json", json.dumps(run_machine(), indent=1))

    # -- checkpoints ----------------------------------------------------------------------------

    def contents(self) -> CheckpointContents:
        p = self.placement
        scaler = self.accelerator.scaler
        return CheckpointContents(
            self.adapter,
            p.checkpointed(),
            p.optimizer,
            p.scheduler,
            scaler,
            self.plan,
            self.state_dict(),
        )

    def save_checkpoint(self) -> Path:
        """outputs/<run>/checkpoint-<step>, atomically (see CheckpointManager)."""
        protected = self.extensions.protected_checkpoints()
        path, fresh = self.checkpoints.save_run(self.state.step, self.contents(), protected)
        if fresh:
            if reports := self.extensions.reports():
                self.metrics.log({f"report/{k}": v for k, v in reports.items()})
            self.call_hook("on_save", path)
        return path

    def state_dict(self) -> dict[str, Any]:
        """trainer_state.json: the run state, the process count, the stage, and the states
        extensions and sinks keep (what resuming needs, and nothing else)."""
        return {
            **self.state.state_dict(),
            "best_metric": self.best_metric(),  # for readers; a resume takes it from history
            "metric_for_best": self.plan.train.metric_for_best,
            "world_size": self.accelerator.num_processes,
            "stack_index": self.stage.index,
            "extensions": self.extensions.state_dict(),
            "metrics": self.metrics.state_dict(),
        }

    def best_metric(self) -> float | None:
        """The best train.metric_for_best of the evals so far (None before any)."""
        name = self.plan.train.metric_for_best
        values = [row[name] for row in self.state.history if name in row]
        if not values:
            return None
        return max(values) if self.plan.train.best_is_greater() else min(values)

    def load_checkpoint(self, path: Path) -> None:
        """Weights, optimizer, scheduler, sampler position, RNG and extension states."""
        saved = self.checkpoints.read_state(path)
        if note := ckpt.check_resume_config(path, self.plan, int(saved.get("step", 0))):
            self.logger_note(note)
        self.checkpoints.restore(path, self.contents(), saved)
        self.live.state = TrainState.from_dict({**saved, "resumed_from": str(path)})
        states = saved.get("extensions", {})
        self.metrics.load_state_dict(saved.get("metrics") or states)  # older runs: extensions
        self.extensions.load_state_dict(states)
        self.logger_note(f"resumed from {path} at step {self.state.step}")
        written = int(saved.get("world_size", 1))
        if written != self.accelerator.num_processes:  # only sharded checkpoints get here
            self.resharded(path, written)

    def resharded(self, path: Path, written: int) -> None:
        """A resume on another process count: the epoch goes on from the same row of its
        order (every rank reads its stride of one shuffled order), and the run says so."""
        if self.state.stream_position is not None:
            raise StackWiseError(
                f"Checkpoint '{path}' was written by {written} processes reading a stream "
                f"(data.streaming), and this run has {self.accelerator.num_processes}: each "
                "process's place in its stream cannot be split anew. Resume with "
                f"{written} processes."
            )
        saved = yaml.safe_load((path / "config.yaml").read_text(encoding="utf-8"))
        before = int(saved["train"]["batch_size"])
        rows = self.state.batch_in_epoch * before * written  # of this epoch, all ranks
        world, batch = self.accelerator.num_processes, self.plan.train.batch_size
        self.state.batch_in_epoch = rows // (batch * world)
        skipped = rows - self.state.batch_in_epoch * batch * world
        exact = (
            "the weights are exact (DeepSpeed's universal form: the run does not go on bit for "
            "bit, docs/distributed.md)"
            if (path / "deepspeed").is_dir()
            else "weights and optimizer state are exact"
        )
        self.logger_note(
            f"resharded: the checkpoint was written by {written} processes and this run has "
            f"{world}; {exact}, and the epoch goes on from row "
            f"{rows - skipped:,} of its order"
            + (f" ({skipped} rows are read again)" if skipped else "")
            + (
                f"; the global batch (train.batch_size x processes) is now {batch * world}, "
                f"was {before * written} (train.batch_size={before * written // world} keeps "
                "it)"
                if batch * world != before * written
                else ""
            )
        )

    # -- saving -----------------------------------------------------------------------------

    def save(
        self, tokenizer: Any = None, weights: bool = True, also: Writer = None, model: Any = None
    ) -> Path:
        """Weights, config.yaml, tokenizer/, history.json, `also`'s files: staged (io.final).
        `model`: the weights to save when not the trained model itself (a sharded model's
        whole copy, io.sharded.whole_model)."""
        contents = self.contents()
        contents.model = self.unwrapped() if model is None else model
        self.checkpoints.save_final(contents, tokenizer, weights, also)
        return self.output_dir
