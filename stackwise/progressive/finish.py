"""After the last stage of a progressive run: joint tuning (mode fused) and the final score."""

from __future__ import annotations

import time
from typing import Any

from stackwise.progressive.scoring import routed_scores
from stackwise.progressive.stage_specs import joint_plan
from stackwise.train.builders import build_trainer
from stackwise.train.evaluation import score_model
from stackwise.train.state import Stage
from stackwise.train.strategy import TrainingStrategy


def joint_tuning(recipe: Any) -> dict[str, Any]:
    """mode fused: every parameter that can train trains together, ordinary backprop over the
    rack: embeddings, norms, head, full-precision stacks and LoRA adapters. Quantized base
    weights (packed integer codes) cannot, so a qlora trunk adapts through its adapters."""
    rack = recipe.builder.rack
    for p in rack.parameters():
        p.requires_grad_(p.is_floating_point() and not getattr(p, "_stackwise_fixed", False))
    steps = recipe.p.joint_tuning_steps
    plan = joint_plan(recipe.plan, steps, recipe.output_dir / "joint")
    recipe.log(f"joint tuning of the whole rack: {steps} steps")
    flops = sum(r.flops for r in recipe.records)
    spent = (flops, sum(r.tokens for r in recipe.records))
    trainer = build_trainer(
        plan,
        recipe.copies.working(rack),
        recipe.base_objective,
        recipe.data.train,
        recipe.data.val,
        strategy=recipe.strategy or TrainingStrategy(),
        accelerator=recipe.accelerator,
        stage=Stage(None, "joint", flops_before=spent[0], tokens_before=spent[1]),
        eval_seed=recipe.plan.train.seed,
    )
    start = time.perf_counter()
    state = trainer.train()
    recipe.copies.bring_back()
    evals = [h for h in state.history if "loss" in h]
    return {
        "steps": state.step,
        "tokens": state.tokens_seen,
        "flops": state.flops,
        "seconds": round(time.perf_counter() - start, 3),
        "eval": evals[-1] if evals else {},
    }


def final_eval(recipe: Any) -> dict[str, float]:
    """The grown rack on the base objective (full noise range); see routed_scores."""
    rack, acc = recipe.builder.rack, recipe.accelerator
    ranges = recipe.growing.depth_ranges()

    def score() -> dict[str, float]:
        return score_model(rack, recipe.base_objective, recipe.data.val, acc, recipe.plan)

    return routed_scores(rack, ranges, recipe.chain(), score)
