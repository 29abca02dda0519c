"""Where metrics go: console, metrics.jsonl, TensorBoard, W&B and the progress bar.

Each is an extension (see `stackwise.train.extensions`), turned on by the `logging` section and
active on the main process only. On resume, rows logged after the checkpoint's step are dropped
from metrics.jsonl and TensorBoard, so a crashed-and-resumed run reads like one run.
"""

from __future__ import annotations

import json
import math
import sys
import time
from typing import Any

import torch
from tqdm.auto import tqdm

from stackwise.config import Config
from stackwise.errors import StackWiseError
from stackwise.io.files import write_atomic
from stackwise.train.extensions import Extension, register_extension
from stackwise.train.state import RunInfo


def _fmt(key: str, value: Any) -> str:
    if isinstance(value, float):
        if key.endswith("lr") or (value != 0 and abs(value) < 1e-3):
            return f"{key}={value:.2e}"
        return f"{key}={value:.4g}"
    return f"{key}={value}"


@register_extension("console")
class ConsoleLogger(Extension):
    def on_log(self, run: RunInfo, metrics: dict[str, Any]) -> None:
        if run.is_main:
            shown = " ".join(_fmt(k, v) for k, v in metrics.items())
            tqdm.write(f"step {run.state.step}: {shown}")


@register_extension("jsonl")
class JsonlLogger(Extension):
    def on_train_begin(self, run: RunInfo) -> None:
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

    def on_log(self, run: RunInfo, metrics: dict[str, Any]) -> None:
        if run.is_main:
            record = {"step": run.state.step, "time": time.time(), **metrics}
            with self.path.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps(record) + "\n")


@register_extension("tensorboard")
class TensorBoardLogger(Extension):
    writer: Any = None

    def on_train_begin(self, run: RunInfo) -> None:
        if run.is_main:
            from torch.utils.tensorboard import SummaryWriter

            purge = run.state.step + 1 if run.resumed_from is not None else None
            self.writer = SummaryWriter(
                log_dir=str(run.output_dir / "tensorboard"), purge_step=purge
            )

    def on_log(self, run: RunInfo, metrics: dict[str, Any]) -> None:
        if self.writer is not None:
            for k, v in metrics.items():
                if isinstance(v, int | float) and math.isfinite(v):
                    self.writer.add_scalar(k, v, run.state.step)

    def on_train_end(self, run: RunInfo) -> None:
        if self.writer is not None:
            self.writer.flush()
            self.writer.close()
            self.writer = None


@register_extension("wandb")
class WandbLogger(Extension):
    """Weights & Biases; `WANDB_MODE=offline` writes the run under output_dir/wandb."""

    run: Any = None

    def __init__(self) -> None:
        self.run_id: str | None = None

    def on_train_begin(self, run: RunInfo) -> None:
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
            name=run.output_dir.name,
            dir=str(run.output_dir),
            config=run.config.model_dump(mode="json"),
            id=self.run_id,  # a resumed run continues the same W&B run
            resume="allow",
            reinit="create_new",
        )
        self.run_id = self.run.id

    def on_log(self, run: RunInfo, metrics: dict[str, Any]) -> None:
        if self.run is not None:
            self.run.log(metrics, step=run.state.step)

    def on_train_end(self, run: RunInfo) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None

    def state_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.run_id = state.get("run_id")


@register_extension("progress_bar")
class ProgressBar(Extension):
    """tqdm with loss, LR and tokens/s; on rank 0, and (mode auto) only on a terminal."""

    bar: Any = None

    def on_train_begin(self, run: RunInfo) -> None:
        mode = run.config.logging.progress_bar
        show = mode == "always" or (mode == "auto" and sys.stdout.isatty())
        self.bar = tqdm(
            total=run.config.train.max_steps,
            initial=run.state.step,
            disable=not (show and run.is_main),
            dynamic_ncols=True,
            desc=run.progress_desc,
        )

    def on_step_end(self, run: RunInfo) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def on_log(self, run: RunInfo, metrics: dict[str, Any]) -> None:
        if self.bar is not None and "train/loss" in metrics:
            self.bar.set_postfix(
                loss=f"{metrics['train/loss']:.3f}",
                lr=f"{metrics['train/lr']:.1e}",
                tok_s=f"{metrics['train/tokens_per_s']:,.0f}",
            )

    def on_train_end(self, run: RunInfo) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def logging_extensions(config: Config) -> list[Extension]:
    """The built-in loggers the `logging` section turns on, progress bar first."""
    lc = config.logging
    out: list[Extension] = [ProgressBar()]
    if lc.console:
        out.append(ConsoleLogger())
    if lc.jsonl:
        out.append(JsonlLogger())
    if lc.tensorboard:
        out.append(TensorBoardLogger())
    if lc.log_to_wandb:
        out.append(WandbLogger())
    return out


class LossWindow:
    """The training losses since the last log line (summed on the device, so logging is the only
    sync), and the tokens/s over them."""

    def __init__(self, accelerator: Any, tokens: int) -> None:
        self.acc = accelerator
        self.total = torch.zeros((), device=accelerator.device)
        self.steps, self.tokens, self.start = 0, tokens, time.perf_counter()

    def add(self, loss: torch.Tensor | None) -> None:
        """None: a skipped (non-finite) step, left out of the mean."""
        if loss is not None:
            self.total += loss
            self.steps += 1

    def close(self, tokens: int) -> tuple[float, float]:
        """(mean loss over every rank, tokens/s), and a fresh window."""
        mean = float(self.acc.reduce(self.total, "mean")) / self.steps
        tps = (tokens - self.tokens) / max(time.perf_counter() - self.start, 1e-9)
        self.total.zero_()
        self.steps, self.tokens, self.start = 0, tokens, time.perf_counter()
        return mean, tps
