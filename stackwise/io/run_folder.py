"""Which folder holds a saved run: a run folder or one of its checkpoint-<step> folders, and
why a folder is neither, with what to pass instead. No torch here: the CLI refuses a mistyped
path before it spends seconds loading torch."""

from __future__ import annotations

import re
from pathlib import Path

from stackwise.errors import StackWiseError

LATEST = "latest"  # a one-line file naming the newest complete checkpoint
STATE = "trainer_state.json"
# what only a checkpoint folder holds (beside trainer_state.json)
CHECKPOINT_FILES = {"optimizer.bin", "scheduler.bin", "rng_state_0.json"}
STAGE_DIR = re.compile(r"^(stack_\d+|joint)$")  # where a progressive run keeps stage folders


def run_folder_of(folder: Path) -> tuple[Path, Path]:
    """(the folder holding config.yaml and weights, its tokenizer dir): a run folder, or one
    of its checkpoint-<step> folders, whose tokenizer is the run's."""
    if not (folder / STATE).is_file():
        if CHECKPOINT_FILES & {p.name for p in folder.iterdir()}:
            raise StackWiseError(
                f"'{folder}' is an incomplete checkpoint: its {STATE} is missing (the save was "
                "cut short, or the file was deleted). Use another checkpoint of the run "
                f"('{LATEST}' names the newest complete one), or the finished run folder."
            )
        return folder, folder / "tokenizer"
    if STAGE_DIR.match(folder.parent.name):
        raise StackWiseError(
            f"'{folder}' is a checkpoint of one progressive stage ({folder.parent.name}): it "
            "holds that stage's training state, not a rack to sample from. Generate from the "
            f"run folder '{folder.parent.parent}' once the run has finished (resume it with "
            "train.resume_from_checkpoint=latest)."
        )
    tokenizer = folder.parent / "tokenizer"
    if not tokenizer.is_dir():
        raise StackWiseError(
            f"'{folder}' is a checkpoint, and a checkpoint reads its tokenizer from the run "
            f"folder around it, but '{folder.parent}' has no tokenizer/ folder (was the "
            "checkpoint moved out of its run?). Pass it where `stackwise train` wrote it "
            "(RUN/checkpoint-N), or copy the run's tokenizer/ folder beside it."
        )
    return folder, tokenizer


def not_a_run(folder: Path) -> str:
    """Why `folder` cannot be loaded as a trained run, and what to pass instead."""
    if not folder.exists():
        return f"'{folder}' does not exist. Pass the folder that `stackwise train` wrote."
    if not folder.is_dir():
        return (
            f"'{folder}' is a file, but a run is a folder (the output dir that `stackwise "
            "train` or `finetune` wrote, or one of its checkpoint-<step> folders). Pass the folder."
        )
    latest = folder / LATEST
    if latest.is_file() and not (folder / "run_complete.json").is_file():
        name = latest.read_text(encoding="utf-8").strip()
        return (
            f"The run in '{folder}' has not finished (no config.yaml or run_complete.json yet), "
            f"so it holds no final model. Sample its latest checkpoint, '{folder / name}', or "
            "resume the run."
        )
    if (folder / "config.json").is_file():  # `merge-lora`'s output, or any hub model folder
        return (
            f"'{folder}' holds a Hugging Face model (config.json), not a StackWise run (no "
            "config.yaml): load it with transformers (AutoModelForCausalLM.from_pretrained), "
            "or fine-tune it with `stackwise finetune --model_name_or_path` and sample that run."
        )
    return (
        f"'{folder}' is not a StackWise output dir (no config.yaml). Pass the folder that "
        "`stackwise train` wrote."
    )


def run_paths(folder: str | Path) -> tuple[Path, Path]:
    """(the folder holding config.yaml and weights, its tokenizer dir) of a saved run or one of
    its checkpoints; a folder that is neither is refused with what to pass instead."""
    folder = Path(folder).expanduser()
    if not (folder / "config.yaml").is_file():
        raise StackWiseError(not_a_run(folder))
    return run_folder_of(folder)
