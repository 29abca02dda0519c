"""The GrowingRack: one value holding a progressive run's rack as it grows, and what it knows.

It grows a stack for a stage and sets every role (what trains, what is quantized, which adapters
exist), saves the stacks, writes the run's history after each stage, imports a trunk from a
Llama checkpoint, and regrows a resumed run from its history. The recipe (recipe.py) loops over
the plan's stage specs and asks it; nothing here reaches into a Trainer.

`progressive_history.json` holds each finished stage's record and every rank's RNG state as the
stage ended, so a resumed run grows its next stack from the same random state as an
uninterrupted one.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from stackwise.errors import StackWiseError
from stackwise.io.checkpoints import LATEST, rng_state, set_rng_state
from stackwise.io.files import cast_weight_files, read_json, read_tensors, write_atomic, write_json
from stackwise.io.final import final_save
from stackwise.io.hf_llama import load_llama_weights, read_llama_config
from stackwise.io.stack_files import (
    ANCHOR,
    HISTORY,
    STACKS_DIR,
    save_anchor_and_manifest,
    save_stack,
)
from stackwise.io.trained import save_model
from stackwise.model.chain import CHAIN_INPUT_VERSION
from stackwise.progressive.builder import QUANTIZED, ProgressiveRackBuilder
from stackwise.progressive.records import StackRecord
from stackwise.progressive.seed_builder import bind
from stackwise.spec import Plan, StageSpec
from stackwise.train.interrupts import StopSignals, TrainingInterrupted, any_rank_signalled

DAMAGED = "The run was made with another config, or its files are damaged: start a new run."


class GrowingRack:
    def __init__(
        self,
        plan: Plan,
        output_dir: Path,
        accelerator: Any,
        log: Callable[[str], None],
        builder: ProgressiveRackBuilder | None = None,
    ) -> None:
        """`builder`: a rack builder of the caller's to grow (see seed_builder.bind)."""
        self.plan, self.p = plan, plan.progressive
        self.output_dir, self.accelerator, self.log = output_dir, accelerator, log
        m = plan.model
        assert m.vocab_size is not None, "the plan resolves model.vocab_size"
        if builder is not None:
            bind(builder, plan)
        else:
            builder = ProgressiveRackBuilder(
                m,
                m.vocab_size,
                plan.objective.causal,
                building_mode=self.p.building_mode,
                num_time_steps=plan.masking.num_time_steps,
                double_quant=plan.quant.enabled and plan.quant.double_quant,
                growth_operator=self.p.growth.init,
                growth_noise=self.p.growth.noise,
            )
        self.builder = builder
        self.builder.rack.to(accelerator.device)
        self.records: list[StackRecord] = []
        self.joint: dict[str, Any] | None = None
        self.final: dict[str, float] | None = None

    @property
    def rack(self) -> Any:
        return self.builder.rack

    # -- roles ---------------------------------------------------------------------------------

    def backbone_format(self) -> str | None:
        """How a stack is stored once it is trunk: quantized when the plan says so."""
        q = self.plan.quant
        if self.p.trunk_strategy == "qlora":
            return q.type if q.enabled else "nf4"
        if q.enabled and q.backbone_quantized:
            return q.type
        return None

    def train_precision(self) -> str:
        """fp16 weights cannot train without loss scaling (Adam's state underflows), so an fp16
        stack trains in fp32 and is stored as fp16 once its stage ends (finish_stack)."""
        return "full" if self.p.new_stack_precision == "fp16" else self.p.new_stack_precision

    def grow(self, stage: StageSpec) -> Any:
        """Add stage `stage`'s stack with its precision and adapter, and set every role."""
        new = self.builder.add_stack(precision=self.train_precision(), adapter=stage.adapter)
        self.set_roles(stage.index)
        return new

    def set_roles(self, index: int) -> None:
        b, p = self.builder, self.p
        fmt = self.backbone_format()
        for stack in b.trunk:
            if fmt is not None and b.meta[stack].storage not in QUANTIZED:
                b.store_as(stack, fmt)  # once: stacks already quantized keep their format
            if self.plan.trunk_adapter is not None:  # one per trunk stack, made once, reused
                b.ensure_trunk_adapter(stack, self.plan.trunk_adapter)
            b.set_trainable(stack, p.trunk_strategy == "full")
            if self.plan.trunk_adapter is not None:
                b.set_trunk_adapter_trainable(stack, True)
            if p.trunk_strategy == "qlora":  # a qlora trunk trains every LoRA adapter it has
                b.set_lora_trainable(stack, True)
        assert b.new_stack is not None
        b.set_trainable(b.new_stack, True)
        anchor = {"train_first": index == 0, "always": True, "frozen": False}[p.head_policy]
        b.set_anchor_trainable(anchor)

    def finish_stack(self, stack: Any) -> None:
        """A stack whose stage ended takes its final storage (fp16 stacks trained in fp32)."""
        if self.train_precision() != self.p.new_stack_precision:
            self.builder.store_as(stack, self.p.new_stack_precision)
            self.builder.meta[stack].precision = self.p.new_stack_precision

    def t_range(self, index: int) -> tuple[float, float] | None:
        return self.plan.stages[index].t_range if index < len(self.plan.stages) else None

    def depth_ranges(self) -> list[tuple[int, float, float]] | None:
        """Per rack position, (growth index, lo, hi) when time is depth; else None. A fused
        rack is not routed: joint tuning trained the whole rack on every noise level."""
        if self.p.mode == "fused":
            return None
        ranges = []
        for stack in self.builder.rack.stacks:
            g = self.builder.growth_index(stack)
            tr = self.t_range(g)
            if tr is None:
                return None
            ranges.append((g, *tr))
        return ranges

    # -- files ---------------------------------------------------------------------------------

    def save_stacks(self, changed_only: bool, chained: bool, folder: Path | None = None) -> None:
        """The new stack (or every stack) plus the anchor and manifest."""
        b = self.builder
        for stack in [b.new_stack] if changed_only else list(b.rack.stacks):
            assert stack is not None
            g = b.growth_index(stack)
            info = {"position": b.position(stack), **b.meta[stack].as_dict()}
            if chained:
                info["chain_input"] = CHAIN_INPUT_VERSION
            save_stack(folder or self.output_dir, g, stack, {**info, "t_range": self.t_range(g)})
        order = [b.growth_index(s) for s in b.rack.stacks]
        save_anchor_and_manifest(folder or self.output_dir, b.rack, order)

    def save_final(self, tokenizer: Any, chained: bool) -> None:
        """The finished run's folder, staged: config.yaml, tokenizer/, the whole rack
        (save_rack) and stacks/ at their final positions (save_stacks)."""
        with final_save(self.output_dir) as out:
            write_atomic(out / "config.yaml", self.plan.to_yaml())
            if tokenizer is not None:
                tokenizer.save_pretrained(str(out / "tokenizer"))
            if self.p.save_rack:  # in train.save_precision
                save_model(self.builder.rack, out)
                cast_weight_files(out, self.plan.train.save_precision)
            if self.p.save_stacks:  # prepend shifts positions; joint tuning changes weights
                self.save_stacks(changed_only=False, chained=chained, folder=out)

    def write_history(self) -> None:
        """progressive_history.json: the records, joint tuning, final eval, every rank's RNG."""
        acc = self.accelerator
        states = [rng_state()]  # every rank's, gathered: ranks may draw differently (dropout)
        if acc.num_processes > 1:
            from accelerate.utils import gather_object

            states = gather_object(states)
        if not acc.is_main_process:
            return
        data = {
            "stacks": [r.as_dict() for r in self.records],
            "joint": self.joint,
            "final_eval": self.final,
            "rng_states": states,
        }
        write_json(self.output_dir / HISTORY, data)

    # -- import and resume -----------------------------------------------------------------------

    def start(self, n: int, chained: bool) -> None:
        """Before the first stage: an imported trunk, then a resumed run's finished stacks."""
        if self.plan.model.init_from_hf:
            self.import_trunk(chained)
        if self.plan.train.resume_from_checkpoint:
            self.restore(n)

    def stop_at_boundary(self, signals: StopSignals, n: int) -> None:
        """Stop between stages when a signal came while one ended or the next was being set
        up: the finished stacks and the history, which resume from there, are on disk. Before
        any stage finished, the first stage's own checkpoint holds the work instead."""
        if not self.records or not any_rank_signalled(self.accelerator, signals):
            return
        raise TrainingInterrupted(
            signals.received or "SIGTERM",  # a peer rank's signal
            sum(r.steps for r in self.records),
            self.output_dir / HISTORY,
            self.output_dir,
            where=f"after stack {len(self.records)} of {n}",
        )

    def import_trunk(self, chained: bool) -> None:
        """model.init_from_hf: the checkpoint's layers become the first stacks (blocks_per_stack
        layers each) with its embeddings, final norm and head, all frozen; their stack files are
        saved so the run folder describes the whole rack."""
        b, folder = self.builder, Path(self.plan.model.init_from_hf or "").expanduser()
        layers = int(read_llama_config(folder)["num_hidden_layers"])
        n = layers // self.plan.model.blocks_per_stack
        for _ in range(n):
            b.add_stack(precision="full")
        load_llama_weights(b.rack, folder)
        b.new_stack = None
        for stack in b.grown:
            b.set_trainable(stack, False)
        b.set_anchor_trainable(False)
        target = self.plan.model.n_stacks
        self.log(f"imported {n} stack(s) from {folder} as the frozen trunk; growing to {target}")
        if self.p.save_stacks and not self.plan.train.resume_from_checkpoint:
            self.save_stacks(changed_only=False, chained=chained)

    def restore(self, n: int) -> None:
        """Regrow the stacks whose stages finished (as the history records them), load their
        saved weights, and restore the RNG as it stood when the last of them ended. Stacks
        already in place (an imported trunk) take their saved state too."""
        start = len(self.builder.grown)
        path = self.output_dir / HISTORY
        if not path.is_file():
            if (self.output_dir / f"stack_{start}" / LATEST).is_file():
                return  # interrupted during the first stage: it resumes on its own
            raise StackWiseError(
                f"train.resume_from_checkpoint is 'latest', but '{self.output_dir}' holds "
                f"neither {HISTORY} nor a stage checkpoint (stack_{start}/{LATEST}): nothing "
                "was saved there yet. Check train.output_dir, set train.save_steps, or start "
                "without resuming."
            )
        saved = read_json(path, DAMAGED)
        done = saved["stacks"][: n - start]
        for index in range(start, start + len(done)):
            self.finish_stack(self.grow(self.plan.stages[index]))
        self._load_saved_stacks()
        self.records = [
            StackRecord(**{**r, "t_range": tuple(r["t_range"]) if r["t_range"] else None})
            for r in done
        ]
        self._restore_rng(saved["rng_states"], path)
        self.log(f"resuming after {len(done)} finished stage(s) of {n}")

    def _load_saved_stacks(self) -> None:
        """Every stack and the anchor from stacks/: an imported trunk may have trained too."""
        from stackwise.quant.layers import load_quantized_state

        b, root = self.builder, self.output_dir / STACKS_DIR
        try:
            b.rack.load_state_dict(read_tensors(root / ANCHOR, DAMAGED), strict=False)
            for stack in b.rack.stacks:
                g = b.growth_index(stack)
                load_quantized_state(stack, read_tensors(root / f"stack_{g}.safetensors", DAMAGED))
        except (KeyError, RuntimeError) as err:
            raise StackWiseError(
                f"Cannot restore the finished stacks from '{root}' ({str(err)[:160]}). {DAMAGED}"
            ) from None

    def _restore_rng(self, states: list[Any], path: Path) -> None:
        acc = self.accelerator
        if len(states) != acc.num_processes:
            raise StackWiseError(
                f"'{path}' was written by {len(states)} processes and this run has "
                f"{acc.num_processes}; resume with the same number of processes."
            )
        set_rng_state(states[acc.process_index])
