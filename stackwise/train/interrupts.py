"""Ctrl-C and preemption keep the work: the first SIGINT/SIGTERM lets the current optimizer step
finish, then the Trainer writes a checkpoint and stops; a second one aborts at once.

Schedulers send SIGTERM shortly before they kill a job, so the same path serves preemption.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any

from stackwise.errors import StackWiseError

if TYPE_CHECKING:
    from accelerate import Accelerator

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class TrainingInterrupted(StackWiseError):
    """The run stopped on a signal after saving `checkpoint`; `run_dir` is what to resume.
    `where` says where it stopped when that is not a step ("after stack 2 of 4")."""

    def __init__(
        self,
        signal_name: str,
        step: int,
        checkpoint: Path,
        run_dir: Path,
        where: str | None = None,
    ) -> None:
        self.signal_name, self.step = signal_name, step
        self.checkpoint, self.run_dir = checkpoint, run_dir
        self.where = where or f"at step {step}"
        super().__init__(
            f"{signal_name} {self.where}: saved {checkpoint}. Resume with "
            f"train.output_dir={run_dir} train.resume_from_checkpoint=latest."
        )

    def of_run(self, run_dir: Path) -> TrainingInterrupted:
        """The same stop, naming the run folder (a stage's Trainer knows only its own)."""
        stop = (self.signal_name, self.step, self.checkpoint)
        return TrainingInterrupted(*stop, run_dir, self.where)

    def resume_command(self, args: list[str], command: str = "train") -> str:
        """The `stackwise <command>` line that continues this run, from the user's own
        arguments: dotted keys for `train`, flags for `finetune` (whose flags are the seed's)."""
        import shlex

        if command == "finetune":
            kept = _without_flags(args, ("--output_dir", "--resume_from_checkpoint"))
            tail = ["--output_dir", str(self.run_dir), "--resume_from_checkpoint", "latest"]
        else:
            kept = args
            tail = [f"train.output_dir={self.run_dir}", "train.resume_from_checkpoint=latest"]
        dropped = ("train.output_dir=", "train.resume_from_checkpoint=")
        kept = [a for a in kept if not a.startswith(dropped)]
        return shlex.join(["stackwise", command, *kept, *tail])


def _without_flags(args: list[str], flags: tuple[str, ...]) -> list[str]:
    """`args` without `--flag value` and `--flag=value` for each of `flags`."""
    kept: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        name = "--" + arg.split("=", 1)[0].lstrip("-").replace("-", "_")
        if arg.startswith("--") and name in flags:
            skip = "=" not in arg
            continue
        kept.append(arg)
    return kept


class StopSignals:
    """While entered, SIGINT and SIGTERM set `received` instead of killing the process; a second
    SIGINT (Ctrl-C again) raises KeyboardInterrupt. A SIGTERM after the first signal changes
    nothing: torchrun forwards Ctrl-C to its workers as SIGTERM, and that must not abort the
    save. Outside the main thread (signals cannot be caught there) nothing is installed."""

    def __init__(self, announce: bool = True) -> None:
        self.received: str | None = None
        self.announce = announce
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        for sig, handler in self._previous.items():
            if handler is not None:  # None: installed outside Python, cannot be put back
                signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.received is not None:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt(f"second {name}: aborted without saving")
            return
        self.received = name
        if self.announce:  # os.write: print() may be mid-write on stderr (tqdm) right now
            note = (
                f"\nstackwise: {name} received: finishing this step and saving a checkpoint "
                "(press Ctrl-C again to abort without saving)\n"
            )
            with contextlib.suppress(OSError):
                os.write(sys.stderr.fileno(), note.encode())


_active: StopSignals | None = None


@contextlib.contextmanager
def stop_signals(announce: bool = True) -> Iterator[StopSignals]:
    """StopSignals for a whole run: the outermost `with` installs them and inner ones (each
    progressive stage's Trainer) share them, so a signal between two steps, during a stage's
    setup or its first eval, or between stages is held until the next point that can save."""
    global _active
    if _active is not None:
        yield _active
        return
    guard = StopSignals(announce)
    if threading.current_thread() is not threading.main_thread():
        yield guard  # no handlers can be installed here: nothing to share
        return
    with guard:
        _active = guard
        try:
            yield guard
        finally:
            _active = None


def any_rank_signalled(acc: Accelerator, signals: StopSignals) -> bool:
    """Whether any rank was signalled: all ranks must stop at the same step, or DDP hangs."""
    flag = signals.received is not None
    if acc.num_processes == 1:
        return flag
    import torch

    return bool(acc.reduce(torch.tensor(float(flag), device=acc.device)) > 0)
