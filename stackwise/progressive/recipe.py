"""The progressive recipe: grow a rack one stack at a time, looping over the plan's stage specs.

For each stage it grows the stack (GrowingRack sets the roles), builds that stage's objective
(its overrides, its noise range when time is depth) and a Trainer for its budget, trains it,
saves the stack and adds a row to the history. Each stage logs under `<run>/stack_<g>/`, so
TensorBoard shows one curve per stack. Every stage's settings were decided at the door
(stackwise.plan); nothing here derives a config.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from stackwise.data.pack import PreparedData
from stackwise.errors import StackWiseError
from stackwise.model.chain import DenoisingChain
from stackwise.model.rack import count_parameters
from stackwise.objectives import Objective, objective_from
from stackwise.progressive.budget import StageRun, check_plateau
from stackwise.progressive.finish import final_eval, joint_tuning
from stackwise.progressive.growing import GrowingRack
from stackwise.progressive.records import ProgressiveResult, StackRecord
from stackwise.progressive.seed_builder import SeedSettings, start_seed_run
from stackwise.progressive.sharded_stage import StageCopies
from stackwise.progressive.stage import KeyedSamples, StageModel
from stackwise.progressive.stage_cache import StageCache
from stackwise.progressive.stage_specs import stage_line, stage_objective, stage_plan
from stackwise.spec import Plan, StageSpec
from stackwise.train.builders import build_trainer
from stackwise.train.checkpoint_manager import on_main
from stackwise.train.hardware import check_launch, make_accelerator
from stackwise.train.interrupts import StopSignals, TrainingInterrupted, stop_signals
from stackwise.train.run_dir import claim_output_dir
from stackwise.train.state import Stage
from stackwise.train.strategy import TrainingStrategy
from stackwise.train.trainer import EnhancedTrainer


class ProgressiveRecipe:
    def __init__(
        self,
        plan: Plan | Any,
        data: PreparedData | None = None,
        output_dir: str | Path | None = None,
        quiet: bool = False,
        strategy: TrainingStrategy | None = None,
        *,
        builder: Any = None,
        time_mapping: Any = None,
    ) -> None:
        """`plan` must hold its stage specs (compile_plan with the training set's size).
        `builder`: a ProgressiveRackBuilder of the caller's to grow. A config instead of a plan
        (the seeds' `ProgressiveTrainer(config)`) waits for train_progressively's data."""
        self.seed: SeedSettings | None = None
        if not isinstance(plan, Plan):
            self.seed = SeedSettings(plan, output_dir, quiet, strategy, time_mapping)
            return
        assert data is not None, "a plan comes with its data"
        self.setup(plan, data, output_dir, quiet, strategy, builder)

    def setup(
        self,
        plan: Plan,
        data: PreparedData,
        output_dir: str | Path | None = None,
        quiet: bool = False,
        strategy: TrainingStrategy | None = None,
        builder: Any = None,
    ) -> None:
        if plan.model.vocab_size is None or not plan.stages:
            raise ValueError("compile the plan with the data first (vocab_size, stages)")
        self.plan, self.data, self.quiet = plan, data, quiet
        self.p = plan.progressive
        self.strategy = strategy  # each stage's step (None: the standard one)
        acc = self.accelerator = make_accelerator(plan.train.mixed_precision)
        check_launch(plan.train, plan.parallel, acc.num_processes, acc.is_main_process)
        self.output_dir = claim_output_dir(self.accelerator, plan, output_dir)
        self.growing = GrowingRack(plan, self.output_dir, self.accelerator, self.log, builder)
        self.base_objective = objective_from(plan.objective, plan.masking, data.specials)
        self._chain = self._build_chain()
        self.stage_cache = StageCache(plan, data.train_size, self.output_dir, self.accelerator)
        self.copies = StageCopies(plan.parallel.shards, acc.device)  # what a sharded stage trains
        check_plateau(plan, len(data.val) if data.val is not None else None)
        self.last_trainer: EnhancedTrainer | None = None

    # views, for callers that knew them as attributes
    builder = property(lambda self: self.growing.builder)
    records = property(lambda self: self.growing.records)
    config = property(lambda self: self.plan)
    cache = property(lambda self: self.stage_cache.cache)

    def log(self, msg: str) -> None:
        if not self.quiet and self.accelerator.is_main_process:
            print(msg, flush=True)

    def chain(self) -> DenoisingChain | None:
        """The denoising chain of a rack grown high-noise-to-low (time as depth), else None."""
        return self._chain

    def _build_chain(self) -> DenoisingChain | None:
        if self.p.time_interpretation != "depth" or self.p.depth_order != "high_to_low":
            return None
        schedule = self.base_objective.schedule  # type: ignore[attr-defined]
        return DenoisingChain(self.data.specials.mask_id, schedule.mask_fraction)

    # -- one stage ---------------------------------------------------------------------------

    def train_stage(self, index: int, n_stacks: int) -> StackRecord:
        run = StageRun.of(self.plan, index, n_stacks, self.records)  # its budget
        stage, b = run.stage, self.builder
        new = self.growing.grow(stage)
        plan = stage_plan(self.plan, stage, self.output_dir / f"stack_{index}")
        objective = stage_objective(stage, self.data.specials)
        train_data, carried = self._stage_data(stage, objective, new)
        chain = self.chain()
        b.rack.set_depth_routing(self.growing.depth_ranges() if chain else None, chain)
        cache = self.cache if carried is not None else None
        model = StageModel(b.rack, new, cache, self.accelerator.mixed_precision)
        trainable = count_parameters(b.rack, trainable_only=True)
        trainer = self._stage_trainer(run, run.label(n_stacks), plan, model, objective, train_data)
        line = stage_line(stage, n_stacks, b.position(new), trainable, carried, run.inherited)
        self.log(f"{line}; {trainer.placement.compiling.note}")
        carry = self.stage_cache.carry_flops if carried is not None else 0.0
        trainer.state.flops += carry  # the stage's own work, kept by its checkpoints
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
            t_range=stage.t_range,
            train_loss=trainer.last_train_loss,
            eval=losses[-1] if losses else {},
            cache=self.stage_cache.since(before, carried) if cache is not None else {},
            flops=state.flops,
            **run.outcome(),
        )
        self._after_stage(new)
        return record

    def _stage_data(
        self, stage: StageSpec, objective: Objective, new: Any
    ) -> tuple[Any, int | None]:
        """The stage's training samples, and the cache entries carried into it (None: the
        stage runs without the cache). Samples are keyed by the run's seed, not the stage's,
        so stages that corrupt alike share entries."""
        if not (self.p.cache.enabled and stage.index > 0):
            return self.data.train, None
        keyed = replace(self.plan, objective=stage.objective, masking=stage.masking)
        probe = StageModel(self.builder.rack, new)
        carried = self.stage_cache.prepare(keyed, objective, probe, self.builder.rack)
        variants, times = self.stage_cache.variants(objective)
        return KeyedSamples(self.data.train, variants, self.plan.train.seed, times), carried

    def _stage_trainer(
        self,
        run: StageRun,
        stage: Stage,
        plan: Plan,
        model: Any,
        objective: Objective,
        data: Any,
    ) -> EnhancedTrainer:
        trainer = build_trainer(
            plan,
            self.copies.working(model, shared=[model.cache]),
            objective,
            data,
            self.data.val,
            strategy=self.strategy or TrainingStrategy(),
            accelerator=self.accelerator,
            stage=stage,
            eval_objective=self.base_objective,
            eval_seed=self.plan.train.seed,
            scheduler=run.scheduler(self.plan, plan),
            extensions=run.extensions(),
        )
        self.last_trainer = trainer  # inspected by tests (optimizer membership)
        trainer.call_hook("on_stack_begin", run.stage.index)
        return trainer

    def _after_stage(self, new: Any) -> None:
        acc = self.accelerator
        self.copies.bring_back()  # the stage's weights, gathered into the rack
        self.growing.finish_stack(new)
        if self.p.save_stacks and acc.is_main_process:
            # a trunk that trains, gains adapters or is quantized on freezing is saved again
            self.growing.save_stacks(
                changed_only=self.p.trunk_strategy == "frozen"
                and self.growing.backbone_format() is None
                and self.plan.trunk_adapter is None,
                chained=self.chain() is not None,
            )
        acc.wait_for_everyone()

    # -- the run -----------------------------------------------------------------------------

    def train_progressively(
        self,
        target_stacks: int | None = None,
        *,
        rack_builder: Any = None,
        dataloader: Any = None,
        **data: Any,
    ) -> ProgressiveResult:
        """Grow to `target_stacks` (default model.n_stacks), under the run's stop signals: one
        that arrives between stages stops the run at the boundary, every finished stage saved.
        A trainer made from a config trains on `dataloader`'s data and grows `rack_builder`'s
        rack (`data`: tokenizer=, eval_dataloader=; see stackwise.fronts.progressive)."""
        if self.seed is not None:
            start_seed_run(self, rack_builder, dataloader, target_stacks, **data)
        elif rack_builder is not None or dataloader is not None or data:
            raise StackWiseError(
                "This progressive trainer was built from a plan and its data; make one from a "
                "config (ProgressiveTrainer(config)) to train on your own dataloader and builder."
            )
        with stop_signals(announce=self.accelerator.is_main_process) as signals:
            result = self._grow(target_stacks, signals)
        if self.seed is not None:  # a finished run folder, as `stackwise train` leaves one
            self.save(self.data.tokenizer)
        return result

    def train_rack(
        self,
        rack_builder: Any = None,
        dataloader: Any = None,
        target_stacks: int | None = None,
        **data: Any,
    ) -> ProgressiveResult:
        """train_progressively, the builder and dataloader first (the seeds' train_rack)."""
        return self.train_progressively(
            target_stacks, rack_builder=rack_builder, dataloader=dataloader, **data
        )

    def _grow(self, target_stacks: int | None, signals: StopSignals) -> ProgressiveResult:
        n_all = self.plan.model.n_stacks
        n = target_stacks or n_all
        if n > n_all:
            raise StackWiseError(
                f"target_stacks={n} exceeds the planned depth, model.n_stacks={n_all} (which "
                "scales the initialisation and noise mapping): ask for at most that, or set "
                f"model.n_stacks={n} (training.progressive.max_stacks: {n})."
            )
        if not self.builder.grown:  # an imported trunk, then a resumed run's finished stacks
            self.growing.start(n, chained=self.chain() is not None)
        self.builder.rack.set_depth_routing(None)  # routing is for the finished rack only
        for index in range(len(self.builder.grown), n):
            self.growing.stop_at_boundary(signals, n)
            try:
                record = self.train_stage(index, n)
                self.records.append(record)
                self.growing.write_history()
                assert self.last_trainer is not None
                self.last_trainer.call_hook("on_stack_end", index, record)
            except TrainingInterrupted as err:
                raise err.of_run(self.output_dir) from None
            finally:  # the stage's loggers close after its stack's own report, or on failure
                if self.last_trainer is not None:
                    self.last_trainer.finish()
        self.growing.stop_at_boundary(signals, n)
        try:
            self.growing.joint = self.joint_tuning() if self.p.mode == "fused" else None
        except TrainingInterrupted as err:
            raise err.of_run(self.output_dir) from None
        self.growing.final = self.final_eval()
        self.growing.write_history()
        if self.cache is not None:
            self.cache.close()
        g = self.growing
        return ProgressiveResult(g.rack, self.output_dir, g.records, g.final or {}, g.joint)

    def joint_tuning(self) -> dict[str, Any]:
        """mode fused: every parameter that can train trains together (see finish.py)."""
        return joint_tuning(self)

    def final_eval(self) -> dict[str, float]:
        """The grown rack on the base objective (full noise range); see routed_scores."""
        return final_eval(self)

    def save(self, tokenizer: Any = None) -> Path:
        """config.yaml, tokenizer/, the full rack (save_rack) and stacks/ (save_stacks)."""
        acc = self.accelerator
        acc.wait_for_everyone()
        chained = self.chain() is not None
        on_main(acc, lambda: self.growing.save_final(tokenizer, chained))  # raised on every rank
        acc.wait_for_everyone()
        return self.output_dir


ProgressiveTrainer = ProgressiveRecipe
