"""Which Hugging Face models keep examples apart when several share a row.

transformers splits a row at its `position_ids` restarts only where the model hands its
position ids to the mask builder (the sdpa and eager masks of Llama-style models); flash
attention does it only for a batch of one row, and some architectures drop `position_ids`
altogether, so their examples would attend to each other without an error. Packing and
padding-free batches are therefore allowed only for the architectures a test checks (padded and
padding-free logits agree: tests/test_finetune.py), with sdpa or eager attention.
"""

from __future__ import annotations

import json
from pathlib import Path

from stackwise.spec import ModelSpec

VERIFIED = ("llama", "mistral", "qwen2", "qwen3")
ATTENTION = ("sdpa", "eager")


def model_type(path: str, trust_remote_code: bool) -> str:
    """The checkpoint's model_type, from its local config.json (else through transformers)."""
    local = Path(path).expanduser() / "config.json"
    if local.is_file():
        return str(json.loads(local.read_text()).get("model_type", "?"))
    from transformers import AutoConfig

    return str(AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code).model_type)


def shared_row_problem(m: ModelSpec) -> str | None:
    """Why examples sharing a row could see each other in the model `m` names, or None."""
    if m.attn_implementation not in ATTENTION:
        return (
            f"model.attn_implementation: {m.attn_implementation} keeps examples apart only in a "
            "batch of one row"
        )
    kind = model_type(m.model_name_or_path, m.trust_remote_code)
    if kind not in VERIFIED:
        return (
            f"'{kind}' models are not checked to keep examples apart in a shared row (checked: "
            f"{', '.join(VERIFIED)})"
        )
    return None
