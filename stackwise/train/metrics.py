"""Where metrics go: console, metrics.jsonl and TensorBoard, on the main process only."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm


def _fmt(key: str, value: Any) -> str:
    if isinstance(value, float):
        if key == "lr" or (value != 0 and abs(value) < 1e-3):
            return f"{key}={value:.2e}"
        return f"{key}={value:.4g}"
    return f"{key}={value}"


class MetricsLogger:
    def __init__(
        self,
        out_dir: Path,
        console: bool,
        jsonl: bool,
        tensorboard: bool,
        enabled: bool = True,
    ) -> None:
        self.enabled = enabled
        self.console = console and enabled
        self.jsonl_path = out_dir / "metrics.jsonl" if jsonl and enabled else None
        self.tb = None
        if tensorboard and enabled:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(log_dir=str(out_dir / "tensorboard"))

    def log(self, step: int, metrics: dict[str, Any], prefix: str = "") -> None:
        if not self.enabled:
            return
        record = {
            "step": step,
            "time": time.time(),
            **{f"{prefix}{k}": v for k, v in metrics.items()},
        }
        if self.jsonl_path is not None:
            with self.jsonl_path.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps(record) + "\n")
        if self.tb is not None:
            for k, v in metrics.items():
                if isinstance(v, int | float) and math.isfinite(v):
                    self.tb.add_scalar(f"{prefix}{k}", v, step)
        if self.console:
            shown = " ".join(_fmt(f"{prefix}{k}", v) for k, v in metrics.items())
            tqdm.write(f"step {step}: {shown}")

    def close(self) -> None:
        if self.tb is not None:
            self.tb.flush()
            self.tb.close()
