"""The probe's child process: try bf16 under each oneDNN cap until one survives, then time it.

The timing runs on one thread, fp32 and bf16 matmuls interleaved (their order alternating), and
keeps each one's best time: load can only slow a matmul down, so the best of many is the
closest to what the CPU does unhindered. A measurement taken under load, or one whose ratio
sits close to the threshold, is taken again (up to MAX_ATTEMPTS children) and the best times
of all of them are kept.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from stackwise.hwprobe.verdict import Verdict, load_per_core

ISA_ENV = "ONEDNN_MAX_CPU_ISA"
FALLBACK_CAPS: tuple[str, ...] = ("AVX512_CORE_BF16", "AVX2")
CHILD_TIMEOUT_S = 120.0
MAX_ATTEMPTS = 3

# The bf16 ops training uses (a matmul, then an autocast linear with its backward), then the
# timing. Prints one JSON line.
CHILD_CODE = """
import json, time, torch
native = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
a = torch.randn(64, 64).bfloat16()
(a @ a).float().sum().item()
x = torch.randn(32, 64, requires_grad=True)
lin = torch.nn.Linear(64, 64)
with torch.autocast("cpu", dtype=torch.bfloat16):
    y = lin(x)
y.float().sum().backward()
torch.set_num_threads(1)
mats = {d: (torch.randn(512, 256).to(d), torch.randn(256, 256).to(d))
        for d in (torch.float32, torch.bfloat16)}
for p, q in mats.values():
    p @ q
best = {d: float("inf") for d in mats}
wall, cpu = time.perf_counter(), time.thread_time()
for rep in range(24):
    for d in (list(mats) if rep % 2 == 0 else list(mats)[::-1]):
        p, q = mats[d]
        t0 = time.perf_counter()
        p @ q
        best[d] = min(best[d], time.perf_counter() - t0)
share = (time.thread_time() - cpu) / max(time.perf_counter() - wall, 1e-9)
print(json.dumps({"fp32_ms": 1e3 * best[torch.float32], "bf16_ms": 1e3 * best[torch.bfloat16],
                  "native": native, "cpu_share": min(share, 1.0)}))
"""


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def run_child(cap: str | None, code: str, base_env: dict[str, str]) -> tuple[str, dict | str]:
    """('ok', timings) | ('signal', name) | ('error', text) for one child under `cap`."""
    env = dict(base_env)
    if cap is None:
        env.pop(ISA_ENV, None)
    else:
        env[ISA_ENV] = cap
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code],
            env=env,
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return "error", f"could not run the probe: {err}"
    if proc.returncode < 0:
        return "signal", _signal_name(proc.returncode)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return "error", f"probe exited {proc.returncode}: {tail[0]}"
    try:
        return "ok", json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return "error", f"probe printed no verdict: {proc.stdout[-200:]!r}"


def _take(verdict: Verdict, timings: dict) -> None:
    """Fold one child's timings in: each dtype's best time so far, and the CPU share of this
    child (the latest, so a quieter run clears the `loaded` flag)."""
    for key in ("fp32_ms", "bf16_ms"):
        old = getattr(verdict, key)
        setattr(verdict, key, timings[key] if old is None else min(old, timings[key]))
    verdict.native = timings.get("native", verdict.native)
    share = timings.get("cpu_share")
    if share is not None:
        verdict.cpu_share = share


def run_probe(user_cap: str | None, code: str = CHILD_CODE) -> Verdict:
    """Try the caps in order until a child survives its bf16 matmuls; while the timing was
    taken under load or is marginal, time it again under the cap that worked."""
    start = time.perf_counter()
    caps: list[str | None] = [user_cap] if user_cap else [None, *FALLBACK_CAPS]
    verdict = Verdict(works=False, user_cap=bool(user_cap), load_per_core=load_per_core())
    env = dict(os.environ)
    for cap in caps:
        status, result = run_child(cap, code, env)
        if status == "ok":
            assert isinstance(result, dict)
            verdict.works, verdict.isa_cap = True, cap
            _take(verdict, result)
            break
        if status == "signal":
            verdict.trapped.append(f"{cap or 'default'}: {result}")
            continue
        verdict.error = str(result)  # not an ISA problem: a lower cap would not help
        break
    while verdict.works and (verdict.loaded or verdict.marginal):
        if verdict.attempts >= MAX_ATTEMPTS:
            break
        status, result = run_child(verdict.isa_cap, code, env)
        if status != "ok" or not isinstance(result, dict):
            break
        verdict.attempts += 1
        verdict.load_per_core = load_per_core()
        _take(verdict, result)
    verdict.probe_s = time.perf_counter() - start
    return verdict
