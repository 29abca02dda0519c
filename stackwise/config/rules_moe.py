"""Rules for model.moe: what an MoE rack can be, and what does not handle experts yet."""

from __future__ import annotations

from collections.abc import Iterator

from stackwise.config.base import cross_rule
from stackwise.config.root import Config
from stackwise.precision import QUANT_FORMATS


@cross_rule
def moe(cfg: Config) -> Iterator[str]:
    """Experts per layer, top-k, the MoE stacks, and the features that cannot hold experts."""
    m, n_stacks = cfg.model.moe, cfg.model.n_stacks
    if m.num_experts == 0:
        changed = [k for k in type(m).model_fields if k != "num_experts" and m.changed(k)]
        if changed:
            yield f"model.moe.{changed[0]} needs experts: set model.moe.num_experts (2 or more)"
        return
    if m.num_experts == 1:
        yield "model.moe.num_experts 1 is a dense layer behind a router: use 0 (dense) or >= 2"
    if m.top_k > m.num_experts:
        yield f"model.moe.top_k {m.top_k} exceeds num_experts {m.num_experts}: lower top_k"
    bad = [k for k in m.stacks or [] if k >= n_stacks]
    if bad:
        yield f"model.moe.stacks names stack {bad[0]}; stacks are 0..{n_stacks - 1}"
    p, q = cfg.progressive, cfg.quant
    unsupported = {
        "model.source hf (a Hugging Face model brings its own layers)": cfg.model.source == "hf",
        "model.init_from_hf (a Llama has dense layers)": cfg.model.init_from_hf is not None,
        "model.frozen_up_proj": cfg.model.frozen_up_proj,
        "lora.enabled": cfg.lora.enabled,
        "quant.enabled": q.enabled,
        f"new_stack_precision {p.new_stack_precision}": p.new_stack_precision
        in (*QUANT_FORMATS, "qlora"),
        "trunk_strategy qlora": p.trunk_strategy == "qlora",
        "train.compile (routing picks sizes at run time, so graphs would recompile)": (
            cfg.train.compile
        ),
        "end_to_end_scope stackwise (its local losses carry no router loss)": (
            p.strategy == "end_to_end" and p.end_to_end_scope == "stackwise"
        ),
        "building_mode prepend with model.moe.stacks (a saved rack is rebuilt by position)": (
            p.strategy == "progressive" and p.building_mode == "prepend" and m.stacks is not None
        ),
    }
    for what, on in unsupported.items():
        if on:
            yield (
                f"model.moe keeps every expert in full precision and trains it whole; {what} "
                "does not handle experts yet. Remove one of them"
            )
