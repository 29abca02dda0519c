"""A run's folder, finished or stopped, read back as plain data for the report: its config, the
machine it ran on, its logged rows stage by stage, its totals, eval and samples.

Only what the run wrote is read (JSON, JSONL, YAML with safe_load): nothing is unpickled and no
model is loaded, so a report of a large run costs what reading its logs costs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stackwise.errors import StackWiseError
from stackwise.io.files import read_json, read_yaml
from stackwise.io.run_folder import LATEST

ENV_FILE = "env.json"
SAMPLES_FILE = "samples.json"
METRICS_FILE = "metrics.jsonl"
DAMAGED = "The run folder is damaged or still being written: report it once it has finished."


@dataclass
class Stage:
    """One stretch of training with its own metrics.jsonl: a stack, joint tuning, or the run."""

    name: str
    rows: list[dict[str, Any]]
    step_offset: int = 0  # the run's steps, tokens and FLOPs before this stage began
    tokens_before: float = 0.0
    flops_before: float = 0.0
    record: dict[str, Any] = field(default_factory=dict)  # its progressive_history entry

    def after(self) -> tuple[int, float, float]:
        """The run's steps, tokens and FLOPs once this stage ended: its record's, else its last
        logged row's (a stage stopped midway)."""
        rec, last = self.record, self.rows[-1] if self.rows else {}
        steps = self.step_offset + rec.get("steps", last.get("step", 0))
        tokens = self.tokens_before + rec.get("tokens", last.get("train/tokens", 0))
        flops = max(self.flops_before + rec.get("flops", 0), last.get("train/flops", 0))
        return int(steps), tokens, flops


@dataclass
class Run:
    path: Path
    name: str
    config: dict[str, Any]
    stages: list[Stage]
    summary: dict[str, Any]  # history.json or progressive_history.json, as written
    env: dict[str, Any] | None = None
    eval: dict[str, Any] | None = None
    samplers: list[dict[str, Any]] = field(default_factory=list)  # eval_samplers.json's rows
    samples: list[str] = field(default_factory=list)
    adapter: dict[str, Any] | None = None
    complete: bool = False
    config_from: str = "config.yaml"
    notes: list[str] = field(default_factory=list)  # optional files skipped, and why

    @property
    def objective(self) -> str:
        return str(self.config.get("objective", {}).get("name", "clm"))

    @property
    def progressive(self) -> bool:
        return any(s.name.startswith("stack") for s in self.stages)

    def rows(self, key: str) -> list[tuple[Stage, dict[str, Any]]]:
        """Every logged row holding `key`, with its stage, in training order."""
        return [(s, r) for s in self.stages for r in s.rows if key in r]

    def final_eval(self) -> dict[str, Any] | None:
        final = self.summary.get("final_eval")
        if final:
            return final
        history = self.summary.get("history") or []
        if history:
            return history[-1]
        rows = [r for s in self.stages for r in s.rows if "val/loss" in r]  # a stopped run
        return {k[4:]: v for k, v in rows[-1].items() if k.startswith("val/")} if rows else None

    def totals(self) -> dict[str, float]:
        """Steps, tokens and FLOPs of the whole run: the summary's, else the last rows'."""
        s = self.summary
        if "steps" in s and not self.progressive:
            return {
                "steps": s["steps"],
                "tokens": s.get("tokens_seen", 0),
                "flops": s.get("training_flops", 0),
            }
        steps, tokens, flops = self.stages[-1].after() if self.stages else (0, 0.0, 0.0)
        return {"steps": steps, "tokens": tokens, "flops": flops}


def read_rows(path: Path) -> list[dict[str, Any]]:
    """metrics.jsonl's rows; a line torn by a crash (or otherwise unreadable) is skipped, as
    resume does."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and "step" in row:
            rows.append(row)
    return rows


def as_val_row(step: int, evaluation: dict[str, Any]) -> dict[str, Any]:
    """An eval result (history.json, a stack's record) as a logged row would hold it."""
    return {"step": step, **{f"val/{k}": v for k, v in evaluation.items() if k != "step"}}


def summary_rows(stage: Stage) -> list[dict[str, Any]]:
    """A stage's end as one row, from its progressive_history entry: the curve of a run whose
    stage folders (and their metrics.jsonl) were removed is then one point per stack."""
    rec = stage.record
    row = as_val_row(int(rec.get("steps") or 0), rec.get("eval") or {})
    if rec.get("train_loss") is not None:
        row["train/loss"] = rec["train_loss"]
    if rec.get("tokens") is not None:
        row["train/run_tokens"] = stage.tokens_before + rec["tokens"]
    if rec.get("flops") is not None:
        row["train/flops"] = stage.flops_before + rec["flops"]
    return [row] if len(row) > 1 else []


def _stacks(path: Path, summary: dict[str, Any]) -> list[Stage]:
    """A progressive run's stages: each stack's folder (as its record lists them, else as the
    folders a stopped run left), then joint tuning."""
    records = list(summary.get("stacks") or [])
    done = {rec.get("index") for rec in records}
    folders = sorted(int(p.name[6:]) for p in path.glob("stack_*/") if p.name[6:].isdigit())
    records += [{"index": k} for k in folders if k not in done]  # a stage stopped midway
    stages: list[Stage] = []
    for rec in records:
        index = rec.get("index", len(stages))
        began = stages[-1].after() if stages else (0, 0.0, 0.0)
        stage = Stage(f"stack {index}", [], *began, rec)
        stage.rows = read_rows(path / f"stack_{index}" / METRICS_FILE) or summary_rows(stage)
        stages.append(stage)
    joint = path / "joint" / METRICS_FILE
    if joint.is_file():
        began = stages[-1].after() if stages else (0, 0.0, 0.0)
        stages.append(Stage("joint", read_rows(joint), *began, summary.get("joint") or {}))
    return stages


def _stages(path: Path, config: dict[str, Any], summary: dict[str, Any]) -> list[Stage]:
    """The run's stages; a run trained end to end is one (its history.json's evals standing
    in when metrics.jsonl is gone)."""
    if (config.get("progressive") or {}).get("strategy") == "progressive":
        return _stacks(path, summary)
    rows = read_rows(path / METRICS_FILE)
    evals = [as_val_row(h["step"], h) for h in summary.get("history", []) if "step" in h]
    return [Stage("run", rows or evals)]


def _config(path: Path) -> tuple[dict[str, Any], str]:
    """The run's config.yaml; for a run stopped before its final save, its latest checkpoint's."""
    where = [path / "config.yaml"]
    for folder in [path, *sorted(path.glob("stack_*/"), reverse=True)]:
        if (folder / LATEST).is_file():
            name = (folder / LATEST).read_text(encoding="utf-8").strip()
            where.append(folder / name / "config.yaml")
    found = next((p for p in where if p.is_file()), None)
    if found is None:
        raise StackWiseError(
            f"'{path}' is not a StackWise run folder (no config.yaml in it, nor in a checkpoint "
            "of a stopped run). Pass the output folder of `stackwise train` or `stackwise "
            "finetune` (train.output_dir, outputs/<run> by default)."
        )
    config = read_yaml(found, DAMAGED)
    if not isinstance(config, dict):
        raise StackWiseError(f"'{found}' holds no config (a mapping of sections). {DAMAGED}")
    return config, str(found.relative_to(path))


class RunExtras:
    """The run's optional files (eval, samples, machine, adapter): a damaged one leaves its
    section out of the page with a note, rather than stopping the report."""

    def __init__(self, path: Path) -> None:
        self.path, self.notes = path, []

    def read(self, name: str | Path, kind: type = dict) -> Any:
        path = self.path / name
        if not path.is_file():
            return None
        fix = "Delete it or write it again (`stackwise eval` writes the eval files)."
        try:
            value = read_json(path, fix)
            if not isinstance(value, kind):
                raise StackWiseError(f"'{path}' does not hold a {kind.__name__}. {fix}")
        except StackWiseError as err:
            self.notes.append(f"{path.name} left out: {err}")
            return None
        return value

    def samples(self) -> list[str]:
        kept = self.read(SAMPLES_FILE) or {}
        texts = kept.get("samples", [])
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            self.notes.append(f"{SAMPLES_FILE} left out: it does not hold a list of texts.")
            return []
        return texts

    def samplers(self) -> list[dict[str, Any]]:
        rows = self.read("eval_samplers.json", list) or []
        return [r for r in rows if isinstance(r, dict)]


def load_run(folder: str | Path) -> Run:
    """The run in `folder`; a clear error when it is not a StackWise run folder."""
    path = Path(folder).expanduser()
    if not path.is_dir():
        how = "does not exist" if not path.exists() else "is a file, not a run folder"
        raise StackWiseError(f"'{folder}' {how}. Pass the folder `stackwise train` wrote.")
    config, config_from = _config(path)
    progressive = (config.get("progressive") or {}).get("strategy") == "progressive"
    summary_file = path / ("progressive_history.json" if progressive else "history.json")
    summary = read_json(summary_file, DAMAGED) if summary_file.is_file() else {}
    stages = _stages(path, config, summary if isinstance(summary, dict) else {})
    if not any(s.rows for s in stages):
        raise StackWiseError(
            f"'{folder}' holds no logged metrics ({METRICS_FILE} is missing or empty, and no "
            "history.json holds an eval): the run was trained with logging.jsonl off, or "
            "stopped before its first log row. Turn logging.jsonl on (the default) and train "
            "again to report it."
        )
    extra = RunExtras(path)
    adapter = "final/adapter_config.json"
    return Run(
        path=path,
        name=path.name,
        config=config,
        stages=stages,
        summary=summary,
        env=extra.read(ENV_FILE) or extra.read(f"stack_0/{ENV_FILE}"),
        eval=extra.read("eval.json"),
        samplers=extra.samplers(),
        samples=extra.samples(),
        adapter=extra.read(adapter if (path / adapter).is_file() else "adapter_config.json"),
        complete=(path / "run_complete.json").is_file(),
        config_from=config_from,
        notes=extra.notes,
    )


def unique_names(runs: list[Run]) -> None:
    """Runs in folders of the same name get their parent folder in front, so legends differ."""
    names = [r.name for r in runs]
    for run in runs:
        if names.count(run.name) > 1:
            run.name = f"{run.path.parent.name}/{run.path.name}"
