"""The MetricsLogger: where every logged value goes (console, metrics.jsonl, TensorBoard, W&B,
the progress bar), each a sink the `logging` section turns on, active on the main process only.

The Trainer hands it each log row (losses with the tokens seen, LRs, eval metrics, what the
extensions report). On resume, rows logged after the checkpoint's step are dropped from
metrics.jsonl and TensorBoard, so a crashed-and-resumed run reads like one run.
"""

from __future__ import annotations

import json
import math
import sys
import time
from typing import Any

import torch
from tqdm.auto import tqdm

from stackwise.errors import StackWiseError
from stackwise.io.files import write_atomic
from stackwise.train.state import RunInfo


class Sink:
    """One destination of the metrics; override what it needs."""

    name = "sink"

    def begin(self, run: RunInfo) -> None: ...

    def log(self, run: RunInfo, metrics: dict[str, Any]) -> None: ...

    def step_done(self, run: RunInfo) -> None: ...

    def close(self, run: RunInfo) -> None: ...

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to continue this sink (W&B: its run id); most keep none."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """`state_dict`'s value from a checkpoint; a sink that keeps none ignores it."""


def _fmt(key: str, value: Any) -> str:
    if isinstance(value, float):
        if key.endswith("lr") or (value != 0 and abs(value) < 1e-3):
            return f"{key}={value:.2e}"
        return f"{key}={value:.4g}"
    return f"{key}={value}"


class ConsoleSink(Sink):
    name = "console"

    def log(self, run: RunInfo, metrics: dict[str, Any]) -> None:
        if run.is_main:
            shown = " ".join(_fmt(k, v) for k, v in metrics.items())
            tqdm.write(f"step {run.state.step}: {shown}")


class JsonlSink(Sink):
    name = "jsonl"

    def begin(self, run: RunInfo) -> None:
        self.path = run.output_dir / "metrics.jsonl"
        if run.is_main and run.resumed_from is None and self.path.is_file():
            self.path.unlink()  # a fresh start (the dir held no finished run): begin anew
        if run.is_main and run.resumed_from is not None and self.path.is_file():
            keep = []
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    if json.loads(line).get("step", 0) <= run.state.step:
                        keep.append(line)
                except ValueError:  # a line torn by the crash
                    continue
            write_atomic(self.path, "".join(f"{line}\n" for line in keep))

    def log(self, run: RunInfo, metrics: dict[str, Any]) -> None:
        if run.is_main:
            record = {"step": run.state.step, "time": time.time(), **metrics}
            with self.path.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps(record) + "\n")


class TensorBoardSink(Sink):
    name = "tensorboard"

    writer: Any = None

    def begin(self, run: RunInfo) -> None:
        if run.is_main:
            from torch.utils.tensorboard import SummaryWriter

            purge = run.state.step + 1 if run.resumed_from is not None else None
            self.writer = SummaryWriter(
                log_dir=str(run.output_dir / "tensorboard"), purge_step=purge
            )

    def log(self, run: RunInfo, metrics: dict[str, Any]) -> None:
        if self.writer is not None:
            for k, v in metrics.items():
                if isinstance(v, int | float) and math.isfinite(v):
                    self.writer.add_scalar(k, v, run.state.step)

    def close(self, run: RunInfo) -> None:
        if self.writer is not None:
            self.writer.flush()
            self.writer.close()
            self.writer = None


class WandbSink(Sink):
    """Weights & Biases; `WANDB_MODE=offline` writes the run under output_dir/wandb."""

    name = "wandb"

    run: Any = None

    def __init__(self) -> None:
        self.run_id: str | None = None

    def begin(self, run: RunInfo) -> None:
        if not run.is_main or self.run is not None:
            return
        try:
            import wandb
        except ImportError:
            raise StackWiseError(
                "logging.log_to_wandb is on but wandb is not installed. `pip install wandb` "
                "(set WANDB_MODE=offline to log without an account), or turn it off."
            ) from None
        lc = run.config.logging
        self.run = wandb.init(
            project=lc.wandb_project,
            name=lc.run_name or run.output_dir.name,
            dir=str(run.output_dir),
            config=run.plan.source,
            id=self.run_id,  # a resumed run continues the same W&B run
            resume="allow",
            reinit="create_new",
        )
        self.run_id = self.run.id

    def log(self, run: RunInfo, metrics: dict[str, Any]) -> None:
        if self.run is not None:
            self.run.log(metrics, step=run.state.step)

    def close(self, run: RunInfo) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None

    def state_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.run_id = state.get("run_id")


class ProgressBarSink(Sink):
    """tqdm with loss, LR and tokens/s; on rank 0, and (mode auto) only on a terminal."""

    name = "progress_bar"

    bar: Any = None

    def begin(self, run: RunInfo) -> None:
        mode = run.config.logging.progress_bar
        show = mode == "always" or (mode == "auto" and sys.stdout.isatty())
        self.bar = tqdm(
            total=run.config.train.max_steps,
            initial=run.state.step,
            disable=not (show and run.is_main),
            dynamic_ncols=True,
            desc=run.progress_desc,
        )

    def step_done(self, run: RunInfo) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def log(self, run: RunInfo, metrics: dict[str, Any]) -> None:
        if self.bar is not None and "train/loss" in metrics:
            self.bar.set_postfix(
                loss=f"{metrics['train/loss']:.3f}",
                lr=f"{metrics['train/lr']:.1e}",
                tok_s=f"{metrics['train/tokens_per_s']:,.0f}",
            )

    def close(self, run: RunInfo) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class MetricsLogger:
    """The run's sinks, fed one row at a time at the run's current step."""

    def __init__(self, sinks: list[Sink]) -> None:
        self.sinks = sinks
        self.info: RunInfo | None = None

    @classmethod
    def from_plan(cls, plan: Any) -> MetricsLogger:
        """The sinks the `logging` section turns on, progress bar first."""
        lc = plan.logging
        wanted = [
            (True, ProgressBarSink),
            (lc.console, ConsoleSink),
            (lc.jsonl, JsonlSink),
            (lc.tensorboard, TensorBoardSink),
            (lc.log_to_wandb, WandbSink),
        ]
        return cls([kind() for on, kind in wanted if on])

    def _each(self, action: str, *args: Any) -> None:
        """`action` on every sink; nothing before the run began (a save before train())."""
        if self.info is None:
            return
        for sink in self.sinks:
            getattr(sink, action)(self.info, *args)

    def begin(self, info: RunInfo) -> None:
        self.info = info
        self._each("begin")

    def log(self, metrics: dict[str, Any]) -> None:
        self._each("log", metrics)

    def step_done(self) -> None:
        self._each("step_done")

    def close(self) -> None:
        self._each("close")

    def state_dict(self) -> dict[str, dict[str, Any]]:
        return {s.name: s.state_dict() for s in self.sinks if s.state_dict()}

    def load_state_dict(self, states: dict[str, dict[str, Any]]) -> None:
        for sink in self.sinks:
            if sink.name in states:
                sink.load_state_dict(states[sink.name])


class LossWindow:
    """The training losses since the last log line (summed on the device, so logging is the only
    sync), and the tokens/s over them."""

    def __init__(self, accelerator: Any, tokens: int) -> None:
        self.acc = accelerator
        self.total = torch.zeros((), device=accelerator.device)
        self.dropped = torch.zeros((), device=accelerator.device)  # device-skipped steps
        self.steps, self.tokens, self.start = 0, tokens, time.perf_counter()

    def add(self, loss: torch.Tensor | None, skipped: torch.Tensor | None = None) -> None:
        """None, or a step the device found NaN/inf and skipped (`skipped`, a 0-d bool
        there): left out of the mean without asking the device which. Any other loss counts,
        a non-finite one included."""
        if loss is None:
            return
        self.steps += 1
        if skipped is None:
            self.total += loss
        else:
            self.total += torch.where(skipped, 0.0, loss)
            self.dropped += skipped

    def close(self, tokens: int) -> tuple[float | None, float]:
        """(mean loss over every rank, None if every step was skipped; tokens/s), and a fresh
        window."""
        total, dropped = self.acc.reduce(torch.stack([self.total, self.dropped]), "sum").tolist()
        count = self.steps * self.acc.num_processes - dropped
        mean = total / count if count else None
        tps = (tokens - self.tokens) / max(time.perf_counter() - self.start, 1e-9)
        torch._foreach_zero_([self.total, self.dropped])
        self.steps, self.tokens, self.start = 0, tokens, time.perf_counter()
        return mean, tps
