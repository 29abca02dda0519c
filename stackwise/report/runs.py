"""A finished (or stopped) run's folder read back as plain data for the report: its config, the
machine it ran on, its logged rows stage by stage, its summary, eval and samples.

Only what the run wrote is read (JSON, JSONL, YAML with safe_load): nothing is unpickled and no
model is loaded, so a report of a large run costs what reading its logs costs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from stackwise.errors import StackWiseError

ENV_FILE = "env.json"
SAMPLES_FILE = "samples.json"
METRICS_FILE = "metrics.jsonl"


@dataclass
class Stage:
    """One stretch of training with its own metrics.jsonl: a stack, joint tuning, or the run."""

    name: str
    rows: list[dict[str, Any]]
    step_offset: int  # steps of the run before this stage: the x of its first step
    record: dict[str, Any] = field(default_factory=dict)  # its progressive_history entry


@dataclass
class Run:
    path: Path
    name: str
    config: dict[str, Any]
    stages: list[Stage]
    summary: dict[str, Any]  # history.json or progressive_history.json, as written
    env: dict[str, Any] | None = None
    eval: dict[str, Any] | None = None
    samples: list[str] = field(default_factory=list)
    adapter: dict[str, Any] | None = None
    complete: bool = False

    @property
    def objective(self) -> str:
        return str(self.config.get("objective", {}).get("name", "clm"))

    @property
    def progressive(self) -> bool:
        return len([s for s in self.stages if s.name.startswith("stack")]) > 0

    def rows(self, key: str) -> list[tuple[Stage, dict[str, Any]]]:
        """Every logged row holding `key`, with its stage, in training order."""
        return [(s, r) for s in self.stages for r in s.rows if key in r]

    def final_eval(self) -> dict[str, Any] | None:
        final = self.summary.get("final_eval")
        if final:
            return final
        history = self.summary.get("history") or []
        return history[-1] if history else None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise StackWiseError(
            f"'{path}' could not be read as JSON ({err}). The run folder is damaged or still "
            "being written; report a finished run, or remove the damaged file."
        ) from None


def read_rows(path: Path) -> list[dict[str, Any]]:
    """metrics.jsonl's rows; a line torn by a crash is skipped, as resume does."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and "step" in row:
            rows.append(row)
    return rows


def summary_rows(record: dict[str, Any]) -> list[dict[str, Any]]:
    """A stage's end as one row, from its progressive_history entry: the curve of a run whose
    stage folders (and their metrics.jsonl) were removed is then one point per stack."""
    ev = record.get("eval") or {}
    row: dict[str, Any] = {"step": int(record.get("steps") or 0)}
    if record.get("train_loss") is not None:
        row["train/loss"] = record["train_loss"]
    row |= {f"val/{k}": v for k, v in ev.items() if k != "step"}
    return [row] if len(row) > 1 else []


def _stages(path: Path, summary: dict[str, Any]) -> list[Stage]:
    """The run's stages in order: each stack's folder, then joint tuning; else the run itself
    (its history.json's evals standing in when metrics.jsonl is gone)."""
    records = summary.get("stacks")
    if records is None:
        rows = read_rows(path / METRICS_FILE)
        evals = [h for h in summary.get("history", []) if "step" in h]
        fallback = [
            {"step": h["step"], **{f"val/{k}": v for k, v in h.items() if k != "step"}}
            for h in evals
        ]
        return [Stage("run", rows or fallback, 0)]
    stages, offset = [], 0
    for rec in records:
        index = rec.get("index", len(stages))
        rows = read_rows(path / f"stack_{index}" / METRICS_FILE) or summary_rows(rec)
        stages.append(Stage(f"stack {index}", rows, offset, rec))
        offset += int(rec.get("steps") or 0)
    joint = path / "joint" / METRICS_FILE
    if joint.is_file():
        stages.append(Stage("joint", read_rows(joint), offset, summary.get("joint") or {}))
    return stages


def _first(paths: list[Path]) -> Path | None:
    return next((p for p in paths if p.is_file()), None)


def load_run(folder: str | Path) -> Run:
    """The run in `folder`; a clear error when it is not a StackWise run folder."""
    path = Path(folder).expanduser()
    if not (path / "config.yaml").is_file():
        raise StackWiseError(
            f"'{folder}' is not a StackWise run folder (no config.yaml in it). Pass the "
            "output folder of `stackwise train` or `stackwise finetune` (train.output_dir, "
            "outputs/<run> by default)."
        )
    config = yaml.safe_load((path / "config.yaml").read_text(encoding="utf-8")) or {}
    summary_file = _first([path / "progressive_history.json", path / "history.json"])
    summary = _read_json(summary_file) if summary_file else {}
    stages = _stages(path, summary)
    if not any(s.rows for s in stages):
        raise StackWiseError(
            f"'{folder}' holds no logged metrics ({METRICS_FILE} is missing or empty, and no "
            "history.json holds an eval): the run was trained with logging.jsonl off, or "
            "stopped before its first log row. Turn logging.jsonl on (the default) and train "
            "again to report it."
        )
    env = _first([path / ENV_FILE, path / "stack_0" / ENV_FILE])
    samples = path / SAMPLES_FILE
    adapter = _first([path / "final" / "adapter_config.json", path / "adapter_config.json"])
    return Run(
        path=path,
        name=path.name,
        config=config,
        stages=stages,
        summary=summary,
        env=_read_json(env) if env else None,
        eval=_read_json(path / "eval.json") if (path / "eval.json").is_file() else None,
        samples=list(_read_json(samples).get("samples", [])) if samples.is_file() else [],
        adapter=_read_json(adapter) if adapter else None,
        complete=(path / "run_complete.json").is_file(),
    )


def unique_names(runs: list[Run]) -> None:
    """Runs in folders of the same name get their parent folder in front, so legends differ."""
    names = [r.name for r in runs]
    for run in runs:
        if names.count(run.name) > 1:
            run.name = f"{run.path.parent.name}/{run.path.name}"
