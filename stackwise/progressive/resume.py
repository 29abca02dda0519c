"""Resuming a progressive run: the history written after every stage, and growing back from it.

`progressive_history.json` holds each finished stage's record and every rank's RNG state as the
stage ended. A resumed run regrows those stacks, loads their saved weights, and restores the
RNG, so the next stack grows from the same random state as in an uninterrupted run. The
interrupted stage then resumes from its own checkpoint (or starts over).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stackwise.config import Config
from stackwise.errors import StackWiseError
from stackwise.io.checkpoints import LATEST, rng_state, set_rng_state
from stackwise.io.files import read_json, read_tensors, write_json
from stackwise.io.stack_files import ANCHOR, HISTORY, STACKS_DIR
from stackwise.progressive.records import StackRecord
from stackwise.train.interrupts import StopSignals, TrainingInterrupted, any_rank_signalled

DAMAGED = "The run was made with another config, or its files are damaged: start a new run."


def write_history(pt: Any) -> None:
    states = [rng_state()]  # every rank's, gathered: ranks may draw differently (dropout)
    if pt.accelerator.num_processes > 1:
        from accelerate.utils import gather_object

        states = gather_object(states)
    if not pt.accelerator.is_main_process:
        return
    data = {
        "stacks": [r.as_dict() for r in pt.records],
        "joint": getattr(pt, "joint", None),
        "final_eval": getattr(pt, "final", None),
        # where the global RNG stood when the last stage ended: a resumed run grows the
        # next stack from the same random state
        "rng_states": states,
    }
    write_json(pt.output_dir / HISTORY, data)


def stage_resume(config: Config, stage_dir: Path) -> str | None:
    """A stage restarts from its own latest checkpoint when this run resumes."""
    if config.train.resume_from_checkpoint and (stage_dir / LATEST).is_file():
        return "latest"
    return None


def restore_progress(pt: Any, n: int, start: int = 0) -> None:
    """Regrow the stacks whose stages finished (as the history records them), load their saved
    weights, and restore the RNG as it stood when the last of them ended. `start` stacks are
    already in place (an imported trunk); their saved state replaces the import too."""
    from stackwise.quant.layers import load_quantized_state

    path = pt.output_dir / HISTORY
    if not path.is_file():
        if (pt.output_dir / f"stack_{start}" / LATEST).is_file():
            return  # interrupted during the first stage: it resumes on its own
        raise StackWiseError(
            f"train.resume_from_checkpoint is 'latest', but '{pt.output_dir}' holds neither "
            f"{HISTORY} nor a stage checkpoint (stack_{start}/{LATEST}): nothing was saved "
            "there yet. Check train.output_dir, set train.save_steps, or start without resuming."
        )
    saved = read_json(path, DAMAGED)
    done = saved["stacks"][: n - start]
    b = pt.builder
    for index in range(start, start + len(done)):
        pt.finish_stack(pt.grow(index))
    root = pt.output_dir / STACKS_DIR
    try:  # every stack and the anchor: an imported trunk may have trained (head_policy,
        # trunk_strategy: full, trunk adapters), and its saved state is what the run reached
        b.rack.load_state_dict(read_tensors(root / ANCHOR, DAMAGED), strict=False)
        for stack in b.rack.stacks:
            g = b.growth_index(stack)
            state = read_tensors(root / f"stack_{g}.safetensors", DAMAGED)
            load_quantized_state(stack, state)
    except (KeyError, RuntimeError) as err:
        raise StackWiseError(
            f"Cannot restore the finished stacks from '{root}' ({str(err)[:160]}). {DAMAGED}"
        ) from None
    pt.records = [
        StackRecord(**{**r, "t_range": tuple(r["t_range"]) if r["t_range"] else None}) for r in done
    ]
    states = saved["rng_states"]
    if len(states) != pt.accelerator.num_processes:
        raise StackWiseError(
            f"'{path}' was written by {len(states)} processes and this run has "
            f"{pt.accelerator.num_processes}; resume with the same number of processes."
        )
    set_rng_state(states[pt.accelerator.process_index])
    pt.log(f"resuming after {len(done)} finished stage(s) of {n}")


def stop_at_boundary(pt: Any, signals: StopSignals, n: int) -> None:
    """Stop between stages when a signal came while one ended or the next was being set up:
    the finished stacks and this history, which resume from there, are on disk already. Before
    any stage finished, the first stage's own checkpoint holds the work instead."""
    if not pt.records or not any_rank_signalled(pt.accelerator, signals):
        return
    raise TrainingInterrupted(
        signals.received or "SIGTERM",  # a peer rank's signal
        sum(r.steps for r in pt.records),
        pt.output_dir / HISTORY,
        pt.output_dir,
        where=f"after stack {len(pt.records)} of {n}",
    )
