"""Rules across sections: each yields what is wrong and how to fix it; all of them run."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from stackwise.config.base import cross_rule
from stackwise.config.root import Config
from stackwise.precision import PACKED
from stackwise.registry import OBJECTIVES, SAMPLERS


def declaring(capability: str) -> str:
    """The objectives that declare `capability` (true or holding it), quoted: 'diffusion'."""
    return " or ".join(f"'{n}'" for n in OBJECTIVES.names() if has(n, capability))


def has(objective: str, capability: str, value: str | None = None) -> bool:
    """Whether `objective` declares `capability` (or, with `value`, lists it)."""
    declared = getattr(OBJECTIVES.capabilities(objective), capability)
    return value in declared if value is not None else bool(declared)


MASKED_SAMPLING = ("steps", "sampler", "remasking", "block_length", "no_repeat_words")
SAMPLER_OWN = ("confidence_threshold", "remask_budget")  # each read by one sampler


@cross_rule
def sampling(cfg: Config) -> Iterator[str]:
    """Sampling settings that the rack's kind would ignore are refused."""
    sm = cfg.sample
    resolved = SAMPLERS.capabilities(sm.resolved_sampler(cfg.objective.name))
    if cfg.objective.causal:
        for name in (*MASKED_SAMPLING, *SAMPLER_OWN):
            if sm.changed(name):
                default = type(sm).model_fields[name].get_default()
                yield (
                    f"sample.{name} only applies to masked (mlm/diffusion) racks; this rack "
                    f"samples left to right. Remove it, or set sample.{name}={default} (its "
                    "default) when overriding a preset"
                )
    else:
        yield from _sampler_settings(cfg, resolved)
    if resolved.needs_chain and not has(cfg.objective.name, "blocks"):  # rules_blocks says it
        p = cfg.progressive
        if p.strategy != "progressive" or p.depth_order != "high_to_low":
            yield (
                f"sample.sampler: {sm.sampler} runs a rack grown as a denoising chain, one "
                "stack per step; it needs progressive.strategy: progressive with "
                "time_interpretation: depth and depth_order: high_to_low"
            )
        for name in ("steps", "block_length", "no_repeat_words"):
            if sm.changed(name):
                default = type(sm).model_fields[name].get_default()
                yield (
                    f"sample.{name} does not apply to sampler {sm.sampler}: it takes one "
                    f"step per stack over the whole generation; remove it, or set "
                    f"sample.{name}={default} (its default) when overriding a preset"
                )
    if sm.no_repeat_words and cfg.data.tokenizer not in ("char", "byte"):
        yield (
            "sample.no_repeat_words compares words letter by letter, so it needs a character- "
            "or byte-level vocabulary: set data.tokenizer: char or byte, or remove it"
        )


def _sampler_settings(cfg: Config, resolved: Any) -> Iterator[str]:
    """Settings a masked rack's chosen sampler does not read."""
    sm = cfg.sample
    if not resolved.uses_remasking and sm.changed("remasking"):
        yield (
            "sample.remasking only applies to sampler: remask (and block_remask, and "
            "single_pass, which ranks its reveals by it when set; ancestral and block reveal "
            "positions at random, as the reverse process says); set sample.sampler: remask "
            "(block_remask for block diffusion) or remove it"
        )
    for name in SAMPLER_OWN:
        if sm.changed(name) and name not in resolved.reads:
            owner = next(n for n in SAMPLERS.names() if name in SAMPLERS.capabilities(n).reads)
            if has(cfg.objective.name, "blocks"):
                yield (
                    f"sample.{name} belongs to sampler {owner}, which a block_diffusion rack "
                    "cannot use (it samples block by block: sampler block or block_remask); "
                    f"remove sample.{name}"
                )
                continue
            default = type(sm).model_fields[name].get_default()
            yield (
                f"sample.{name} only applies to sampler: {owner}, and this run samples with "
                f"{sm.resolved_sampler(cfg.objective.name)}; set sample.sampler: {owner}, or "
                f"remove it (sample.{name}={default}, its default, where a saved config sets it)"
            )


@cross_rule
def relevance_objective(cfg: Config) -> Iterator[str]:
    """Fields that only some objectives or model settings read."""
    name = cfg.objective.name
    m = cfg.masking
    for f in type(m).model_fields:
        owners = " or ".join(f"'{o}'" for o in OBJECTIVES.names() if has(o, "masking_fields", f))
        if owners and not has(name, "masking_fields", f) and m.changed(f):
            yield (
                f"masking.{f} only applies to objective {owners}, not '{name}'; "
                "remove it or change objective.name"
            )
    if m.time_step_masking and not has(name, "uses_time"):
        yield (
            f"masking.time_step_masking draws time steps, which objective '{name}' has none of; "
            f"use objective {declaring('uses_time')}, or set it false"
        )
    if not has(name, "nelbo") and cfg.objective.changed("weighting"):
        yield f"objective.weighting only applies to objective {declaring('nelbo')}"
    tc = cfg.model.time_conditioning
    if tc != "none" and not has(name, "uses_time"):
        yield (
            f"model.time_conditioning '{tc}' feeds the diffusion time step; it needs "
            f"objective {declaring('uses_time')}"
        )
    if tc == "learned" and m.num_time_steps is None:
        yield "time_conditioning 'learned' needs masking.num_time_steps (its table)"
    if tc == "none" and cfg.model.time_embedding_dim is not None:
        yield "model.time_embedding_dim needs model.time_conditioning sinusoidal or learned"
    p = cfg.progressive
    if cfg.train.group_lr.trunk is not None and (
        p.strategy != "progressive" or p.trunk_strategy != "full"
    ):
        yield (
            "train.group_lr.trunk sets the LR of a trunk that trains: it needs "
            "progressive.strategy: progressive with trunk_strategy: full (a frozen trunk "
            "does not train; a qlora trunk trains its adapters, at group_lr.lora)"
        )
    if tc == "none" and cfg.train.group_lr.time is not None:
        yield "train.group_lr.time needs model.time_conditioning other than none"
    if cfg.model.tie_embeddings and cfg.train.group_lr.head is not None:
        yield (
            "train.group_lr.head needs an untied head; the tied head shares the embeddings' "
            "LR (set group_lr.embeddings, or model.tie_embeddings: false)"
        )


@cross_rule
def relevance_run(cfg: Config) -> Iterator[str]:
    """Output folder, resume, best-model metric and sequence length."""
    lc = cfg.logging
    if cfg.train.output_dir is not None and lc.run_name is not None and not lc.log_to_wandb:
        yield (
            "logging.run_name names the default output dir outputs/<run_name> (and the W&B "
            "run); with train.output_dir set and W&B off it would have no effect. Set one of them"
        )
    resume, p = cfg.train.resume_from_checkpoint, cfg.progressive
    if resume is not None and p.strategy == "progressive" and not p.save_stacks:
        yield (
            "resuming a progressive run regrows its finished stacks from their stack files; "
            "it needs progressive.save_stacks: true"
        )
    if resume is not None and p.strategy == "progressive" and resume != "latest":
        yield (
            "a progressive run resumes as a whole: set train.resume_from_checkpoint: latest "
            "with train.output_dir naming the run (each stage resumes from its own latest "
            "checkpoint)"
        )
    if resume not in (None, "latest") and cfg.logging.run_name is not None:
        yield (
            "resuming from a checkpoint folder continues that run in its own folder, so "
            "logging.run_name would have no effect; remove it"
        )
    if resume == "latest" and cfg.train.output_dir is None and cfg.logging.run_name is None:
        yield (
            "train.resume_from_checkpoint 'latest' looks in the run's output dir; set "
            "train.output_dir (or logging.run_name) to the run to resume"
        )
    metric, name = cfg.train.metric_for_best, cfg.objective.name
    diffusion_only, nelbo = metric in ("nelbo", "ppl_bound"), has(name, "nelbo")
    if (diffusion_only and not nelbo) or (metric == "ppl" and nelbo):
        yield (
            f"train.metric_for_best '{metric}' is not reported for objective '{name}' "
            "(diffusion reports nelbo and ppl_bound; clm and mlm report ppl; all report loss "
            "and accuracy)"
        )
    if cfg.data.seq_len > cfg.model.max_seq_len and cfg.model.source == "rack":
        yield (
            f"data.seq_len ({cfg.data.seq_len}) exceeds model.max_seq_len "
            f"({cfg.model.max_seq_len}); raise max_seq_len or shorten seq_len"
        )


@cross_rule
def saved_precision(cfg: Config) -> Iterator[str]:
    """train.save_precision casts float weights; packed (quantized) rack weights have a format
    of their own that a cast would not keep."""
    packed = cfg.quant.enabled or cfg.progressive.new_stack_precision in PACKED
    if cfg.train.save_precision is not None and packed and cfg.model.source == "rack":
        yield (
            "train.save_precision casts the saved float weights, but this rack keeps packed "
            "(quantized) weights, which have a format of their own; remove train.save_precision"
        )
