"""Rules inside one section: each yields what is wrong and how to fix it.

A field that only matters for some settings (say `mask_ratio` with a causal objective) is
refused when changed from its default while irrelevant, so a key never silently does nothing.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from typing import Any

from stackwise.config.base import section_rule
from stackwise.config.sections import DataConfig, MaskingConfig
from stackwise.config.sections_model import ModelConfig
from stackwise.config.sections_train import LoggingConfig, TrainConfig


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


@section_rule("ModelConfig")
def model_shapes(s: ModelConfig) -> Iterator[str]:
    if s.d_model % s.n_heads:
        divisors = _divisors(s.d_model)
        # the counts nearest the one given whose head size is even (RoPE); odd d_model: any
        valid = [h for h in divisors if (s.d_model // h) % 2 == 0] or divisors
        fits = sorted(sorted(valid, key=lambda h: (abs(h - s.n_heads), h))[:4])
        yield (
            f"n_heads ({s.n_heads}) must divide d_model ({s.d_model}); head counts that "
            f"divide it: {', '.join(map(str, fits))}"
        )
    elif (s.d_model // s.n_heads) % 2:
        yield (f"head size d_model/n_heads = {s.d_model // s.n_heads} must be even for RoPE")
    if s.n_kv_heads is not None and s.n_heads % s.n_kv_heads:
        yield (f"n_kv_heads ({s.n_kv_heads}) must divide n_heads ({s.n_heads}) for GQA")


SOURCES = ("files", "dataset_dir", "dataset_name")


def one_source(s: Any, where: str, required: bool) -> Iterator[str]:
    """The rows' source in `s` (data, or an entry of data.mix): at most one (exactly one when
    `required`) of files, dataset_dir, dataset_name; subset and split only with a name."""
    given = [n for n in SOURCES if s.changed(n)]
    if len(given) > 1 or (required and not given):
        yield (
            f"{where} needs exactly one of {where}.files, {where}.dataset_dir or "
            f"{where}.dataset_name (it reads rows from exactly one, not both); given: "
            f"{', '.join(given) or 'none'}"
        )
    if (s.dataset_subset is not None or s.changed("dataset_split")) and not s.dataset_name:
        yield (
            f"{where}.dataset_subset and {where}.dataset_split only apply with {where}.dataset_name"
        )


def _mix_rules(s: DataConfig) -> Iterator[str]:
    if not s.mix:
        return
    for name in SOURCES:
        if s.changed(name):
            yield f"data.{name} and data.mix both name the data: move data.{name} into an entry"
    if len(s.mix) < 2:
        yield "data.mix mixes two or more sources; for one, set data.files (or dataset_*) instead"
    for i, m in enumerate(s.mix):
        yield from one_source(m, f"data.mix.{i}", required=True)


@section_rule("DataConfig")
def data_sources(s: DataConfig) -> Iterator[str]:
    # instruction rows may arrive with the run (ModelTrainer.train(train_file=...)); a run
    # without any is refused when it starts (stackwise.pipeline.prepared)
    yield from one_source(s, "data", required=False)
    if s.mode == "instruction":
        return  # its other rules: rules_hf.data_mode
    yield from _mix_rules(s)
    if s.source == "files" and not any(s.changed(n) for n in SOURCES) and not s.mix:
        yield "source 'files' needs data.files: [path, ...] (or data.dataset_dir, dataset_name)"
    if s.source == "files" and not s.files and s.changed("format"):
        yield "data.format reads data.files; datasets bring their own format. Remove it"
    if s.source == "shakespeare":
        for name in ("files", "dataset_dir", "dataset_name", "mix", "format", "text_field"):
            if s.changed(name):
                yield (
                    f"data.{name} only applies to source: files (the built-in corpus is "
                    "plain text); set data.source: files or remove it"
                )
    for name in ("bpe_vocab_size", "bpe_sample_mb"):
        if s.tokenizer is not None and s.changed(name):
            yield (
                f"{name} only applies to the BPE trained when data.tokenizer is unset; "
                "remove one of them"
            )


@section_rule("MaskingConfig")
def masking_table(s: MaskingConfig) -> Iterator[str]:
    """The time grid: eps, and the per-step fractions of schedule 'table'."""
    if s.num_time_steps is not None and s.schedule != "loglinear" and s.changed("eps"):
        yield (
            "masking.eps bounds continuous t; with num_time_steps t lies on a grid, so eps "
            "has no effect (except in the loglinear schedule); remove it"
        )
    yield from _time_grid(s)
    table = s.time_step_mask_fractions
    if s.schedule == "table":
        if not table or s.num_time_steps is None:
            yield (
                "schedule 'table' needs num_time_steps and time_step_mask_fractions "
                "(e.g. {0: 0.15, 5: 0.5, 9: 0.9})"
            )
            return
        steps = sorted(table)
        if steps[0] < 0 or steps[-1] >= s.num_time_steps:
            yield (f"time_step_mask_fractions steps must lie in 0..{s.num_time_steps - 1}")
        fracs = [table[k] for k in steps]
        if any(not 0.0 < f <= 1.0 for f in fracs):
            yield "time_step_mask_fractions values must be in (0, 1]"
        if any(b < a for a, b in itertools.pairwise(fracs)):
            yield "time_step_mask_fractions must not decrease with the step"
    elif table is not None:
        yield "time_step_mask_fractions needs schedule: table"


def _time_grid(s: MaskingConfig) -> Iterator[str]:
    """masking.time_step_masking and the grid steps training draws from."""
    if s.time_step_masking is False:
        for name in ("num_time_steps", "time_step_bins", "time_step_mask_fractions"):
            if s.changed(name):
                yield (
                    f"masking.{name} describes the discrete time grid, but "
                    "time_step_masking is false (continuous t); remove it, or set "
                    "time_step_masking: true"
                )
        return
    bins = s.time_step_bins
    if bins is None:
        return
    if s.num_time_steps is None:
        yield "masking.time_step_bins picks grid steps: set num_time_steps (or time_step_masking)"
    elif not bins or any(b >= s.num_time_steps for b in bins):
        yield f"masking.time_step_bins must list grid steps in 0..{s.num_time_steps - 1}"
    if len(set(bins)) != len(bins):
        yield "masking.time_step_bins lists a step twice"


@section_rule("TrainConfig")
def train_schedule(s: TrainConfig) -> Iterator[str]:
    """The LR schedule, best-model tracking, checkpoint rotation and the extensions listed."""
    yield from _lr_schedule(s)
    yield from _best_tracking(s)
    yield from _checkpoint_rotation(s)
    yield from _extension_names(s)
    if _tracks_best(s) and s.eval_every > s.max_steps:
        yield (
            f"save_best_model / early stopping act on evaluations, but eval_every "
            f"({s.eval_every}) exceeds max_steps ({s.max_steps}); lower eval_every"
        )


def _lr_schedule(s: TrainConfig) -> Iterator[str]:
    """Warmup and decay keys the chosen scheduler reads."""
    if s.warmup_ratio is not None and s.warmup_steps:
        yield "set warmup_steps or warmup_ratio, not both"
    if s.scheduler == "constant":
        for name in ("warmup_steps", "warmup_ratio"):
            if s.changed(name):
                yield (
                    f"scheduler 'constant' has no warmup; use "
                    f"'constant_with_warmup' or remove {name}"
                )
    if s.scheduler in ("constant", "constant_with_warmup") and s.changed("min_lr_ratio"):
        yield (
            f"min_lr_ratio has no effect with scheduler '{s.scheduler}'; "
            f"{_restore(s, 'min_lr_ratio')}"
        )
    if s.scheduler != "polynomial" and s.changed("poly_power"):
        yield f"poly_power only applies to scheduler: polynomial; {_restore(s, 'poly_power')}"
    if s.scheduler != "wsd" and s.changed("decay_ratio"):
        yield f"decay_ratio only applies to scheduler: wsd; {_restore(s, 'decay_ratio')}"


def _restore(s: TrainConfig, name: str) -> str:
    """The fix for a key that does nothing here, which may come from a preset."""
    default = type(s).model_fields[name].get_default()
    return f"remove it, or set train.{name}={default} (its default) when overriding a preset"


def _tracks_best(s: TrainConfig) -> bool:
    """Whether the run follows metric_for_best (to save the best model or stop early)."""
    return s.save_best_model or s.stopping_patience() is not None


def _best_tracking(s: TrainConfig) -> Iterator[str]:
    """The metric keys need something that reads them."""
    for name in ("metric_for_best", "greater_is_better"):
        if s.changed(name) and not _tracks_best(s):
            yield (f"{name} is read by save_best_model and early stopping; turn one of them on")
    if s.changed("early_stopping_threshold") and s.stopping_patience() is None:
        yield "early_stopping_threshold needs early stopping: set early_stopping_patience"


def _checkpoint_rotation(s: TrainConfig) -> Iterator[str]:
    """Checkpoints must be written for their limit to mean anything."""
    if s.save_total_limit is not None and not (s.save_steps or s.save_best_model):
        yield (
            "save_total_limit rotates checkpoints, but none are written: set save_steps "
            "(or save_best_model)"
        )
    if s.save_steps > s.max_steps:
        yield (
            f"save_steps ({s.save_steps}) exceeds max_steps ({s.max_steps}), so no "
            "checkpoint would ever be written; lower it (0 turns checkpoints off)"
        )


# built-in extensions, each turned on by its own setting rather than by enabled_extensions
BUILTIN_EXTENSIONS = {
    "best_model": "save_best_model: true",
    "early_stopping": "early_stopping (or early_stopping_patience)",
    "console": "logging.console",
    "jsonl": "logging.jsonl",
    "tensorboard": "logging.tensorboard",
    "wandb": "logging.log_to_wandb",
    "progress_bar": "logging.progress_bar",
}


def _extension_names(s: TrainConfig) -> Iterator[str]:
    """enabled_extensions names each extension once and no built-in one."""
    for name in s.enabled_extensions:
        if name in BUILTIN_EXTENSIONS:
            yield (
                f"enabled_extensions lists the built-in '{name}', which its own setting "
                f"turns on ({BUILTIN_EXTENSIONS[name]}); remove it from the list"
            )
    if len(set(s.enabled_extensions)) != len(s.enabled_extensions):
        yield "enabled_extensions lists an extension twice"


@section_rule("LoggingConfig")
def logging_wandb(s: LoggingConfig) -> Iterator[str]:
    if s.changed("wandb_project") and not s.log_to_wandb:
        yield "wandb_project needs log_to_wandb: true"
    if s.log_to_wandb:
        import importlib.util

        if importlib.util.find_spec("wandb") is None:
            yield (
                "log_to_wandb is on but wandb is not installed: pip install wandb (set "
                "WANDB_MODE=offline to log without an account), or turn it off"
            )
