"""The one exception type for user mistakes.

The CLI prints a StackWiseError as a single paragraph and exits non-zero; anything else is a bug
and keeps its traceback.
"""


class StackWiseError(Exception):
    """A problem the user can fix: the message names it and says how."""


LR_FIND_UNDER_DEEPSPEED = (
    "lr-find changes the learning rate step by step and restores the model afterwards, which "
    "DeepSpeed's engine (parallel.strategy: deepspeed) does not let it do. Run lr-find with "
    "parallel.strategy: ddp or fsdp: the rate it finds holds for the same model and batch "
    "under DeepSpeed."
)


def deepspeed_missing(asked: str) -> str:
    """Why a run that asks for DeepSpeed (`asked`: the key that does) cannot start here."""
    return (
        f"{asked} asks for DeepSpeed ZeRO, an optional extra that is not installed. Install it "
        "next to the torch you have (its build must not fetch another): pip install "
        "--no-build-isolation 'stackwise[deepspeed]'. Or shard with FSDP2, which needs "
        "nothing more: parallel.strategy: fsdp with parallel.sharding: full_shard (ZeRO-3) or "
        "shard_grad_op (ZeRO-2), parallel.cpu_offload: true for ZeRO's offload."
    )
