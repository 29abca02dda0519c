"""The door for saved runs: a run folder's config.yaml is read here, and only here.

`read_plan` loads it with `stackwise.config.load_config` (the seeds' aliases, old keys and every
rule, exactly as a config the user wrote) and compiles it with `compile_plan` into the run's
frozen Plan; io (racks) and hf (fine-tunes) build what they load from that Plan and never import
the config. Everything that opens a saved run goes through one of the functions below.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from stackwise.config import Config, from_dict, load_config
from stackwise.plan import compile_plan
from stackwise.spec import Plan

if TYPE_CHECKING:
    import torch

CONFIG_FILE = "config.yaml"


def read_config(folder: str | Path) -> Config:
    """The validated config of the saved run (or checkpoint) in `folder`, as today's loader
    reads it: for the few callers above the pipeline that still change it (sampling flags)."""
    return load_config(Path(folder).expanduser() / CONFIG_FILE)


def read_plan(folder: str | Path) -> Plan:
    """The Plan of the saved run (or checkpoint) in `folder`: its config.yaml through the
    door. A saved run is not trained again, so the plan has no stages."""
    return compile_plan(read_config(folder))


def config_of(plan: Plan) -> Config:
    """The validated config a plan was compiled from (its `source`, validated again), for the
    callers not yet on specs."""
    return from_dict(plan.source or {}, "the run's config.yaml")


def load_trained(folder: str | Path, device: torch.device | str = "cpu") -> tuple[Plan, Any, Any]:
    """(plan, rack, tokenizer) of the run `stackwise train` wrote in `folder` (or one of its
    checkpoint-<step> folders)."""
    from stackwise.io.trained import load_trained as load

    return load(folder, read_plan, device)


def load_finetuned(folder: str | Path, trust_remote_code: bool = False) -> tuple[Plan, Any, Any]:
    """(plan, model, tokenizer) of a Hugging Face fine-tune (`stackwise finetune`) in `folder`
    or one of its checkpoints."""
    from stackwise.hf.outputs import load_finetuned as load

    folder = Path(folder).expanduser()
    return load(folder, read_plan(folder), trust_remote_code)


def merge_checkpoint(src: str | Path, out: str | Path, requantize: bool = False) -> Any:
    """`stackwise merge-lora` on a rack run: its MergeReport (stackwise.io.merge)."""
    from stackwise.io.merge import merge_checkpoint as merge

    return merge(src, out, requantize, read_plan=read_plan, check=_merged_config)


def _merged_config(source: dict[str, Any]) -> Config:
    """The merged rack's config.yaml, validated like any config before it is written."""
    return from_dict(source, "the merged rack's config")


def merge_finetuned(
    run: str | Path, out: str | Path, trust_remote_code: bool = False
) -> dict[str, float]:
    """`stackwise merge-lora` on a fine-tune: base + adapter merged into OUT; the largest
    logit difference (stackwise.hf.outputs.merge_run)."""
    from stackwise.hf.outputs import merge_run

    run = Path(run).expanduser()
    plan = read_plan(run)
    return merge_run(run, Path(out), config=plan, trust_remote_code=trust_remote_code)


def export_hf(run: str | Path, out: str | Path) -> Path:
    """`stackwise export-hf`: RUN's rack as a Hugging Face Llama folder OUT."""
    from stackwise.io.hf_llama import export_hf as export

    return export(run, out, read_plan=read_plan)
