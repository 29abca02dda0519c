"""Launched processes: what `accelerate launch --use_fsdp` asks for, read from the environment
it sets, and how a launched process exits (`leave`, light enough for every command's exit).

Accelerate describes an FSDP launch in `ACCELERATE_USE_FSDP` and `FSDP_*` variables and, on a
CPU, quietly runs DDP instead. StackWise shards with FSDP2 itself (stackwise.parallel.fsdp), so
the launch is read once, turned into `parallel.*` settings, and the variables are removed
before an Accelerator is built: Accelerate then only starts the processes.
"""

from __future__ import annotations

import os
import sys
from typing import Any, NoReturn

FSDP_ENV = "ACCELERATE_USE_FSDP"
_SHARDING_NAMES = {
    "1": "full_shard",
    "2": "shard_grad_op",
    "3": "no_shard",
    "4": "hybrid_shard",
    "FULL_SHARD": "full_shard",
    "SHARD_GRAD_OP": "shard_grad_op",
    "NO_SHARD": "no_shard",
    "HYBRID_SHARD": "hybrid_shard",
}
_read: list[dict[str, Any] | None] = []


def _true(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes")


def fsdp_launch() -> dict[str, Any] | None:
    """The parallel settings an FSDP launch asks for (sharding, cpu_offload and activation
    checkpointing), or None for any other launch; read once per process."""
    if _read:
        return _read[0]
    env = os.environ
    found: dict[str, Any] | None = None
    if _true(env.get(FSDP_ENV)):
        found = {"sharding": _launch_sharding(env)}
        found["cpu_offload"] = _true(env.get("FSDP_OFFLOAD_PARAMS"))
        found["activation_checkpointing"] = _true(env.get("FSDP_ACTIVATION_CHECKPOINTING"))
    _read.append(found)
    return found


def _launch_sharding(env: Any) -> str | None:
    """The sharding a launch asks for. Accelerate always exports both variables (defaults
    FULL_SHARD and true): keeping parameters after forward (`--fsdp_reshard_after_forward
    false`, or FSDP1's SHARD_GRAD_OP / NO_RESHARD there) is shard_grad_op; otherwise
    `--fsdp_sharding_strategy` decides."""
    reshard = env.get("FSDP_RESHARD_AFTER_FORWARD", "").strip().upper()
    if reshard in ("FALSE", "SHARD_GRAD_OP", "NO_RESHARD"):
        return "shard_grad_op"
    raw = env.get("FSDP_SHARDING_STRATEGY", "").strip().upper()
    if not raw:
        return None
    if raw not in _SHARDING_NAMES:
        from stackwise.errors import StackWiseError

        raise StackWiseError(
            f"accelerate launch asked for FSDP sharding '{raw}', which FSDP2 does not offer "
            "here. Pick FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD or NO_SHARD "
            "(--fsdp_sharding_strategy), or set parallel.sharding in the config."
        )
    return _SHARDING_NAMES[raw]


def hide_fsdp_launch() -> None:
    """Remove the FSDP launch variables (after reading them), so Accelerate does not take
    over the placement of a model StackWise shards itself."""
    fsdp_launch()
    for name in list(os.environ):
        if name == FSDP_ENV or name.startswith("FSDP_"):
            del os.environ[name]


def forget_launch() -> None:
    """Read the environment again at the next call (tests that set it)."""
    _read.clear()


def without_launcher_rank(argv: list[str]) -> list[str]:
    """`argv` without the `--local_rank=N` (or `--local_rank N`) the deepspeed launcher adds
    to each process's arguments; the rank it names goes to LOCAL_RANK when that is unset."""
    kept: list[str] = []
    rest = iter(argv)
    for arg in rest:
        if arg == "--local_rank":
            arg = f"--local_rank={next(rest, '0')}"
        if arg.startswith("--local_rank="):
            os.environ.setdefault("LOCAL_RANK", arg.split("=", 1)[1])
            continue
        kept.append(arg)
    return kept


def leave(code: int) -> NoReturn:
    """Exit with `code`. A process of a multi-process launch ends with os._exit once its output
    is flushed: gloo's threads, torn down with the interpreter, now and then abort a finished
    process ("terminate called without an active exception", SIGABRT) even after its process
    group was destroyed (about 1 run in 8 of two FSDP processes here), and torchrun then
    reports the whole run as failed."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and "torch.distributed" in sys.modules:
        import logging

        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
