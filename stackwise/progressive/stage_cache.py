"""One activation cache over the stages of a progressive run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stackwise.objectives import Diffusion, Objective
from stackwise.progressive.cache import ActivationCache
from stackwise.progressive.stage import advance_cache
from stackwise.spec import CacheSpec, Plan
from stackwise.train.flops import FlopMeter


class StageCache:
    """The activation cache across the stages of one run: built at the first cached stage,
    carried forward (pushed through the newly frozen stack) when the next stage sees the same
    corrupted inputs, and emptied when they change (objective, noise range or seed)."""

    def __init__(self, plan: Plan, n_items: int, output_dir: Path, acc: Any) -> None:
        """`plan`: the run's (progressive.cache, data.seq_len, model.d_model and n_stacks)."""
        self.spec: CacheSpec = plan.progressive.cache
        self.seq_len, self.d_model = plan.data.seq_len, plan.model.d_model
        if plan.model.diffusion_block is not None:  # the trunk runs [noised; clean]
            self.seq_len *= 2
        self.boundaries = max(1, plan.model.n_stacks - 1)
        self.n_items, self.output_dir, self.acc = n_items, output_dir, acc
        self.cache: ActivationCache | None = None
        self.signature: Any = None
        self.carry_flops = 0.0  # what the last carry-over cost (training compute, forward only)

    def variants(self, objective: Objective) -> tuple[int, list[float] | None]:
        c = self.spec
        if c.store_all_time_steps:
            assert isinstance(objective, Diffusion) and objective.num_time_steps
            steps = objective.grid_steps()
            return len(steps), [(k + 1) / objective.num_time_steps for k in steps]
        return c.time_step_cache_size, None

    def prepare(self, stage: Plan, objective: Objective, model: Any, rack: Any) -> int:
        """Make the cache ready for this stage (`stage`: its objective, masking and the seed
        its samples are keyed by); returns entries carried over incrementally."""
        variants, _ = self.variants(objective)
        signature = (
            stage.objective,
            stage.masking,
            getattr(objective, "t_range", None),
            variants,
            stage.train.seed,
        )
        if self.cache is None:
            self.cache = self._new_cache(self.n_items * variants)
        carried, meter = 0, None
        b = model.boundary
        if signature == self.signature and b - 1 in self.cache.stores:
            # same corrupted inputs as the last stage: push its entries through the new trunk
            # stack instead of recomputing the whole trunk on the next misses
            meter = FlopMeter(rack)
            with meter.counting():
                carried = advance_cache(
                    self.cache,
                    b - 1,
                    model.before[-1],
                    rack,
                    self.acc.device,
                    self.acc.autocast,
                )
            meter.detach()
        else:  # other inputs (objective, noise range, seed): every stored state is stale
            self.cache.drop_except(-1)
        self.signature = signature
        self.carry_flops = meter.total * self.acc.num_processes if meter is not None else 0.0
        return carried

    def _new_cache(self, n_keys: int) -> ActivationCache:
        c = self.spec
        folder = None
        if c.storage == "disk":
            root = Path(c.dir) / self.output_dir.name if c.dir else self.output_dir / "cache"
            folder = root / f"rank{self.acc.process_index}"
        return ActivationCache(
            n_keys,
            self.seq_len,
            self.d_model,
            c.dtype,
            c.storage,
            folder,
            c.max_bytes,
            c.on_full,
            c.mode,
            boundaries=self.boundaries,
        )

    def snapshot(self) -> tuple[dict[str, Any], int]:
        if self.cache is None:
            return {}, 0
        return self.cache.stats.as_dict(), self.cache.trunk_calls

    def since(self, before: tuple[dict[str, Any], int], carried: int | None) -> dict[str, Any]:
        """The cache's work over one stage: hits, misses, trunk forwards, size, carried."""
        assert self.cache is not None
        stats, calls = before
        now = self.cache.stats.as_dict()
        info: dict[str, Any] = {k: now[k] - stats.get(k, 0) for k in now}
        info["trunk_forwards"] = self.cache.trunk_calls - calls
        info["bytes"] = self.cache.nbytes
        info["carried"] = carried or 0
        info["carry_flops"] = self.carry_flops if carried else 0.0
        return info
