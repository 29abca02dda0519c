"""`stackwise merge-lora`: fold every adapter into its (dequantized) base and save a plain rack.

The merged rack has ordinary fp32 linears, so it loads, trains and exports like any rack. With
`requantize`, stacks whose base was quantized are stored in that format again (smaller, but the
rounding changes the logits; the report says by how much).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch

from stackwise.errors import StackWiseError
from stackwise.io.files import new_folder, write_atomic
from stackwise.io.stack_files import read_manifest, save_anchor_and_manifest, save_stack
from stackwise.io.trained import WEIGHTS, PlanReader, load_trained, save_model
from stackwise.model.rack import Rack
from stackwise.precision import QUANT_FORMATS
from stackwise.quant.layers import quantize_linears
from stackwise.quant.lora import adapter_names, merge_adapters
from stackwise.spec import LoraSpec, Plan, QuantSpec

FP32_TOLERANCE = 1e-4


@dataclass
class MergeReport:
    adapters: int  # stacks that carried adapters
    storages: list[str]  # per rack position, how the base was stored before merging
    max_abs_error: float  # merged vs unmerged logits
    rel_error: float  # ||merged - unmerged|| / ||unmerged||
    requantized: bool

    fp32_adapters: bool = True

    @property
    def exact_base(self) -> bool:
        """Merging must not move the logits: fp32 adapters, not requantized, and every base
        either fp32 or quantized. A quantized base computes with exactly its dequantized fp32
        weight, which is what the adapters are merged onto, so only fp32 rounding remains.
        (bf16/fp16-stored bases computed in half precision, so their logits do move.)"""
        return (
            all(s == "full" or s in QUANT_FORMATS for s in self.storages)
            and self.fp32_adapters
            and not self.requantized
        )


def probe_logits(config: Plan | Any, rack: Rack, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    vocab = rack.embed_tokens.num_embeddings
    ids = torch.randint(0, vocab, (2, min(32, config.data.seq_len)), generator=gen)
    t = torch.full((2,), 0.5) if rack.uses_time else None
    if rack.block_size is not None:  # a block-diffusion rack reads [noised; clean]
        ids = torch.cat([ids, ids], dim=1)
    with torch.no_grad():
        return rack(ids, t=t).float()


def _defaults(kind: Any) -> dict[str, Any]:
    """Every field of the spec `kind` at its default (a section reset to what no key sets)."""
    blank = kind()
    return {f.name: getattr(blank, f.name) for f in fields(kind) if f.init}


def plain_plan(plan: Plan, n_stacks: int) -> Plan:
    """The merged rack's plan: no adapters, nothing quantized, full-precision stacks; its
    `source` (what config.yaml holds) follows every change."""
    p, train = plan.progressive, plan.train
    plain = plan.with_section("lora", **_defaults(LoraSpec))
    plain = plain.with_section("quant", **_defaults(QuantSpec))
    plain = plain.with_section("train", group_lr=replace(train.group_lr, lora=None))
    plain = plain.with_section("model", n_stacks=n_stacks)
    trunk = "frozen" if p.trunk_strategy == "qlora" else p.trunk_strategy
    plain = plain.with_section("progressive", new_stack_precision="full", trunk_strategy=trunk)
    return replace(plain, trunk_adapter=None, stages=())


def merge_checkpoint(
    src: str | Path,
    out: str | Path,
    requantize: bool = False,
    *,
    read_plan: PlanReader,
    check: Callable[[dict[str, Any]], object] | None = None,
) -> MergeReport:
    """Merge the adapters of the saved run `src` (its Plan from `read_plan`: the door,
    stackwise.runs.merge_checkpoint, passes stackwise.runs.read_plan) into OUT. `check`
    validates the merged run's config (the door's config loader) before anything is written."""
    src, out = Path(src).expanduser(), Path(out).expanduser()
    if out.exists() and any(out.iterdir()):
        raise StackWiseError(
            f"'{out}' already exists and is not empty; merge-lora never overwrites. Pick a new "
            "output folder."
        )
    config, rack, tokenizer = load_trained(src, read_plan)
    metas = read_manifest(src) or []
    storages = [m.get("storage", "full") for m in metas] or ["full"] * len(rack.stacks)
    with_adapters = sum(1 for s in rack.stacks if adapter_names(s))
    if with_adapters == 0:
        raise StackWiseError(
            f"'{src}' has no LoRA adapters to merge (it was trained without lora.enabled). "
            "Use it as it is."
        )
    plain = plain_plan(config, len(rack.stacks))
    if check is not None:
        check(plain.source or {})
    report = merged_in_place(config, rack, storages, requantize)
    judge(report)
    _save(out, plain, rack, tokenizer, storages if report.requantized else None)
    return report


def merged_in_place(plan: Plan, rack: Any, storages: list[str], requantize: bool) -> MergeReport:
    """Merge every stack's adapters into its weights (quantized again if asked), and report
    how far the logits moved."""
    fp32_adapters = all(
        p.dtype == torch.float32 for n, p in rack.named_parameters() if "lora_" in n
    )
    adapters = sum(1 for s in rack.stacks if adapter_names(s))
    before = probe_logits(plan, rack)
    for stack in rack.stacks:
        merge_adapters(stack)
    rack.float()  # bf16/fp16-stored stacks become plain fp32 too
    if requantize:
        for stack, storage in zip(rack.stacks, storages, strict=True):
            if storage in QUANT_FORMATS:
                quantize_linears(stack, storage, plan.quant.double_quant)  # type: ignore[arg-type]
    after = probe_logits(plan, rack)
    return MergeReport(
        adapters=adapters,
        storages=storages,
        max_abs_error=float((after - before).abs().max()),
        rel_error=float((after - before).norm() / before.norm().clamp(min=1e-12)),
        requantized=requantize and any(s in QUANT_FORMATS for s in storages),
        fp32_adapters=fp32_adapters,
    )


def judge(report: MergeReport) -> None:
    """Warn when the merge moved the logits by design; refuse when it should not have."""
    kinds = sorted(set(report.storages))
    if not report.exact_base:
        warnings.warn(
            f"the base weights were stored as {kinds}"
            + (" and were requantized" if report.requantized else "")
            + f"; merged logits differ from the adapted model by up to {report.max_abs_error:.3g}"
            f" (relative {report.rel_error:.3g})",
            stacklevel=3,
        )
    elif report.max_abs_error > FP32_TOLERANCE:
        raise StackWiseError(
            f"merging changed the logits by {report.max_abs_error:.3g} (> {FP32_TOLERANCE}) "
            f"although the bases ({kinds}) were merged exactly; this is a bug, please report it "
            "(with `stackwise env`). Nothing was written."
        )


def _save(
    out: Path, config: Plan, rack: Rack, tokenizer: object, storages: list[str] | None
) -> None:
    """Everything goes to .OUT.merging first and is renamed at the end: no half-written OUT."""
    failure = f"Could not write the merged rack to '{out}': {{reason}}. Nothing was written."
    with new_folder(out, failure, "merging") as tmp:
        _write(tmp, config, rack, tokenizer, storages)


def _write(
    tmp: Path, config: Plan, rack: Rack, tokenizer: object, storages: list[str] | None
) -> None:
    write_atomic(tmp / "config.yaml", config.to_yaml())
    tokenizer.save_pretrained(str(tmp / "tokenizer"))  # type: ignore[attr-defined]
    save_model(rack, tmp)
    ranges = rack.depth_ranges
    if storages is not None or ranges is not None:
        # quantized stacks need their structure to load; a depth-time rack its noise ranges
        kinds = storages or ["full"] * len(rack.stacks)
        order = [r[0] for r in ranges] if ranges is not None else list(range(len(rack.stacks)))
        for pos, (stack, storage) in enumerate(zip(rack.stacks, kinds, strict=True)):
            info = {"position": pos, "precision": storage, "storage": storage, "adapters": {}}
            info["t_range"] = list(ranges[pos][1:]) if ranges is not None else None
            save_stack(tmp, order[pos], stack, info)
        save_anchor_and_manifest(tmp, rack, order)
    assert (tmp / WEIGHTS).is_file()
