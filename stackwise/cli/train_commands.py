"""The commands that train: `stackwise train` and the LR range test `stackwise lr-find`."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from stackwise.cli.common import load_args, printable, run_summary, split_args
from stackwise.errors import LR_FIND_UNDER_DEEPSPEED, StackWiseError


def cmd_train(ns: argparse.Namespace) -> int:
    """Train from CONFIG (a YAML/JSON file or a preset name, also given as --config FILE;
    default DEFAULT_PRESET) with dotted overrides such as train.max_steps=100. Several
    processes: `torchrun --nproc_per_node N -m stackwise train ...` or `accelerate launch
    --num_processes N -m stackwise train ...` (with --multi_gpu where there is no GPU)."""
    config = load_args(with_config_flag(ns))  # a bad config is refused before torch loads
    from stackwise.generate import sample_texts
    from stackwise.pipeline import train_from_config

    start = time.monotonic()
    result = train_from_config(config)
    if not result.trainer.accelerator.is_main_process:  # under torchrun, rank 0 reports
        return 0
    n, hf = config.sample.num_samples, config.model.source == "hf"
    print(f"Saved the {'fine-tuned model' if hf else 'trained rack'} to {result.output_dir}")
    if config.data.mode == "instruction":
        from stackwise.cli.hf_commands import show_replies

        show_replies(result, n)
    elif n:
        texts = sample_texts(result.config, result.rack.eval(), result.data.tokenizer, n=n)
        for i, text in enumerate(texts):
            print(f"--- sample {i + 1} ---\n{printable(text.strip())}")
        keep_samples(result.output_dir, texts)
    print(run_summary(result, time.monotonic() - start))
    if ns.report:
        from stackwise.report import write_report

        print(f"report: {write_report([result.output_dir])}")
    return 0


def keep_samples(folder: Path, texts: list[str]) -> None:
    """samples.json: the end-of-run samples, which the report shows."""
    import json

    from stackwise.io.files import write_atomic

    write_atomic(folder / "samples.json", json.dumps({"samples": texts}, indent=1))


def with_config_flag(ns: argparse.Namespace) -> list[str]:
    """The arguments with --config FILE as CONFIG (given once: as the flag or in front)."""
    given = getattr(ns, "config_file", None)
    if given is None:
        return list(ns.args)
    if split_args(ns.args)[0] is not None:
        raise StackWiseError(
            f"The config is given twice: --config {given} and '{ns.args[0]}' in front. Give "
            "it once; what follows it are key=value overrides."
        )
    return [given, *ns.args]


def _plot_folder_made(plot: str | None) -> Path | None:
    """--plot's path, its folder made before the sweep: a bad path must not waste it."""
    if not plot:
        return None
    path = Path(plot).expanduser()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise StackWiseError(
            f"Cannot create the folder of --plot '{path}': {err.strerror or err}. Pick a "
            "writable path."
        ) from None
    return path


def cmd_lr_find(ns: argparse.Namespace) -> int:
    """Train briefly from CONFIG while the LR grows exponentially, print the LR where the loss
    falls fastest and save a plot. The model is restored afterwards; progressive configs are
    swept on the whole rack."""
    from datetime import datetime

    if not (0 < ns.min_lr < ns.max_lr) or ns.steps < 2:
        raise StackWiseError(
            f"lr-find needs 0 < --min-lr < --max-lr and --steps >= 2 (got {ns.min_lr}, "
            f"{ns.max_lr}, {ns.steps})."
        )
    config = load_args(ns.args)
    from stackwise.config.rules_deepspeed import runs_deepspeed

    if runs_deepspeed(config):
        raise StackWiseError(LR_FIND_UNDER_DEEPSPEED)  # now, not after the engine is built
    if config.train.output_dir is None:
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        from stackwise.config import derive

        config = derive(config, {"train.output_dir": f"outputs/lr-find-{stamp}"}, "lr-find")
    plot_path = _plot_folder_made(ns.plot)
    from stackwise.pipeline import trainer_of  # after every check: torch takes seconds to load
    from stackwise.train.lr_find import lr_find

    trainer = trainer_of(config)
    result = lr_find(trainer, ns.min_lr, ns.max_lr, ns.steps)
    plot = result.plot(plot_path or trainer.output_dir / "lr_find.png")
    _drop_if_only_lock(trainer.output_dir)
    print(
        f"swept {len(result.lrs)} steps from {ns.min_lr:.1e} to {result.lrs[-1]:.1e}"
        + (" (stopped: the loss diverged)" if result.stopped_early else "")
    )
    print(f"plot: {plot}")
    print(f"suggested lr: {result.suggestion:.2e}")
    for warning in result.warnings():
        print(f"stackwise: warning: {warning}", file=sys.stderr)
    return 0


def _drop_if_only_lock(folder: Path) -> None:
    """lr-find claims an output folder like any run; one that got nothing else is removed."""
    from stackwise.io.lock import LOCK, release_run_folder

    release_run_folder(folder)
    if folder.is_dir() and [p.name for p in folder.iterdir()] == [LOCK]:
        (folder / LOCK).unlink()
        folder.rmdir()
