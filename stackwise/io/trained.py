"""Saving and loading trained racks: safetensors weights, YAML config, tokenizer dir.

Loading never unpickles: weights come from safetensors, the config through yaml.safe_load.
A saved run's config.yaml is read at the door (stackwise.runs: aliases, old keys, validation)
and compiled into its Plan; what is here builds the rack from that Plan.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from stackwise.data.tokenizer import load_tokenizer_dir
from stackwise.errors import StackWiseError
from stackwise.io.files import read_tensors, save_tensors, staged, write_atomic, write_json
from stackwise.io.final import move_into
from stackwise.io.run_folder import LATEST, STAGE_DIR, run_paths
from stackwise.io.stack_files import HISTORY, needs_structure, rack_from_stacks, read_manifest
from stackwise.model.chain import CHAIN_INPUT_VERSION, DenoisingChain
from stackwise.model.rack import Rack
from stackwise.spec import Plan

if TYPE_CHECKING:
    from stackwise.data.plain_tokenizer import AnyTokenizer

WEIGHTS = "model.safetensors"
# a saved run's folder (the one holding config.yaml) -> its Plan: the door, stackwise.runs.read_plan
PlanReader = Callable[[Path], Plan]


def save_model(model: nn.Module, folder: Path) -> Path:
    """Atomic: an interrupted save leaves the previous weights (if any) in place."""
    folder.mkdir(parents=True, exist_ok=True)
    return save_tensors(model.state_dict(), folder / WEIGHTS)


def save_run(
    folder: Path, config: Plan | Any, tokenizer: AnyTokenizer | None, summary: dict
) -> None:
    """What a finished run keeps beside its weights: config.yaml (the Plan's source, or a
    config's YAML), tokenizer/, history.json."""
    write_atomic(folder / "config.yaml", config.to_yaml())
    if tokenizer is not None:
        tokenizer.save_pretrained(str(folder / "tokenizer"))
    write_json(folder / "history.json", summary)


def training_compute(folder: Path) -> dict[str, float | int] | None:
    """What training the run in `folder` spent, from the summary it left: a grown rack's
    stages and joint tuning together; None for a run saved before FLOPs were counted."""
    grown, plain = folder / HISTORY, folder / "history.json"
    if grown.is_file():
        data = json.loads(grown.read_text(encoding="utf-8"))
        parts = [*data.get("stacks", []), data.get("joint") or {}]
        if not all("flops" in p for p in parts[:-1]):
            return None
        return {
            "flops": sum(p.get("flops", 0.0) for p in parts),
            "tokens": sum(p.get("tokens", 0) for p in parts),
        }
    if plain.is_file():
        data = json.loads(plain.read_text(encoding="utf-8"))
        if "training_flops" in data:
            return {"flops": data["training_flops"], "tokens": data.get("tokens_seen", 0)}
    return None


def save_tokenizer(run_dir: Path, tokenizer: AnyTokenizer, resume: str | None = None) -> None:
    """Written when a run starts, so that its checkpoints can be sampled before it ends. A
    resumed run (`resume`: train.resume_from_checkpoint) must get the tokenizer its checkpoint
    learnt with."""
    kept = resumed_tokenizer_dir(run_dir, resume)
    if kept is not None:
        refuse_another_tokenizer(kept, tokenizer)
    failure = f"Cannot write the tokenizer into '{run_dir}': {{reason}}."
    with staged(run_dir / ".tokenizer.tmp", failure) as tmp:
        tokenizer.save_pretrained(str(tmp))
        move_into(tmp, run_dir / "tokenizer")


IDS_FROM = ("normalizer", "pre_tokenizer", "model", "added_tokens")  # what decides the ids


def same_tokenizer(a: AnyTokenizer, b: AnyTokenizer) -> bool:
    """The same ids for the same text: the vocabulary, and the Rust tokenizer's normalizer,
    pre-tokenizer, model (merges) and added tokens."""
    if a.get_vocab() != b.get_vocab():
        return False
    rust_a, rust_b = getattr(a, "backend_tokenizer", None), getattr(b, "backend_tokenizer", None)
    if rust_a is None or rust_b is None:
        return rust_a is rust_b
    spec_a, spec_b = json.loads(rust_a.to_str()), json.loads(rust_b.to_str())
    return all(spec_a.get(key) == spec_b.get(key) for key in IDS_FROM)


def resumed_tokenizer_dir(run_dir: Path, resume: str | None) -> Path | None:
    """The tokenizer folder of the run a resume continues: this folder's for `latest`, else
    the run holding the named checkpoint (another folder, when resumed into a new one)."""
    if resume is None:
        return None
    if resume == LATEST:
        return run_dir / "tokenizer"
    from stackwise.io.checkpoints import resolve_checkpoint

    try:
        checkpoint = resolve_checkpoint(resume, run_dir)
    except StackWiseError:
        return None  # the resume itself names what is missing
    stage = STAGE_DIR.match(checkpoint.parent.name)
    return (checkpoint.parent.parent if stage else checkpoint.parent) / "tokenizer"


def refuse_another_tokenizer(kept: Path, tokenizer: AnyTokenizer) -> None:
    """A run folder's tokenizer (a resumed run's) must be the one its data gives now: its
    checkpoints learnt those ids."""
    if not (kept / "tokenizer.json").is_file():
        return
    try:
        before = load_tokenizer_dir(kept)
    except StackWiseError:
        return  # damaged: written again from the data, as a new run's would be
    if same_tokenizer(before, tokenizer):
        return
    raise StackWiseError(
        f"This run's tokenizer ({kept}) is not the one its data settings give now, so the "
        "resumed model would read ids it never learnt. Resume with the data settings the run "
        "began with (its config.yaml). If the corpus is larger than data.bpe_sample_mb (64 MB "
        "by default) and the run began before that key existed, set data.bpe_sample_mb: null: "
        "the BPE is then learnt from the whole corpus, as it was."
    )


def build_rack(config: Plan | Any, vocab_size: int, memory: bool = True) -> Rack:
    """The rack of `config` (a Plan, or anything with its model, objective, masking, memory
    sections and memory_on); with its memory layers (memory extension) unless `memory` is
    False (weights imported first: model.init_from_hf)."""
    rack = Rack(config.model, vocab_size, config.objective.causal, config.masking.num_time_steps)
    if memory and config.memory_on:
        from stackwise.model.memory import attach_memory

        attach_memory(rack, config)
    return rack


def load_weights(model: nn.Module, path: Path) -> None:
    state = read_tensors(
        path, "Pass the folder that `stackwise train` wrote, restore the file, or retrain."
    )
    own = model.state_dict()
    bad = [k for k in own if k in state and own[k].shape != state[k].shape]
    missing = [k for k in own if k not in state]
    extra = [k for k in state if k not in own]
    if bad or missing or extra:
        detail = (
            f"shape mismatch at {bad[0]} ({tuple(state[bad[0]].shape)} in file vs "
            f"{tuple(own[bad[0]].shape)} in config)"
            if bad
            else f"missing {missing[:2]}"
            if missing
            else f"unexpected {extra[:2]}"
        )
        raise StackWiseError(
            f"Weights in '{path}' do not match the model built from its config: {detail}. "
            "The checkpoint was made with another model shape; use its own config.yaml."
        )
    model.load_state_dict(state)


def chain_of(config: Plan | Any, tokenizer: AnyTokenizer) -> DenoisingChain | None:
    """The denoising chain a rack grown with depth_order high_to_low runs (else None)."""
    p = config.progressive
    if p.time_interpretation != "depth" or p.depth_order != "high_to_low":
        return None
    from stackwise.data.pack import specials_of
    from stackwise.objectives import Diffusion, build_objective

    specials = specials_of(tokenizer)
    objective = build_objective(config, specials)
    assert isinstance(objective, Diffusion)
    return DenoisingChain(specials.mask_id, objective.schedule.mask_fraction)


def load_rack(
    folder: Path, plan: Plan | Any, tokenizer_dir: Path, device: torch.device | str = "cpu"
) -> tuple[Rack, AnyTokenizer]:
    """The trained rack saved in `folder` (found by run_paths), built from its `plan`, and the
    run's tokenizer."""
    tokenizer = load_tokenizer_dir(tokenizer_dir)
    vocab = plan.model.vocab_size or len(tokenizer)
    metas = read_manifest(folder)
    partial = metas is not None and len(metas) != plan.model.n_stacks  # grown short of n
    if needs_structure(metas) or partial:  # quantized/LoRA/bf16 stacks: structure first
        full = folder / WEIGHTS
        rack = rack_from_stacks(plan, vocab, folder, full if full.is_file() else None)
    elif (folder / WEIGHTS).is_file() or metas is None:
        rack = build_rack(plan, vocab)
        load_weights(rack, folder / WEIGHTS)
    else:  # a progressive run saved with save_rack: false
        rack = rack_from_stacks(plan, vocab, folder)
    routed = plan.progressive.mode != "fused"  # joint tuning trained the whole rack
    if routed and metas and all(m.get("t_range") for m in metas):  # time as depth
        chain = chain_of(plan, tokenizer)
        if chain is not None and any(m.get("chain_input") != CHAIN_INPUT_VERSION for m in metas):
            raise StackWiseError(
                f"'{folder}' was grown as a denoising chain by an earlier StackWise, whose "
                "stacks read their input another way (the revealed tokens were drowned); its "
                "weights do not fit the current chain. Retrain it."
            )
        rack.set_depth_routing([(m["growth_index"], *m["t_range"]) for m in metas], chain)
    return rack.to(device).eval(), tokenizer


def load_trained(
    folder: str | Path, read_plan: PlanReader, device: torch.device | str = "cpu"
) -> tuple[Plan, Rack, AnyTokenizer]:
    """(plan, rack, tokenizer) of a saved run, its Plan from `read_plan` (the door:
    stackwise.runs.load_trained passes stackwise.runs.read_plan)."""
    folder, tokenizer_dir = run_paths(folder)
    plan = read_plan(folder)
    rack, tokenizer = load_rack(folder, plan, tokenizer_dir, device)
    return plan, rack, tokenizer
