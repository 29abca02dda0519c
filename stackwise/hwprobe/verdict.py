"""What the bf16 probe found, and when that finding is good enough to act on.

A speed ratio taken while other work shares the cores says little: the probe records how much
of the wall time its own thread actually ran (`cpu_share`) and the load average per core when
it started, so a verdict measured under load can be told apart, shown, and measured again.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

FORCE_ENV = "STACKWISE_BF16_PROBE"  # fast | slow | no-kernels | trap: forces the verdict
MIN_SPEEDUP = 1.1  # bf16 must beat fp32 by this much for `auto` to take it
MARGINAL = (0.9, 1.3)  # speedups in this band are measured again before they are trusted
LOADED_SHARE = 0.8  # the probe's thread ran less than this share of the wall time: contended
LOADED_PER_CORE = 1.0  # load average per core above this when the probe started: busy


@dataclass
class Verdict:
    """What the probe found. `isa_cap` is the ONEDNN_MAX_CPU_ISA bf16 needs (None: none);
    `native`: oneDNN has bf16 kernels here (None: not known)."""

    works: bool
    isa_cap: str | None = None
    user_cap: bool = False
    fp32_ms: float | None = None
    bf16_ms: float | None = None
    native: bool | None = None
    trapped: list[str] = field(default_factory=list)  # "default: SIGILL", ...
    error: str | None = None
    cpu_share: float | None = None  # share of wall time the last timing child's thread ran
    load_per_core: float | None = None  # 1-minute load average per core as the probe began
    attempts: int = 1  # timing children run (a loaded or marginal one is measured again)
    forced: str | None = None  # the FORCE_ENV value that made this verdict, if any
    probe_s: float = 0.0  # how long the probe itself took when it ran
    machine: str = ""
    created: float = field(default_factory=time.time)
    cached: bool = False  # read from the cache in this process
    check_s: float = 0.0  # how long this process spent getting the verdict

    @property
    def speedup(self) -> float | None:
        """fp32 time over bf16 time for the same matmul: above 1 means bf16 is faster."""
        if not self.works or not self.fp32_ms or not self.bf16_ms:
            return None
        return self.fp32_ms / self.bf16_ms

    @property
    def bf16_fast(self) -> bool:
        """bf16 works, has kernels (not emulation) and is clearly faster than fp32."""
        ratio = self.speedup
        return ratio is not None and self.native is not False and ratio >= MIN_SPEEDUP

    @property
    def loaded(self) -> bool:
        """Measured while other work competed for the timing thread: the CPU share it got says
        so directly; the load average stands in only where no share was recorded."""
        if self.cpu_share is not None:
            return self.cpu_share < LOADED_SHARE
        return self.load_per_core is not None and self.load_per_core > LOADED_PER_CORE

    @property
    def marginal(self) -> bool:
        ratio = self.speedup
        return ratio is not None and MARGINAL[0] <= ratio <= MARGINAL[1]

    def summary(self) -> str:
        """One line for headers and `stackwise env`."""
        forced = f" (forced by {FORCE_ENV}={self.forced})" if self.forced else ""
        if not self.works:
            why = "; ".join(self.trapped) or self.error or "unknown"
            return f"bf16 matmuls fail here ({why}){forced}"
        cap = f" with ONEDNN_MAX_CPU_ISA={self.isa_cap}" if self.isa_cap else ""
        trap = f" (default kernels: {'; '.join(self.trapped)})" if self.trapped else ""
        kernels = ", emulated (no bf16 kernels)" if self.native is False else ""
        ratio = f"{self.speedup:.2f}x" if self.speedup is not None else "?"
        return f"bf16 matmuls work{cap}{trap}{kernels}, {ratio} the speed of fp32{forced}"

    def conditions(self) -> str:
        """When and under what load it was measured, for `stackwise env`."""
        if self.forced:
            return f"not measured: forced by {FORCE_ENV}={self.forced}"
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(self.created))
        age_h = max(0.0, time.time() - self.created) / 3600
        parts = [f"measured {when} ({age_h:.1f} h ago)"]
        if self.cpu_share is not None:
            parts.append(f"the timing thread ran {self.cpu_share:.0%} of the wall time")
        if self.load_per_core is not None:
            parts.append(f"load average {self.load_per_core:.2f} per core")
        parts.append(f"{self.attempts} timing run(s)")
        if self.loaded:
            parts.append("under load: measured again at a start an hour on, on an idle machine")
        elif self.marginal:
            parts.append(f"close to the {MIN_SPEEDUP}x line on a free CPU: this CPU's own ratio")
        return ", ".join(parts)


FORCED = {
    "fast": {"works": True, "native": True, "fp32_ms": 2.0, "bf16_ms": 1.0},
    "slow": {"works": True, "native": True, "fp32_ms": 1.0, "bf16_ms": 1.25},
    "no-kernels": {"works": True, "native": False, "fp32_ms": 1.0, "bf16_ms": 10.0},
    "trap": {"works": False, "isa_cap": None, "trapped": ["forced: SIGILL under every cap"]},
}


def forced(real: Verdict, environ: Mapping[str, str] | None = None) -> Verdict:
    """`real` with the branch FORCE_ENV asks for (each branch of `auto` on any machine: tests
    and CI use it). Only the speed and kernel findings are forced: a CPU whose bf16 kernels
    crash keeps its cap, or its refusal, whatever is forced. Unset: `real` itself. An unknown
    value is a verdict whose error says so."""
    value = (os.environ if environ is None else environ).get(FORCE_ENV, "").strip()
    if not value:
        return real
    if value not in FORCED:
        return Verdict(
            works=False,
            forced=value,
            error=f"{FORCE_ENV}={value!r} is not one of {', '.join(FORCED)}; unset it to "
            "measure this CPU",
        )
    fields = {**asdict(real), "forced": value, **FORCED[value]}
    fields["works"] = fields["works"] and real.works
    return Verdict(**fields)


def load_per_core() -> float | None:
    """The 1-minute load average over the usable cores (None where the OS has none)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    try:
        return os.getloadavg()[0] / max(cores, 1)
    except (OSError, AttributeError):  # no load average here (Windows)
        return None
