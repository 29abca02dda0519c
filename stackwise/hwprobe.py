"""Can this CPU run bf16 matmuls, and are they faster than fp32? Asked of a child process.

Some VMs advertise AMX, and oneDNN's AMX bf16 kernels then die with SIGILL ("Illegal
instruction"): a crash no Python code can catch. So the first bf16 matmul is tried in a child
process. If the child dies of a signal, oneDNN is capped with `ONEDNN_MAX_CPU_ISA` (first at
AVX512_CORE_BF16, then AVX2) and the child tries again. oneDNN reads that variable at its first
use, so the cap works as long as it is set before this process runs any bf16 matmul; StackWise
probes when the package is imported.

The verdict is cached per (CPU model and flags, kernel, torch version, user cap) under the cache
dir, behind a file lock, so a warm check is a file read and torchrun's ranks never probe at the
same time: the first one probes and the others read its verdict.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, MutableMapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from stackwise.paths import cache_root

ISA_ENV = "ONEDNN_MAX_CPU_ISA"
SET_BY_PROBE_ENV = "STACKWISE_ISA_SET_BY_PROBE"  # marks a cap this probe set, not the user
ERROR_TTL_S = 3600.0  # a probe that failed without a signal is tried again after this
FALLBACK_CAPS: tuple[str, ...] = ("AVX512_CORE_BF16", "AVX2")
PROBE_VERSION = 1
CHILD_TIMEOUT_S = 120.0

# The child: the bf16 ops training uses (a matmul, then an autocast linear with its backward),
# then fp32 and bf16 matmuls timed interleaved, as medians. Prints one JSON line.
CHILD_CODE = """
import json, statistics, time, torch
a = torch.randn(64, 64).bfloat16()
(a @ a).float().sum().item()
x = torch.randn(32, 64, requires_grad=True)
lin = torch.nn.Linear(64, 64)
with torch.autocast("cpu", dtype=torch.bfloat16):
    y = lin(x)
y.float().sum().backward()
m, k, n = 512, 256, 256
mats = {d: (torch.randn(m, k).to(d), torch.randn(k, n).to(d))
        for d in (torch.float32, torch.bfloat16)}
times = {d: [] for d in mats}
for rep in range(9):
    for d, (p, q) in mats.items():
        t0 = time.perf_counter()
        p @ q
        if rep >= 2:
            times[d].append(time.perf_counter() - t0)
ms = {str(d).split(".")[-1]: 1e3 * statistics.median(v) for d, v in times.items()}
print(json.dumps({"fp32_ms": ms["float32"], "bf16_ms": ms["bfloat16"]}))
"""


@dataclass
class Verdict:
    """What the probe found. `isa_cap` is the ONEDNN_MAX_CPU_ISA bf16 needs (None: none)."""

    works: bool
    isa_cap: str | None = None
    user_cap: bool = False
    fp32_ms: float | None = None
    bf16_ms: float | None = None
    trapped: list[str] = field(default_factory=list)  # "default: SIGILL", ...
    error: str | None = None
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
        return self.speedup is not None and self.speedup > 1.0

    def summary(self) -> str:
        """One line for headers and `stackwise env`."""
        if not self.works:
            why = "; ".join(self.trapped) or self.error or "unknown"
            return f"bf16 matmuls fail here ({why})"
        cap = f" with {ISA_ENV}={self.isa_cap}" if self.isa_cap else ""
        trap = f" (default kernels: {'; '.join(self.trapped)})" if self.trapped else ""
        ratio = f"{self.speedup:.2f}x" if self.speedup is not None else "?"
        return f"bf16 matmuls work{cap}{trap}, {ratio} the speed of fp32"


def cpu_description() -> tuple[str, str]:
    """(model name, flags) of the first CPU in /proc/cpuinfo, or what `platform` knows."""
    found: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            found.setdefault(key.strip(), value.strip())
    model = found.get("model name") or platform.processor() or platform.machine()
    return model, found.get("flags") or found.get("Features", "")


def machine_key(user_cap: str | None) -> tuple[str, str]:
    """(cache file stem, human description) for this CPU, kernel, torch and user cap. The torch
    version comes from its package metadata: importing torch costs a second on every command."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        torch_version = version("torch")
    except PackageNotFoundError:
        torch_version = "unknown"
    model, flags = cpu_description()
    parts = [model, flags, platform.release(), torch_version, user_cap or "", PROBE_VERSION]
    digest = hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]
    return f"bf16-{digest}", f"{model}; kernel {platform.release()}; torch {torch_version}"


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


def run_probe(user_cap: str | None, code: str = CHILD_CODE) -> Verdict:
    """Try the caps in order until a child survives its bf16 matmuls."""
    start = time.perf_counter()
    caps: list[str | None] = [user_cap] if user_cap else [None, *FALLBACK_CAPS]
    verdict = Verdict(works=False, user_cap=bool(user_cap))
    for cap in caps:
        status, result = run_child(cap, code, dict(os.environ))
        if status == "ok":
            assert isinstance(result, dict)
            verdict.works, verdict.isa_cap = True, cap
            verdict.fp32_ms, verdict.bf16_ms = result["fp32_ms"], result["bf16_ms"]
            break
        if status == "signal":
            verdict.trapped.append(f"{cap or 'default'}: {result}")
            continue
        verdict.error = str(result)  # not an ISA problem: a lower cap would not help
        break
    verdict.probe_s = time.perf_counter() - start
    return verdict


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock between processes (torchrun ranks); a no-op where fcntl is missing."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not Linux
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _read(path: Path) -> Verdict | None:
    try:
        data = json.loads(path.read_text())
        data.pop("cached", None)
        data.pop("check_s", None)
        return Verdict(**data)
    except (OSError, ValueError, TypeError):
        return None  # missing or corrupt: probe again


def _write(path: Path, verdict: Verdict) -> None:
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(asdict(verdict), indent=1))
    os.replace(tmp, path)


def user_isa_cap(environ: MutableMapping[str, str] | None = None) -> str | None:
    """The ONEDNN_MAX_CPU_ISA the user chose: None when unset, or when this probe set it."""
    environ = os.environ if environ is None else environ
    value = environ.get(ISA_ENV) or None
    return None if value is not None and environ.get(SET_BY_PROBE_ENV) == value else value


def verdict_path(cache_dir: str | Path | None = None, stem: str | None = None) -> Path:
    stem = stem or machine_key(user_isa_cap())[0]
    return cache_root(str(cache_dir) if cache_dir else None) / "hwprobe" / f"{stem}.json"


def _fresh(verdict: Verdict | None) -> Verdict | None:
    """A cached verdict, unless it records a failure (not a trap) older than ERROR_TTL_S."""
    if verdict is None or verdict.works or verdict.trapped:
        return verdict
    return verdict if time.time() - verdict.created < ERROR_TTL_S else None


def probe(
    cache_dir: str | Path | None = None, code: str = CHILD_CODE, refresh: bool = False
) -> Verdict:
    """The cached verdict for this machine, probing (once, under a lock) when there is none.
    An unwritable cache dir costs the cache, never the probe."""
    start = time.perf_counter()
    user_cap = user_isa_cap()
    stem, machine = machine_key(user_cap)
    path = verdict_path(cache_dir, stem)
    verdict = None if refresh else _fresh(_read(path))
    if verdict is not None:
        verdict.cached = True
    else:
        try:
            with _locked(path.with_suffix(".lock")):
                verdict = None if refresh else _fresh(_read(path))  # another rank just probed
                if verdict is None:
                    verdict = _run_and_store(user_cap, code, machine, path)
                else:
                    verdict.cached = True
        except OSError:  # no lock without a writable cache dir: probe uncached
            verdict = run_probe(user_cap, code)
            verdict.machine = machine
    verdict.check_s = time.perf_counter() - start
    return verdict


def _run_and_store(user_cap: str | None, code: str, machine: str, path: Path) -> Verdict:
    verdict = run_probe(user_cap, code)
    verdict.machine = machine
    with contextlib.suppress(OSError):
        _write(path, verdict)
    return verdict


_told = False


def apply(verdict: Verdict, environ: MutableMapping[str, str] | None = None) -> bool:
    """Set the oneDNN cap the verdict needs (never over the user's own); True if it was set."""
    global _told
    environ = os.environ if environ is None else environ
    if verdict.user_cap or not verdict.isa_cap or user_isa_cap(environ):
        return False
    environ[ISA_ENV] = verdict.isa_cap
    environ[SET_BY_PROBE_ENV] = verdict.isa_cap  # children inherit both: not a user cap
    if not _told and os.environ.get("RANK", "0") == "0":
        _told = True
        print(
            f"stackwise: bf16 matmuls crash this CPU's default oneDNN kernels "
            f"({'; '.join(verdict.trapped)}), so oneDNN is capped at {ISA_ENV}="
            f"{verdict.isa_cap} for this process. Set {ISA_ENV} yourself to choose another cap.",
            file=sys.stderr,
        )
    return True


_verdict: Verdict | None = None


def ensure_bf16_ready() -> Verdict:
    """Probe once per process and apply the verdict; call before the first bf16 matmul."""
    global _verdict
    if _verdict is None:
        _verdict = probe()
        apply(_verdict)
    return _verdict
