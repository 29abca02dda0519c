"""The one exception type for user mistakes.

The CLI prints a StackWiseError as a single paragraph and exits non-zero; anything else is a bug
and keeps its traceback.
"""


class StackWiseError(Exception):
    """A problem the user can fix: the message names it and says how."""


def fsdp_unavailable(asked: str) -> str:
    """Why a run that asks for FSDP (`asked` says how) is refused, and what to run instead."""
    return (
        f"{asked} asks for FSDP (fully sharded data parallel), which StackWise does not run "
        "yet: sharded training arrives with issue 32. Until then a multi-process run uses DDP, "
        "which keeps a whole copy of the model on every process; Accelerate would quietly fall "
        "back to DDP on a CPU, so the request is refused rather than ignored. Train with DDP: "
        "set training.distributed_strategy: ddp (our train.parallelizer) or leave it out, and "
        "launch without --use_fsdp, e.g. `accelerate launch --num_processes 4 -m stackwise "
        "train --config FILE`."
    )
