"""ProgressiveTrainer: grow a rack one stack at a time, each stage run by the foundation Trainer.

For stack g (in growth order) it adds the stack, sets what trains (new stack; trunk per
`trunk_strategy`; embeddings and head per `head_policy`), builds that stack's objective (its
overrides, and its noise range when time is depth), and trains it for its budget. Each stage
logs under `<run>/stack_<g>/` (so TensorBoard shows one curve per stack), saves the stack as it
finishes, and adds a row to the per-stack history.
"""

from __future__ import annotations

import itertools
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch.optim.lr_scheduler import LambdaLR

from stackwise.config import Config, derive, save_config, stack_config
from stackwise.data.pack import PreparedData
from stackwise.errors import StackWiseError
from stackwise.io.checkpoints import rng_state, set_rng_state
from stackwise.io.files import write_atomic
from stackwise.io.stack_files import (
    ANCHOR,
    STACKS_DIR,
    save_anchor_and_manifest,
    save_stack,
)
from stackwise.io.trained import save_model
from stackwise.model.chain import DenoisingChain
from stackwise.model.rack import Rack, count_parameters
from stackwise.objectives import Diffusion, Objective, build_objective
from stackwise.progressive.builder import QUANTIZED, AdapterSpec, ProgressiveRackBuilder
from stackwise.progressive.cache import ActivationCache
from stackwise.progressive.stage import KeyedSamples, StageModel, advance_cache
from stackwise.progressive.timing import TimeMapping, depth_range
from stackwise.quant.lora import rank_for
from stackwise.train.evaluation import eval_generator, evaluate_model
from stackwise.train.hardware import make_accelerator
from stackwise.train.optim import lr_factor
from stackwise.train.run_dir import claim_output_dir
from stackwise.train.state import Stage
from stackwise.train.trainer import Trainer

HISTORY = "progressive_history.json"
LATEST = "latest"


@dataclass
class StackRecord:
    index: int
    position: int
    steps: int
    tokens: int
    seconds: float
    trainable_params: int
    t_range: tuple[float, float] | None
    train_loss: float | None
    eval: dict[str, float]
    cache: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


@dataclass
class ProgressiveResult:
    rack: Rack
    output_dir: Path
    stacks: list[StackRecord]
    final_eval: dict[str, float]
    joint: dict[str, Any] | None = None


def _with(config: Config, **sections: dict[str, Any]) -> Config:
    # a stage's budget is its train.max_steps: the per-stack budget keys have been resolved
    changes: dict[str, Any] = {
        "progressive.steps_per_stack": None,
        "progressive.epochs_per_stack": None,
    }
    for sec, values in sections.items():
        changes.update({f"{sec}.{key}": value for key, value in values.items()})
    return derive(config, changes, "a stage's config")


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
        self.time_mapping = time_mapping
        if time_mapping is not None:
            self._check_mapping_reaches_full_noise()
        self.accelerator: Accelerator = make_accelerator(config.train.mixed_precision)
        self.output_dir = claim_output_dir(self.accelerator, config, output_dir)
        self.builder = ProgressiveRackBuilder(
            config.model,
            config.model.vocab_size,
            config.objective.causal,
            config.masking.num_time_steps,
            self.p.building_mode,
            double_quant=config.quant.enabled and config.quant.double_quant,
        )
        self.builder.rack.to(self.accelerator.device)
        self.cache: ActivationCache | None = None
        self._cache_signature: Any = None
        self.records: list[StackRecord] = []

    # -- per-stack settings -------------------------------------------------------------------

    def t_range(self, index: int) -> tuple[float, float] | None:
        """Stack `index`'s noise range, always mapped over model.n_stacks (the full depth),
        so growing in several calls or stopping early never changes a stack's range."""
        if self.config.objective.name != "diffusion" or self.p.time_interpretation != "depth":
            return None
        return depth_range(
            index,
            self.config.model.n_stacks,
            self.p,
            self.config.masking.num_time_steps,
            self.time_mapping,
        )

    def objective_for(self, cfg: Config, t_range: tuple[float, float] | None) -> Objective:
        obj = build_objective(cfg, self.data.specials)
        if t_range is not None:
            assert isinstance(obj, Diffusion)
            obj = obj.with_range(*t_range)
        return obj

    def budget(self, index: int, n_items: int, n_stacks: int) -> int:
        over = self.p.stacks.get(index)
        tc = self.config.train
        per_step = tc.batch_size * tc.grad_accum_steps * self.accelerator.num_processes
        epochs = over.epochs if over and over.epochs else self.p.epochs_per_stack
        if over and over.steps:
            return over.steps
        if (over and over.epochs) or (self.p.epochs_per_stack and not self.p.steps_per_stack):
            assert epochs is not None
            return max(1, math.ceil(epochs * n_items / per_step))
        if self.p.steps_per_stack:
            return self.p.steps_per_stack
        return max(1, tc.max_steps // n_stacks)

    def global_scheduler(self, optimizer: Any, cfg: Config, index: int) -> LambdaLR:
        """Stage `index`'s slice of one schedule over every stage's steps (lr_schedule global):
        the warmup happens once, in stage 0, and the LR only decays after it."""
        n, items = self.config.model.n_stacks, len(self.data.train)
        budgets = [self.budget(i, items, n) for i in range(n)]
        offset = sum(budgets[:index])
        whole = cfg.train.model_copy(update={"max_steps": sum(budgets)})
        return LambdaLR(optimizer, lambda step: lr_factor(offset + step, whole))

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
            if fmt is not None and b.storage[id(stack)] not in QUANTIZED:
                b.store_as(stack, fmt)  # once: stacks already quantized keep their format
            b.set_trainable(stack, p.trunk_strategy == "full")
            if lo.trunk_adapters:  # one adapter per trunk stack, created once, then reused
                b.ensure_trunk_adapter(stack, self.adapter_spec(lo.trunk_rank, lo.trunk_alpha))
                b.set_trunk_adapter_trainable(stack, True)
        assert b.new_stack is not None
        b.set_trainable(b.new_stack, True)
        anchor = {"train_first": index == 0, "always": True, "frozen": False}[p.head_policy]
        b.set_anchor_trainable(anchor)

    # -- cache --------------------------------------------------------------------------------

    def _variants(self, objective: Objective) -> tuple[int, list[float] | None]:
        c = self.p.cache
        if c.store_all_time_steps:
            assert isinstance(objective, Diffusion) and objective.num_time_steps
            steps = objective.grid_steps()
            return len(steps), [(k + 1) / objective.num_time_steps for k in steps]
        return c.time_step_cache_size, None

    def prepare_cache(self, cfg: Config, objective: Objective, model: StageModel) -> int:
        """Make the cache ready for this stage; returns entries carried over incrementally."""
        c = self.p.cache
        variants, _ = self._variants(objective)
        n_keys = len(self.data.train) * variants
        signature = (
            cfg.objective.model_dump_json(),
            cfg.masking.model_dump_json(),
            getattr(objective, "t_range", None),
            variants,
            cfg.train.seed,
        )
        if self.cache is None:
            folder = None
            if c.storage == "disk":
                root = Path(c.dir) / self.output_dir.name if c.dir else self.output_dir / "cache"
                folder = root / f"rank{self.accelerator.process_index}"
            self.cache = ActivationCache(
                n_keys,
                cfg.data.seq_len,
                cfg.model.d_model,
                c.dtype,
                c.storage,
                folder,
                c.max_bytes,
                c.on_full,
                c.mode,
                boundaries=max(1, self.config.model.n_stacks - 1),
            )
        carried = 0
        b = model.boundary
        if signature == self._cache_signature and b - 1 in self.cache.stores:
            # same corrupted inputs as the last stage: push its entries through the new trunk
            # stack instead of recomputing the whole trunk on the next misses
            carried = advance_cache(
                self.cache,
                b - 1,
                model.before[-1],
                self.builder.rack,
                self.accelerator.device,
                self.accelerator.autocast,
            )
        else:  # other inputs (objective, noise range, seed): every stored state is stale
            self.cache.drop_except(-1)
        self._cache_signature = signature
        return carried

    # -- the loop -----------------------------------------------------------------------------

    def _log(self, msg: str) -> None:
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
            self.builder.precisions[id(stack)] = self.p.new_stack_precision

    def train_stage(self, index: int, n_stacks: int) -> StackRecord:
        p, b, acc = self.p, self.builder, self.accelerator
        new = self.grow(index)
        cfg = stack_config(self.config, index)
        t_range = self.t_range(index)
        objective = self.objective_for(cfg, t_range)
        use_cache = p.cache.enabled and index > 0
        cache = None
        if use_cache:
            probe = StageModel(b.rack, new)
            carried = self.prepare_cache(cfg, objective, probe)
            cache = self.cache
            variants, times = self._variants(objective)
            train_data: Any = KeyedSamples(self.data.train, variants, cfg.train.seed, times)
        else:
            carried = 0
            train_data = self.data.train
        steps = self.budget(index, len(self.data.train), n_stacks)  # epochs over samples
        cfg = _with(
            cfg,
            train={
                "max_steps": steps,
                "seed": (cfg.train.seed + index) % 2**31,
                "output_dir": str(self.output_dir / f"stack_{index}"),
                "overwrite_output_dir": True,
                "resume_from_checkpoint": self.stage_resume(self.output_dir / f"stack_{index}"),
            },
            logging={"run_name": None},
        )
        chain = self.chain()
        b.rack.set_depth_routing(self.depth_ranges() if chain else None, chain)
        model = StageModel(b.rack, new, cache, acc.mixed_precision)
        before = cache.stats.as_dict() if cache else {}
        calls_before = cache.trunk_calls if cache else 0
        self._log(
            f"stack {index + 1}/{n_stacks} at position {b.position(new)}: {steps} steps, "
            f"{count_parameters(b.rack, trainable_only=True):,} trainable parameters"
            + (f", t in ({t_range[0]:.3f}, {t_range[1]:.3f}]" if t_range else "")
            + (f", cache carried {carried:,} entries" if use_cache else "")
        )
        trainer = Trainer(
            cfg,
            model,
            objective,
            train_data,
            self.data.val,
            accelerator=acc,
            stage=Stage(index, f"stack {index + 1}/{n_stacks}", self),
            eval_objective=build_objective(self.config, self.data.specials),
            eval_seed=self.config.train.seed,
            scheduler=(
                (lambda opt: self.global_scheduler(opt, cfg, index))
                if p.lr_schedule == "global"
                else None
            ),
        )
        self.last_trainer = trainer  # inspected by tests (optimizer membership)
        trainer.call_hook("on_stack_begin", index)
        start = time.perf_counter()
        trainer.defer_finish = True  # finished once on_stack_end has run
        state = trainer.train()
        seconds = time.perf_counter() - start
        b.rack.set_depth_routing(None)  # the next stage grows the rack
        losses = [h for h in state.history if "loss" in h]
        cache_info: dict[str, Any] = {}
        if cache is not None:
            now = cache.stats.as_dict()
            cache_info = {k: now[k] - before.get(k, 0) for k in now}
            cache_info["trunk_forwards"] = cache.trunk_calls - calls_before
            cache_info["bytes"] = cache.nbytes
            cache_info["carried"] = carried
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
            cache=cache_info,
        )
        self.finish_stack(new)
        if p.save_stacks and acc.is_main_process:
            # a trunk that trains, gains adapters or is quantized on freezing is saved again
            self.save_stacks(
                changed_only=p.trunk_strategy == "frozen"
                and self.backbone_format() is None
                and not self.config.lora.trunk_adapters
            )
        acc.wait_for_everyone()
        return record

    def save_stacks(self, changed_only: bool) -> None:
        """The new stack (and, when the trunk trains too, every stack) plus anchor/manifest."""
        b = self.builder
        order = [b.growth_index(s) for s in b.rack.stacks]
        todo = [b.new_stack] if changed_only else list(b.rack.stacks)
        for stack in todo:
            assert stack is not None
            g = b.growth_index(stack)
            save_stack(
                self.output_dir,
                g,
                stack,
                {
                    "position": b.position(stack),
                    "precision": b.precisions[id(stack)],
                    "storage": b.storage[id(stack)],
                    "adapters": {
                        k: [v.rank, v.alpha, str(v.dtype).removeprefix("torch.")]
                        for k, v in b.adapters[id(stack)].items()
                    },
                    "t_range": self.t_range(g),
                },
            )
        save_anchor_and_manifest(self.output_dir, b.rack, order)

    def joint_tuning(self) -> dict[str, Any]:
        """mode fused: every parameter that can train trains together, ordinary backprop over the
        rack: embeddings, norms, head, full-precision stacks and LoRA adapters. Quantized base
        weights (packed integer codes) cannot, so a qlora trunk adapts through its adapters."""
        rack = self.builder.rack
        for p in rack.parameters():
            p.requires_grad_(p.is_floating_point() and not getattr(p, "_stackwise_fixed", False))
        steps = self.p.joint_tuning_steps
        cfg = _with(
            self.config,
            train={
                "max_steps": steps,
                "seed": (self.config.train.seed + 10_000) % 2**31,
                "output_dir": str(self.output_dir / "joint"),
                "overwrite_output_dir": True,
                "resume_from_checkpoint": self.stage_resume(self.output_dir / "joint"),
            },
            logging={"run_name": None},
        )
        self._log(f"joint tuning of the whole rack: {steps} steps")
        objective = build_objective(self.config, self.data.specials)
        trainer = Trainer(
            cfg,
            rack,
            objective,
            self.data.train,
            self.data.val,
            accelerator=self.accelerator,
            stage=Stage(None, "joint", self),
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

    def _check_mapping_reaches_full_noise(self) -> None:
        n = self.config.model.n_stacks
        ranges = [self.t_range(i) for i in range(n)]
        if all(r is not None for r in ranges):
            top = max(r[1] for r in ranges if r is not None)
            if top < 1.0 - 1e-9:
                raise StackWiseError(
                    f"The time mapping gives the {n} stacks noise levels up to t={top:g} only, but "
                    "sampling starts from full noise (t=1). Make the last stack's range reach 1."
                )
            tops = [r[1] for r in ranges if r is not None]
            if self.chain() and any(b >= a for a, b in itertools.pairwise(tops)):
                raise StackWiseError(
                    f"progressive.depth_order: high_to_low grows a denoising chain from stack 0 "
                    f"at the highest noise down; the time mapping gives range tops {tops}, which "
                    "do not decrease. Give stack 0 the noisiest range."
                )

    def chain(self) -> DenoisingChain | None:
        """The denoising chain of a rack grown high-noise-to-low (time as depth), else None."""
        if self.p.time_interpretation != "depth" or self.p.depth_order != "high_to_low":
            return None
        objective = build_objective(self.config, self.data.specials)
        assert isinstance(objective, Diffusion)
        return DenoisingChain(self.data.specials.mask_id, objective.schedule.mask_fraction)

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
        """The grown rack on the base objective (full noise range), like any other model.

        With time as depth the rack is scored as it samples, routed by noise level (each t runs
        the stacks grown up to the one trained for it), and the whole rack's score is kept
        beside it (`whole_rack_nelbo`) so the two can be compared."""
        ranges = self.depth_ranges()
        if ranges is None:
            return self._score_rack()
        self.builder.rack.set_depth_routing(None)
        whole = self._score_rack()
        self.builder.rack.set_depth_routing(ranges, self.chain())
        routed = self._score_rack()
        routed["whole_rack_nelbo"] = whole["nelbo"]
        if "bpc" in whole:
            routed["whole_rack_bpc"] = whole["bpc"]
        return routed

    def _score_rack(self) -> dict[str, float]:
        rack = self.builder.rack
        objective = build_objective(self.config, self.data.specials)
        acc = self.accelerator
        gen = torch.Generator(device=acc.device)
        seed = self.config.train.seed
        out = evaluate_model(
            rack,
            objective,
            self.data.val,
            acc,
            self.config.train,
            rack.uses_time,
            lambda i: eval_generator(gen, seed, i, acc.process_index),
        )
        rack.train()
        return out

    def train_progressively(self, target_stacks: int | None = None) -> ProgressiveResult:
        n = target_stacks or self.config.model.n_stacks
        if n > self.config.model.n_stacks:
            raise StackWiseError(
                f"target_stacks={n} exceeds model.n_stacks={self.config.model.n_stacks}, which "
                "sets the depth used to scale initialisation and the noise mapping."
            )
        if self.config.train.resume_from_checkpoint and not self.builder.grown:
            self.restore_progress(n)
        self.builder.rack.set_depth_routing(None)  # routing is for the finished rack only
        for index in range(len(self.builder.grown), n):
            try:
                record = self.train_stage(index, n)
                self.records.append(record)
                self.write_history()
                self.last_trainer.call_hook("on_stack_end", index, record)
            finally:  # the stage's loggers close after its stack's own report, or on failure
                if getattr(self, "last_trainer", None) is not None:
                    self.last_trainer.finish()
        joint = self.joint_tuning() if self.p.mode == "fused" else None
        final = self.final_eval()
        self.joint = joint
        self.final = final
        self.write_history()
        if self.cache is not None:
            self.cache.close()
        return ProgressiveResult(self.builder.rack, self.output_dir, self.records, final, joint)

    def write_history(self) -> None:
        states = [rng_state()]  # every rank's, gathered: ranks may draw differently (dropout)
        if self.accelerator.num_processes > 1:
            from accelerate.utils import gather_object

            states = gather_object(states)
        if not self.accelerator.is_main_process:
            return
        data = {
            "stacks": [r.as_dict() for r in self.records],
            "joint": getattr(self, "joint", None),
            "final_eval": getattr(self, "final", None),
            # where the global RNG stood when the last stage ended: a resumed run grows the
            # next stack from the same random state
            "rng_states": states,
        }
        write_atomic(self.output_dir / HISTORY, json.dumps(data, indent=1))

    # -- resuming -------------------------------------------------------------------------

    def stage_resume(self, stage_dir: Path) -> str | None:
        """A stage restarts from its own latest checkpoint when this run resumes."""
        if self.config.train.resume_from_checkpoint and (stage_dir / LATEST).is_file():
            return "latest"
        return None

    def restore_progress(self, n: int) -> None:
        """Regrow the stacks whose stages finished (as history.json records them), load their
        saved weights, and restore the RNG as it stood when the last of them ended. The
        interrupted stage then resumes from its own checkpoint (or starts over); the activation
        cache is rebuilt as stages run."""
        from stackwise.quant.layers import load_quantized_state

        path = self.output_dir / HISTORY
        if not path.is_file():
            if (self.output_dir / "stack_0" / LATEST).is_file():
                return  # interrupted during the first stage: it resumes on its own
            raise StackWiseError(
                f"train.resume_from_checkpoint is 'latest', but '{self.output_dir}' holds neither "
                f"{HISTORY} nor a stage checkpoint (stack_0/{LATEST}): nothing was saved there "
                "yet. Check train.output_dir, set train.save_steps, or start without resuming."
            )
        saved = json.loads(path.read_text())
        done = saved["stacks"][:n]
        b = self.builder
        for index in range(len(done)):
            self.finish_stack(self.grow(index))
        root = self.output_dir / STACKS_DIR
        try:
            anchor = load_file(str(root / ANCHOR))
            b.rack.load_state_dict(anchor, strict=False)
            for stack in b.rack.stacks:
                g = b.growth_index(stack)
                load_quantized_state(stack, load_file(str(root / f"stack_{g}.safetensors")))
        except (OSError, KeyError, RuntimeError, SafetensorError) as err:
            raise StackWiseError(
                f"Cannot restore the finished stacks from '{root}' ({str(err)[:160]}). The run "
                "was made with another config, or its stack files are damaged."
            ) from None
        self.records = [
            StackRecord(**{**r, "t_range": tuple(r["t_range"]) if r["t_range"] else None})
            for r in done
        ]
        states = saved["rng_states"]
        if len(states) != self.accelerator.num_processes:
            raise StackWiseError(
                f"'{path}' was written by {len(states)} processes and this run has "
                f"{self.accelerator.num_processes}; resume with the same number of processes."
            )
        set_rng_state(states[self.accelerator.process_index])
        self._log(f"resuming after {len(done)} finished stage(s) of {n}")

    def save(self, tokenizer: Any = None) -> Path:
        """config.yaml, tokenizer/, the full rack (save_rack) and stacks/ (save_stacks)."""
        acc = self.accelerator
        acc.wait_for_everyone()
        if acc.is_main_process:
            out = self.output_dir
            save_config(self.config, out / "config.yaml")
            if tokenizer is not None:
                tokenizer.save_pretrained(str(out / "tokenizer"))
            if self.p.save_rack:
                save_model(self.builder.rack, out)
            if self.p.save_stacks:  # final positions (prepend shifts them) and joint tuning
                self.save_stacks(changed_only=False)
        acc.wait_for_everyone()
        return self.output_dir


def summary_table(result: ProgressiveResult) -> str:
    """One row per stack: steps, tokens, time, its eval, the cache's work."""
    head = (
        f"{'stack':>5} {'pos':>3} {'steps':>6} {'tokens':>10} {'time s':>7} {'t range':>13} "
        f"{'val loss':>8} {'nelbo/ppl':>9} {'val bpc':>7} {'cache hit%':>10}"
    )
    rows = [head, "-" * len(head)]
    for r in result.stacks:
        ev = r.eval
        metric = ev.get("nelbo", ev.get("ppl", float("nan")))
        tr = f"({r.t_range[0]:.2f},{r.t_range[1]:.2f}]" if r.t_range else "all"
        c = r.cache
        hit = f"{100 * c['hits'] / max(1, c['hits'] + c['misses']):.0f}%" if c else "-"
        rows.append(
            f"{r.index:>5} {r.position:>3} {r.steps:>6} {r.tokens:>10,} {r.seconds:>7.1f} "
            f"{tr:>13} {ev.get('loss', float('nan')):>8.3f} {metric:>9.3f} "
            f"{ev.get('bpc', float('nan')):>7.3f} {hit:>10}"
        )
    f = result.final_eval
    if f:
        metric = f.get("nelbo", f.get("ppl", float("nan")))
        rows.append(
            f"final rack (full noise range): val loss {f['loss']:.3f}, "
            + (f"NELBO {metric:.3f}" if "nelbo" in f else f"ppl {metric:.2f}")
            + (f", {f['bpc']:.3f} bits per character" if "bpc" in f else "")
            + (
                f"; routed by noise level (time as depth) vs the whole rack's NELBO "
                f"{f['whole_rack_nelbo']:.3f}"
                if "whole_rack_nelbo" in f
                else ""
            )
        )
    return "\n".join(rows)
