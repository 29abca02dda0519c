"""`TimeStepMasking(config)` (seed 003): a batch masked for one stack at its time step.

Time as depth (progressive.time_interpretation: depth): stack k trains at the noise range the
progressive depth mapping gives it (linear, exponential, a depth_time_table, or a function
given in Python), and `get_time_step_for_stack(k)` is the first grid step of that range. Time
as input: each batch draws one t uniformly from [0, 1] (a grid step when masking.num_time_steps
is set) and the rack is told t through its time embedding. The masks themselves are the run's
objective's (stackwise.objectives): the seed's `mlm` is our diffusion objective, whose mask
fraction follows the time step; `clm` masks nothing and predicts the next token; `custom` takes
its targets from the batch. Batches that carry sample keys (ProgressiveDataLoader with trunk
activations) draw t and masks from the key instead, so a cached activation stays valid.
"""

from __future__ import annotations

from typing import Any

import torch

from stackwise.config import Config, derive
from stackwise.data.blocks import specials_of
from stackwise.data.pack import build_data
from stackwise.data.tokenizer import make_tokenizer
from stackwise.errors import StackWiseError
from stackwise.objectives import objective_from
from stackwise.plan import compile_plan, stage_t_range
from stackwise.progressive.seed_loader import seed_batch
from stackwise.progressive.timing import TimeMapping
from stackwise.registry import OBJECTIVES

SEED_NAMES = {"diffusion": "mlm"}


def checked(config: Any, where: str, **changes: Any) -> Config:
    """`config` (attribute edits included) with `changes`, validated by every rule."""
    if not isinstance(config, Config):
        raise StackWiseError(
            f"{where} takes a StackWise config (StackWiseConfig.from_yaml(path) or "
            f"stackwise.load_config(path)), not a {type(config).__name__}."
        )
    return derive(config, changes, where)


def tokenizer_of(config: Config, given: Any = None, dataset: Any = None) -> Any:
    """The tokenizer the token ids come from: the one given, the dataset's, else the one the
    config's data section describes (a tokenizer dir or `byte`, or the BPE of its corpus)."""
    for tok in (given, getattr(dataset, "tokenizer", None)):
        if tok is not None:
            return tok
    d = config.data
    if d.tokenizer is not None and d.tokenizer != "char":
        return make_tokenizer(d.tokenizer, [], d.bpe_vocab_size, d.cache_dir)
    return build_data(compile_plan(config).data).tokenizer


class TimeStepMasking:
    def __init__(
        self, config: Any, time_mapping: TimeMapping | None = None, tokenizer: Any = None
    ) -> None:
        """`time_mapping(stack_idx, max_stacks, num_time_steps)`: the stacks' time steps when
        stack_time_mapping is custom (an int step, a t, or a (t_lo, t_hi) range)."""
        self.config = checked(config, "TimeStepMasking(config)")
        plan = compile_plan(self.config)
        self.specials = specials_of(tokenizer_of(self.config, tokenizer))
        self.objective = objective_from(plan.objective, plan.masking, self.specials)
        # the seed's name of the objective (its `mlm` masks by time step: our diffusion)
        self.training_objective = SEED_NAMES.get(plan.objective.name, plan.objective.name)
        self.uses_time = OBJECTIVES.capabilities(plan.objective.name).uses_time
        self.time_interpretation = plan.progressive.time_interpretation
        self.num_time_steps = plan.masking.num_time_steps
        self.max_stacks = plan.model.n_stacks
        self.seed = plan.train.seed
        self.time_mapping = time_mapping
        self._gens: dict[str, torch.Generator] = {}

    def _gen(self, device: torch.device) -> torch.Generator:
        key = str(device)
        if key not in self._gens:
            self._gens[key] = torch.Generator(device=device).manual_seed(self.seed)
        return self._gens[key]

    def t_range_for_stack(self, stack_idx: int) -> tuple[float, float]:
        """Stack `stack_idx`'s noise range (t_lo, t_hi] when time is depth."""
        if self.time_interpretation != "depth" or not self.uses_time:
            raise StackWiseError(
                "Time is an input here (time_interpretation: input): each batch draws its own "
                "time step, so no stack has one. Set training.progressive.time_interpretation: "
                "depth (with a masked objective) to tie time steps to stacks."
            )
        return stage_t_range(self.config, stack_idx, self.time_mapping)  # type: ignore[return-value]

    def get_time_step_for_stack(self, stack_idx: int) -> int:
        """The first discrete time step (0..num_time_steps-1) of stack `stack_idx`'s range."""
        lo, hi = self.t_range_for_stack(stack_idx)
        if self.num_time_steps is None:
            raise StackWiseError(
                f"Stack {stack_idx} trains at t in ({lo:g}, {hi:g}], a continuous range: "
                "discrete time steps need masking.num_time_steps (or time_per_stack, which "
                "makes the grid time_per_stack x max_stacks)."
            )
        return self.objective.with_range(lo, hi).grid_steps()[0]  # type: ignore[attr-defined]

    def objective_for_stack(self, stack_idx: int | None) -> Any:
        if stack_idx is None or self.time_interpretation != "depth" or not self.uses_time:
            return self.objective
        return self.objective.with_range(*self.t_range_for_stack(stack_idx))  # type: ignore[attr-defined]

    def generate_masks_for_stack(
        self, batch: dict[str, Any], stack_idx: int | None = 0
    ) -> dict[str, Any]:
        """`batch` ({'input_ids': (B, L), ...}) with what stack `stack_idx` trains on: inputs,
        targets, masks, combined_masks (where the loss counts), clm_mask (clm), t and
        time_steps (masked objectives), training_objective."""
        batch = dict(batch)
        if "targets" in batch and "labels" not in batch:  # custom: the seeds' name for them
            batch["labels"] = batch["targets"]
        ids = batch["input_ids"]
        gen = self._gen(ids.device)
        objective = self.objective_for_stack(stack_idx)
        keyed = "mask_key" in batch or "t" in batch
        if self.uses_time and self.time_interpretation == "input" and not keyed:
            u = torch.rand(1, generator=gen, device=ids.device)  # one t for the whole batch
            batch["t"] = objective.t_from_uniform(u).expand(ids.shape[0])
        prep = objective.prepare(batch, gen)
        name, steps = self.training_objective, self.num_time_steps
        return seed_batch(batch, prep, name, stack_idx, steps, self.uses_time)

    def generate_masks(self, batch: dict[str, Any]) -> dict[str, Any]:
        """A batch masked as the objective masks it, time not tied to any stack."""
        return self.generate_masks_for_stack(batch, None)
