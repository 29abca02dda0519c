"""The DeepSpeed config a run hands to `deepspeed.initialize`: the user's JSON file (the seeds'
`--deepspeed_config`) for what StackWise does not set itself, with StackWise's own settings
(batch, accumulation, clipping, ZeRO stage and offload from the parallel section) filled in.

A key the file and train.* both set must agree, or be "auto" (the Hugging Face convention):
two sources of one setting would leave one of them doing nothing. The file's optimizer and
scheduler sections are refused for the same reason: train.* builds both.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from stackwise.errors import StackWiseError

STAGES = {"full_shard": 3, "shard_grad_op": 2, "no_shard": 0}
OWNED = {  # the file's key -> the train.* setting that owns it
    "train_micro_batch_size_per_gpu": "train.batch_size",
    "gradient_accumulation_steps": "train.grad_accum_steps",
    "gradient_clipping": "train.max_grad_norm",
}
BUILT = {"optimizer": "train.optimizer, train.lr", "scheduler": "train.scheduler"}


def read_file(path: str) -> dict[str, Any]:
    """The JSON object in `path`, or a one-paragraph error naming what is wrong with it."""
    file = Path(path).expanduser()
    fix = "Point parallel.deepspeed_config (--deepspeed_config) at a DeepSpeed JSON config."
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StackWiseError(f"DeepSpeed config '{path}' does not exist. {fix}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise StackWiseError(f"DeepSpeed config '{path}' cannot be read ({err}). {fix}") from None
    if not isinstance(data, dict):
        raise StackWiseError(f"DeepSpeed config '{path}' holds no JSON object. {fix}")
    return data


def _given(value: Any) -> bool:
    return value is not None and value != "auto"


def conflicts(data: dict[str, Any], train: Any, sharding: str | None) -> Iterator[str]:
    """Where the file and StackWise's settings disagree, each with its fix."""
    ours = {
        "train_micro_batch_size_per_gpu": train.batch_size,
        "gradient_accumulation_steps": train.grad_accum_steps,
        "gradient_clipping": train.max_grad_norm,
    }
    for key, owner in OWNED.items():
        if _given(data.get(key)) and data[key] != ours[key]:
            yield (
                f"the DeepSpeed config sets {key}: {data[key]} and {owner} is {ours[key]}; "
                f'set it to "auto" (StackWise fills it in from {owner}), to {ours[key]}, or '
                "remove it"
            )
    for key, owner in BUILT.items():
        if key in data:
            yield (
                f"the DeepSpeed config has a '{key}' section, and StackWise builds the "
                f"{key} from {owner}; remove the section and set those keys"
            )
    for name in ("fp16", "amp"):
        if _given((data.get(name) or {}).get("enabled")) and data[name]["enabled"]:
            yield f"the DeepSpeed config enables {name}; use train.mixed_precision: bf16"
    bf16 = (data.get("bf16") or {}).get("enabled")
    if _given(bf16) and bool(bf16) != (train.mixed_precision == "bf16"):
        yield (
            f"the DeepSpeed config sets bf16.enabled: {bf16} and train.mixed_precision is "
            f'{train.mixed_precision}; set bf16.enabled to "auto" and choose with '
            "train.mixed_precision"
        )
    stage = (data.get("zero_optimization") or {}).get("stage")
    if sharding is not None and _given(stage) and stage != STAGES.get(sharding):
        yield (
            f"the DeepSpeed config asks for ZeRO stage {stage} and parallel.sharding "
            f"{sharding} is stage {STAGES.get(sharding)}; keep one of the two"
        )


def zero_stage(data: dict[str, Any], sharding: str | None) -> int:
    """parallel.sharding's stage, else the file's, else 3 (shard everything)."""
    if sharding is not None:
        return STAGES[sharding]
    stage = (data.get("zero_optimization") or {}).get("stage")
    return int(stage) if _given(stage) else 3


def build(data: dict[str, Any], train: Any, sharding: str | None, offload: bool) -> dict:
    """The config deepspeed.initialize gets (train_batch_size only where the file gives one:
    DeepSpeed derives it from the process count, and checks a given one). Precision stays
    StackWise's autocast over fp32 master weights, as under DDP and FSDP; DeepSpeed's own
    fp16/bf16 engines are off."""
    stage = zero_stage(data, sharding)
    zero = {**(data.get("zero_optimization") or {}), "stage": stage}
    if offload:
        zero["offload_optimizer"] = {"device": "cpu"}
        if stage == 3:
            zero["offload_param"] = {"device": "cpu"}
    kept = {k: v for k, v in data.items() if k not in (*OWNED, "bf16")}
    if not _given(kept.get("train_batch_size")):
        kept.pop("train_batch_size", None)
    return {
        **kept,
        "train_micro_batch_size_per_gpu": train.batch_size,
        "gradient_accumulation_steps": train.grad_accum_steps,
        "gradient_clipping": float(train.max_grad_norm),
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,  # train.optimizer's torch optimizer
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": data.get("steps_per_print", 1 << 30),  # StackWise logs the steps
    }
