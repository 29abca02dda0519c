"""The one exception type for user mistakes.

The CLI prints a StackWiseError as a single paragraph and exits non-zero; anything else is a bug
and keeps its traceback.
"""


class StackWiseError(Exception):
    """A problem the user can fix: the message names it and says how."""


def deepspeed_unavailable(asked: str = "") -> str:
    """Why a run that asks for DeepSpeed (`asked` says where, if not the key being read) is
    refused, and what to run."""
    return (
        f"{asked + ' asks for ' if asked else ''}DeepSpeed ZeRO, which StackWise does not run "
        "yet, so a DeepSpeed setting would only be ignored. Shard with FSDP2 "
        "instead: parallel.strategy: fsdp (the seeds' distributed_strategy: fsdp) with "
        "parallel.sharding: full_shard (ZeRO-3) or shard_grad_op (ZeRO-2), and "
        "parallel.cpu_offload: true for ZeRO's offload; launch with `torchrun "
        "--nproc_per_node N -m stackwise train --config FILE`."
    )
