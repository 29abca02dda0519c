"""The CheckpointManager: a run's checkpoints (atomic saves, rotation, exact resume) and its
final save. The folder layout is stackwise.io.checkpoints'.

Every rank takes part in a save (each writes its RNG state), and every rank learns whether any
rank failed before anyone moves on, so no rank waits at a barrier for a peer that gave up. A
failed save removes its temporary folder and leaves the previous checkpoints and `latest` as
they were.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator

from stackwise.errors import StackWiseError
from stackwise.io import checkpoints as ckpt
from stackwise.io import files
from stackwise.io.sharded import is_sharded, load_sharded, save_sharded


def agree(acc: Accelerator, error: str | None) -> None:
    """Raise `error` (or a peer's) on every rank together, so none waits for a rank that gave
    up at a barrier."""
    errors = [error]
    if acc.num_processes > 1:
        from accelerate.utils import gather_object

        errors = gather_object([error])
    failed = next((e for e in errors if e is not None), None)
    if failed is not None:
        raise StackWiseError(failed)


def on_main(acc: Accelerator, action: Callable[[], None]) -> None:
    """`action` on rank 0 only; a StackWiseError it raises is raised on every rank."""
    error = None
    if acc.is_main_process:
        try:
            action()
        except StackWiseError as err:
            error = str(err)
    agree(acc, error)


@dataclass
class CheckpointContents:
    """What one checkpoint holds, handed over by the Trainer: the model (as saved, through its
    adapter), the optimizer, the LR schedule, the loss scaler, the config and the run state."""

    adapter: Any  # a ModelAdapter: how the weights are written and read
    model: Any
    optimizer: Any
    scheduler: Any
    scaler: Any
    plan: Any  # the run's Plan: config.yaml is its to_yaml()
    state: dict[str, Any]


class CheckpointManager:
    def __init__(self, accelerator: Accelerator, output_dir: Path, limit: int | None) -> None:
        self.acc, self.output_dir, self.limit = accelerator, output_dir, limit
        self.saved_steps: set[int] = set()  # best and periodic saves of one step coincide

    def save_run(
        self, step: int, contents: CheckpointContents, protected: set[str]
    ) -> tuple[Path, bool]:
        """checkpoint-<step> of the run; see `save`. A sharded run's model and optimizer are
        written by every process (io.sharded), the rest by the main one."""
        shards = None
        if contents.plan.parallel.shards:
            shards = partial(
                save_sharded,
                model=contents.model,
                optimizer=contents.optimizer,
                frozen_from_files=contents.adapter.frozen_from_files,
            )
        return self.save(step, lambda folder: write_contents(folder, contents), protected, shards)

    def restore(self, path: Path, contents: CheckpointContents, saved: dict[str, Any]) -> None:
        """Weights, optimizer, scheduler, scaler and this rank's RNG from checkpoint `path`
        into `contents`' objects; `saved` is its run state (read_state)."""
        if is_sharded(path):  # any run reads DCP shards, resharded to its processes
            contents.adapter.check_identity(path)
            frozen = contents.adapter.frozen_from_files
            load_sharded(path, contents.model, contents.optimizer, frozen)
        elif contents.plan.parallel.shards:
            raise StackWiseError(
                f"Checkpoint '{path}' holds whole weights (a run that did not shard), and this "
                f"run shards ({contents.plan.parallel.name}), which resumes from its own "
                "partitioned checkpoints only. Resume it with the strategy that wrote it "
                "(parallel.strategy: ddp), or start this run afresh."
            )
        else:
            contents.adapter.load_weights(contents.model, path)
            contents.optimizer.load_state_dict(ckpt.load_bin(path / "optimizer.bin"))
        contents.scheduler.load_state_dict(ckpt.load_bin(path / "scheduler.bin"))
        # the next step's learning rates are the schedule's (a converted checkpoint's may not be)
        groups = contents.scheduler.optimizer.param_groups
        for group, lr in zip(groups, contents.scheduler.get_last_lr(), strict=True):
            group["lr"] = lr
        if contents.scaler is not None and (path / "scaler.bin").is_file():
            contents.scaler.load_state_dict(ckpt.load_bin(path / "scaler.bin"))
        self.saved_steps = {int(saved.get("step", 0))}
        self.read_rng(path)

    def agree(self, error: str | None) -> None:
        agree(self.acc, error)

    def save(
        self,
        step: int,
        write: Callable[[Path], None],
        protected: set[str],
        every_rank: Callable[[Path], None] | None = None,
    ) -> tuple[Path, bool]:
        """checkpoint-<step> with what `write(folder)` puts there (on the main process), plus
        every rank's RNG state and what `every_rank(folder)` writes on each. Returns (path,
        whether it was written now). Each phase is agreed on by every rank before the next
        one starts."""
        acc = self.acc
        final = self.output_dir / f"checkpoint-{step}"
        tmp = self.output_dir / f".checkpoint-{step}.tmp"
        if step in self.saved_steps:
            return final, False

        def prepare() -> None:
            if acc.is_main_process:
                ckpt.clean_partial(self.output_dir)
                tmp.mkdir(parents=True)

        def rng() -> None:
            (tmp / f"rng_state_{acc.process_index}.json").write_text(json.dumps(ckpt.rng_state()))

        def shards() -> None:
            if every_rank is not None:
                every_rank(tmp)

        def publish() -> None:
            if acc.is_main_process:
                write(tmp)
                self._publish(tmp, final, protected)

        for phase in (prepare, rng, shards, publish):
            self._attempt(phase, final, step, tmp)
        self.saved_steps.add(step)
        return final, True

    def _attempt(self, phase: Callable[[], None], final: Path, step: int, tmp: Path) -> None:
        """`phase` on this rank; any rank's failure is raised on every rank, and the temporary
        folder is removed."""
        error = None
        try:
            phase()
        except Exception as err:  # disk full shows up as OSError or RuntimeError
            reason = getattr(err, "strerror", None) or str(err)[:200]
            error = (
                f"Could not write checkpoint '{final}' at step {step}: {reason}. Free disk "
                "space or pick another train.output_dir; the previous checkpoints are intact."
            )
        try:
            self.agree(error)
        except StackWiseError:
            if self.acc.is_main_process:
                shutil.rmtree(tmp, ignore_errors=True)
            raise

    def _publish(self, tmp: Path, final: Path, protected: set[str]) -> None:
        """The written folder becomes checkpoint-<step>, `latest` names it, rotation runs."""
        files.fsync_tree(tmp)  # before the old copy goes: LATEST may name it
        if final.exists():  # left by an earlier, abandoned run in this dir
            ckpt.remove_checkpoint(final)
        files.publish_dir(tmp, final)
        files.write_atomic(self.output_dir / ckpt.LATEST, final.name + "\n")
        ckpt.rotate(self.output_dir, self.limit, protected)

    def read_state(self, path: Path) -> dict[str, Any]:
        """trainer_state.json, checked against this run's process count."""
        state = ckpt.load_json(path / ckpt.STATE)
        if state.get("world_size", 1) != self.acc.num_processes and not is_sharded(path):
            raise StackWiseError(
                f"Checkpoint '{path}' was written by {state.get('world_size')} processes and this "
                f"run has {self.acc.num_processes}; the data order would differ. Resume with the "
                "same number of processes."
            )
        return state

    def read_rng(self, path: Path) -> None:
        """This rank's generators; a resharded resume with more ranks than wrote the
        checkpoint gives the extra ranks a writer's state."""
        rank = self.acc.process_index
        if not (path / f"rng_state_{rank}.json").is_file():
            written = len(list(path.glob("rng_state_*.json")))
            rank %= max(written, 1)
        ckpt.set_rng_state(ckpt.load_json(path / f"rng_state_{rank}.json"))

    def save_final(
        self, contents: CheckpointContents, tokenizer: Any, weights: bool, also: Any
    ) -> None:
        """The finished run's folder, staged (io.final): weights, config.yaml, tokenizer/,
        history.json and `also`'s files; a failure is raised on every rank, not a hang."""
        from stackwise.io.final import final_save
        from stackwise.io.trained import save_run

        st = contents.state
        summary = {
            "steps": st["step"],
            "tokens_seen": st["tokens_seen"],
            "training_flops": st.get("flops", 0.0),
            "history": st["history"],
        }

        def write() -> None:
            with final_save(self.output_dir) as folder:
                if weights:  # train.save_precision: the finished run's dtype
                    contents.adapter.save(contents.model, folder)
                    files.cast_weight_files(folder, contents.plan.train.save_precision)
                save_run(folder, contents.plan, tokenizer, summary)
                if also is not None:
                    also(folder)

        self.acc.wait_for_everyone()
        on_main(self.acc, write)


def write_contents(folder: Path, contents: CheckpointContents) -> None:
    """One checkpoint's files, into its (temporary) folder: the adapter's weights (what a
    resume reads), and with train.consolidated_weights model.pt, the whole model's state dict
    in train.save_precision (to load with torch.load(weights_only=True) for inference). A
    sharded run's weights and optimizer are in its sharded/ folder (io.sharded)."""
    if contents.plan.parallel.shards:
        contents.adapter.write_identity(folder)
        write_run_state(folder, contents)
        return
    contents.adapter.save(contents.model, folder)
    if contents.plan.train.consolidated_weights:
        state = contents.model.state_dict()
        precision = contents.plan.train.save_precision
        target = folder / ckpt.CONSOLIDATED
        files.save_torch_weights(files.in_precision(state, precision), target)
    torch.save(contents.optimizer.state_dict(), folder / "optimizer.bin")
    write_run_state(folder, contents)


def write_run_state(folder: Path, contents: CheckpointContents) -> None:
    """The LR schedule, loss scaler, config and run state: one file each."""
    torch.save(contents.scheduler.state_dict(), folder / "scheduler.bin")
    if contents.scaler is not None:
        torch.save(contents.scaler.state_dict(), folder / "scaler.bin")
    files.write_atomic(folder / "config.yaml", contents.plan.to_yaml())
    (folder / ckpt.STATE).write_text(json.dumps(contents.state, indent=1))
