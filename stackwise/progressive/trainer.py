"""ProgressiveTrainer: grow a rack one stack at a time, each stage run by the foundation Trainer.

For stack g (in growth order) it adds the stack, sets what trains (new stack; trunk per
`trunk_strategy`; embeddings and head per `head_policy`), builds that stack's objective (its
overrides, and its noise range when time is depth), and trains it for its budget. Each stage
logs under `<run>/stack_<g>/` (so TensorBoard shows one curve per stack), saves the stack as it
finishes, and adds a row to the per-stack history.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator

from stackwise import seeds
from stackwise.config import Config, stack_config
from stackwise.data.pack import PreparedData
from stackwise.errors import StackWiseError
from stackwise.io.files import write_atomic
from stackwise.io.final import final_save
from stackwise.io.stack_files import (
    save_anchor_and_manifest,
    save_stack,
)
from stackwise.io.trained import save_model
from stackwise.model.chain import CHAIN_INPUT_VERSION, DenoisingChain
from stackwise.model.rack import count_parameters
from stackwise.objectives import Objective, build_objective
from stackwise.progressive.builder import QUANTIZED, AdapterSpec, ProgressiveRackBuilder
from stackwise.progressive.cache import ActivationCache
from stackwise.progressive.imported import import_trunk
from stackwise.progressive.plan import GrowthPlan, stage_derive
from stackwise.progressive.records import ProgressiveResult, StackRecord, summary_table
from stackwise.progressive.resume import (
    HISTORY,
    restore_progress,
    stage_resume,
    stop_at_boundary,
    write_history,
)
from stackwise.progressive.scoring import routed_scores
from stackwise.progressive.stage import KeyedSamples, StageModel
from stackwise.progressive.stage_cache import StageCache
from stackwise.progressive.timing import TimeMapping
from stackwise.quant.lora import rank_for
from stackwise.train.checkpointer import on_main
from stackwise.train.evaluation import score_model
from stackwise.train.hardware import make_accelerator
from stackwise.train.interrupts import StopSignals, TrainingInterrupted, stop_signals
from stackwise.train.run_dir import claim_output_dir
from stackwise.train.state import Stage
from stackwise.train.trainer import Trainer

__all__ = ["HISTORY", "ProgressiveResult", "ProgressiveTrainer", "StackRecord", "summary_table"]


class ProgressiveTrainer:
    def __init__(
        self,
        config: Config,
        data: PreparedData,
        output_dir: str | Path | None = None,
        time_mapping: TimeMapping | None = None,
        quiet: bool = False,
    ) -> None:
        if config.model.vocab_size is None:
            raise ValueError("resolve model.vocab_size from the tokenizer first")
        self.config, self.data, self.quiet = config, data, quiet
        self.p = config.progressive
        self.accelerator: Accelerator = make_accelerator(config.train.mixed_precision)
        processes = self.accelerator.num_processes
        self.plan = GrowthPlan(config, data.specials, data.train_size, processes, time_mapping)
        self.output_dir = claim_output_dir(self.accelerator, config, output_dir)
        self.builder = ProgressiveRackBuilder(
            config.model,
            config.model.vocab_size,
            config.objective.causal,
            building_mode=self.p.building_mode,
            num_time_steps=config.masking.num_time_steps,
            double_quant=config.quant.enabled and config.quant.double_quant,
        )
        self.builder.rack.to(self.accelerator.device)
        self.stage_cache = StageCache(config, data.train_size, self.output_dir, self.accelerator)
        self.records: list[StackRecord] = []

    # -- per-stack settings -------------------------------------------------------------------

    @property
    def cache(self) -> ActivationCache | None:
        return self.stage_cache.cache

    def t_range(self, index: int) -> tuple[float, float] | None:
        return self.plan.t_range(index)

    def budget(self, index: int, n_items: int, n_stacks: int) -> int:
        return self.plan.budget(index, n_items, n_stacks)

    def chain(self) -> DenoisingChain | None:
        return self.plan.chain()

    def adapter_spec(self, rank: int, alpha: float) -> AdapterSpec:
        lo, q = self.config.lora, self.config.quant
        full = not q.enabled or q.adapters_full_precision
        return AdapterSpec(rank, alpha, lo.dropout, torch.float32 if full else torch.bfloat16)

    def backbone_format(self) -> str | None:
        """How a stack is stored once it is trunk: quantized when the config says so."""
        q = self.config.quant
        if self.p.trunk_strategy == "qlora":
            return q.type if q.enabled else "nf4"
        if q.enabled and q.backbone_quantized:
            return q.type
        return None

    def set_roles(self, index: int) -> None:
        b, p, lo = self.builder, self.p, self.config.lora
        fmt = self.backbone_format()
        for stack in b.trunk:
            if fmt is not None and b.meta[stack].storage not in QUANTIZED:
                b.store_as(stack, fmt)  # once: stacks already quantized keep their format
            b.set_trainable(stack, p.trunk_strategy == "full")
            if lo.trunk_adapters:  # one adapter per trunk stack, created once, then reused
                b.ensure_trunk_adapter(stack, self.adapter_spec(lo.trunk_rank, lo.trunk_alpha))
                b.set_trunk_adapter_trainable(stack, True)
        assert b.new_stack is not None
        b.set_trainable(b.new_stack, True)
        anchor = {"train_first": index == 0, "always": True, "frozen": False}[p.head_policy]
        b.set_anchor_trainable(anchor)

    # -- the loop -----------------------------------------------------------------------------

    def log(self, msg: str) -> None:
        if not self.quiet and self.accelerator.is_main_process:
            print(msg, flush=True)

    def grow(self, index: int) -> Any:
        """Add stack `index` with its precision and adapter, and set every role for its stage."""
        p, lo = self.p, self.config.lora
        spec = (
            self.adapter_spec(*rank_for(index, self.config.model.n_stacks, lo))
            if lo.enabled and p.new_stack_precision in QUANTIZED
            else None
        )
        # fp16 weights cannot train without loss scaling (Adam's state underflows), so an fp16
        # stack trains in fp32 and is stored as fp16 once its stage ends (see finish_stack)
        new = self.builder.add_stack(precision=self.train_precision(), adapter=spec)
        self.set_roles(index)
        return new

    def train_precision(self) -> str:
        return "full" if self.p.new_stack_precision == "fp16" else self.p.new_stack_precision

    def finish_stack(self, stack: Any) -> None:
        """A stack whose stage ended takes its final storage (fp16 stacks trained in fp32)."""
        if self.train_precision() != self.p.new_stack_precision:
            self.builder.store_as(stack, self.p.new_stack_precision)
            self.builder.meta[stack].precision = self.p.new_stack_precision

    def train_stage(self, index: int, n_stacks: int) -> StackRecord:
        b, acc = self.builder, self.accelerator
        new = self.grow(index)
        cfg = stack_config(self.config, index)
        t_range = self.t_range(index)
        objective = self.plan.objective_for(cfg, t_range)
        train_data, carried = self._stage_data(index, cfg, objective, new)
        steps = self.budget(index, self.data.train_size, n_stacks)  # epochs over samples
        stage_dir = self.output_dir / f"stack_{index}"
        cfg = stage_derive(
            cfg,
            train={
                "max_steps": steps,
                "seed": seeds.stage(cfg.train.seed, index),
                "output_dir": str(stage_dir),
                "overwrite_output_dir": True,
                "resume_from_checkpoint": stage_resume(self.config, stage_dir),
            },
            logging={"run_name": None},
        )
        chain = self.chain()
        b.rack.set_depth_routing(self.depth_ranges() if chain else None, chain)
        cache = self.cache if carried is not None else None
        model = StageModel(b.rack, new, cache, acc.mixed_precision)
        self.log(
            f"stack {index + 1}/{n_stacks} at position {b.position(new)}: {steps} steps, "
            f"{count_parameters(b.rack, trainable_only=True):,} trainable parameters"
            + (f", t in ({t_range[0]:.3f}, {t_range[1]:.3f}]" if t_range else "")
            + (f", cache carried {carried:,} entries" if carried is not None else "")
        )
        trainer = self._stage_trainer(index, n_stacks, cfg, model, objective, train_data)
        before = self.stage_cache.snapshot()
        start = time.perf_counter()
        state = trainer.train()
        seconds = time.perf_counter() - start
        b.rack.set_depth_routing(None)  # the next stage grows the rack
        losses = [h for h in state.history if "loss" in h]
        record = StackRecord(
            index=index,
            position=b.position(new),
            steps=state.step,
            tokens=state.tokens_seen,
            seconds=round(seconds, 3),
            trainable_params=count_parameters(b.rack, trainable_only=True),
            t_range=t_range,
            train_loss=trainer.last_train_loss,
            eval=losses[-1] if losses else {},
            cache=self.stage_cache.since(before, carried) if cache is not None else {},
        )
        self._after_stage(new)
        return record

    def _stage_data(
        self, index: int, cfg: Config, objective: Objective, new: Any
    ) -> tuple[Any, int | None]:
        """The stage's training samples, and the cache entries carried into it (None: the
        stage runs without the cache)."""
        if not (self.p.cache.enabled and index > 0):
            return self.data.train, None
        probe = StageModel(self.builder.rack, new)
        carried = self.stage_cache.prepare(cfg, objective, probe, self.builder.rack)
        variants, times = self.stage_cache.variants(objective)
        return KeyedSamples(self.data.train, variants, cfg.train.seed, times), carried

    def _stage_trainer(
        self, index: int, n_stacks: int, cfg: Config, model: Any, objective: Objective, data: Any
    ) -> Trainer:
        global_lr = self.p.lr_schedule == "global"
        trainer = Trainer(
            cfg,
            model,
            objective,
            data,
            self.data.val,
            accelerator=self.accelerator,
            stage=Stage(index, f"stack {index + 1}/{n_stacks}", defer_finish=True),
            eval_objective=build_objective(self.config, self.data.specials),
            eval_seed=self.config.train.seed,
            scheduler=(lambda opt: self.plan.global_scheduler(opt, cfg, index))
            if global_lr
            else None,
        )
        self.last_trainer = trainer  # inspected by tests (optimizer membership)
        trainer.call_hook("on_stack_begin", index)
        return trainer

    def _after_stage(self, new: Any) -> None:
        p, acc = self.p, self.accelerator
        self.finish_stack(new)
        if p.save_stacks and acc.is_main_process:
            # a trunk that trains, gains adapters or is quantized on freezing is saved again
            self.save_stacks(
                changed_only=p.trunk_strategy == "frozen"
                and self.backbone_format() is None
                and not self.config.lora.trunk_adapters
            )
        acc.wait_for_everyone()

    def save_stacks(self, changed_only: bool, folder: Path | None = None) -> None:
        """The new stack (and, when the trunk trains too, every stack) plus anchor/manifest."""
        b, chained = self.builder, self.chain() is not None
        for stack in [b.new_stack] if changed_only else list(b.rack.stacks):
            assert stack is not None
            g = b.growth_index(stack)
            info = {"position": b.position(stack), **b.meta[stack].as_dict()}
            if chained:
                info["chain_input"] = CHAIN_INPUT_VERSION
            save_stack(folder or self.output_dir, g, stack, {**info, "t_range": self.t_range(g)})
        order = [b.growth_index(s) for s in b.rack.stacks]
        save_anchor_and_manifest(folder or self.output_dir, b.rack, order)

    def joint_tuning(self) -> dict[str, Any]:
        """mode fused: every parameter that can train trains together, ordinary backprop over the
        rack: embeddings, norms, head, full-precision stacks and LoRA adapters. Quantized base
        weights (packed integer codes) cannot, so a qlora trunk adapts through its adapters."""
        rack = self.builder.rack
        for p in rack.parameters():
            p.requires_grad_(p.is_floating_point() and not getattr(p, "_stackwise_fixed", False))
        steps = self.p.joint_tuning_steps
        cfg = stage_derive(
            self.config,
            train={
                "max_steps": steps,
                "seed": seeds.joint_tuning(self.config.train.seed),
                "output_dir": str(self.output_dir / "joint"),
                "overwrite_output_dir": True,
                "resume_from_checkpoint": stage_resume(self.config, self.output_dir / "joint"),
            },
            logging={"run_name": None},
        )
        self.log(f"joint tuning of the whole rack: {steps} steps")
        objective = build_objective(self.config, self.data.specials)
        trainer = Trainer(
            cfg,
            rack,
            objective,
            self.data.train,
            self.data.val,
            accelerator=self.accelerator,
            stage=Stage(None, "joint"),
            eval_seed=self.config.train.seed,
        )
        start = time.perf_counter()
        state = trainer.train()
        evals = [h for h in state.history if "loss" in h]
        return {
            "steps": state.step,
            "tokens": state.tokens_seen,
            "seconds": round(time.perf_counter() - start, 3),
            "eval": evals[-1] if evals else {},
        }

    def depth_ranges(self) -> list[tuple[int, float, float]] | None:
        """Per rack position, (growth index, lo, hi) when time is depth; else None. A fused
        rack is not routed: joint tuning trained the whole rack on every noise level."""
        if self.p.mode == "fused":
            return None
        b = self.builder
        ranges = []
        for stack in b.rack.stacks:
            g = b.growth_index(stack)
            tr = self.t_range(g)
            if tr is None:
                return None
            ranges.append((g, *tr))
        return ranges

    def final_eval(self) -> dict[str, float]:
        """The grown rack on the base objective (full noise range); see routed_scores."""
        return routed_scores(self.builder.rack, self.depth_ranges(), self.chain(), self._score_rack)

    def _score_rack(self) -> dict[str, float]:
        objective = build_objective(self.config, self.data.specials)
        return score_model(
            self.builder.rack, objective, self.data.val, self.accelerator, self.config
        )

    def train_progressively(self, target_stacks: int | None = None) -> ProgressiveResult:
        """Grow to `target_stacks` (default model.n_stacks), under the run's stop signals: one
        that arrives between stages stops the run at the boundary, every finished stage saved."""
        with stop_signals(announce=self.accelerator.is_main_process) as signals:
            return self._grow(target_stacks, signals)

    def _grow(self, target_stacks: int | None, signals: StopSignals) -> ProgressiveResult:
        n = target_stacks or self.config.model.n_stacks
        if n > self.config.model.n_stacks:
            raise StackWiseError(
                f"target_stacks={n} exceeds model.n_stacks={self.config.model.n_stacks}, which "
                "sets the depth used to scale initialisation and the noise mapping."
            )
        if not self.builder.grown:
            if self.config.model.init_from_hf:
                import_trunk(self)  # the checkpoint's layers: the first, frozen stacks
            if self.config.train.resume_from_checkpoint:
                restore_progress(self, n, start=len(self.builder.grown))
        self.builder.rack.set_depth_routing(None)  # routing is for the finished rack only
        for index in range(len(self.builder.grown), n):
            stop_at_boundary(self, signals, n)
            try:
                record = self.train_stage(index, n)
                self.records.append(record)
                write_history(self)
                self.last_trainer.call_hook("on_stack_end", index, record)
            except TrainingInterrupted as err:
                raise err.of_run(self.output_dir) from None
            finally:  # the stage's loggers close after its stack's own report, or on failure
                if getattr(self, "last_trainer", None) is not None:
                    self.last_trainer.finish()
        stop_at_boundary(self, signals, n)
        try:
            joint = self.joint_tuning() if self.p.mode == "fused" else None
        except TrainingInterrupted as err:
            raise err.of_run(self.output_dir) from None
        self.joint, self.final = joint, self.final_eval()
        write_history(self)
        if self.cache is not None:
            self.cache.close()
        rack, records = self.builder.rack, self.records
        return ProgressiveResult(rack, self.output_dir, records, self.final, joint)

    def save(self, tokenizer: Any = None) -> Path:
        """config.yaml, tokenizer/, the full rack (save_rack) and stacks/ (save_stacks)."""
        acc = self.accelerator
        acc.wait_for_everyone()

        def write() -> None:
            with final_save(self.output_dir) as out:
                write_atomic(out / "config.yaml", self.config.to_yaml())
                if tokenizer is not None:
                    tokenizer.save_pretrained(str(out / "tokenizer"))
                if self.p.save_rack:
                    save_model(self.builder.rack, out)
                if self.p.save_stacks:  # final positions (prepend shifts them), joint tuning
                    self.save_stacks(changed_only=False, folder=out)

        on_main(acc, write)  # a failed save is raised on every rank
        acc.wait_for_everyone()
        return self.output_dir
