"""Can this CPU run bf16 matmuls, and are they faster than fp32? Asked of a child process.

Some VMs advertise AMX, and oneDNN's AMX bf16 kernels then die with SIGILL ("Illegal
instruction"): a crash no Python code can catch. So the first bf16 matmul is tried in a child
process. If the child dies of a signal, oneDNN is capped with `ONEDNN_MAX_CPU_ISA` (first at
AVX512_CORE_BF16, then AVX2) and the child tries again. oneDNN reads that variable at its first
use, so the cap works as long as it is set before this process runs any bf16 matmul; StackWise
probes when the package is imported.

The verdict is cached per (CPU model and flags, kernel, torch version, user cap) under the cache
dir, behind a file lock, so a warm check is a file read and torchrun's ranks never probe at the
same time: the first one probes and the others read its verdict. A cached verdict that was
measured under load or sits close to the threshold is measured again once the machine is idle,
and every verdict is measured again after MAX_AGE_S.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import sys
import time
from collections.abc import Iterator, MutableMapping
from dataclasses import asdict
from pathlib import Path

from stackwise.hwprobe.child import CHILD_CODE, FALLBACK_CAPS, ISA_ENV, run_child, run_probe
from stackwise.hwprobe.verdict import FORCE_ENV, Verdict, forced, load_per_core
from stackwise.paths import cache_root

__all__ = [
    "CHILD_CODE",
    "FALLBACK_CAPS",
    "FORCE_ENV",
    "ISA_ENV",
    "Verdict",
    "apply",
    "ensure_bf16_ready",
    "probe",
    "run_child",
    "run_probe",
    "verdict_path",
]

SET_BY_PROBE_ENV = "STACKWISE_ISA_SET_BY_PROBE"  # marks a cap this probe set, not the user
ERROR_TTL_S = 3600.0  # a probe that failed without a signal is tried again after this
RECHECK_S = 3600.0  # a loaded or marginal verdict is re-measured (when idle) after this
MAX_AGE_S = 30 * 86400.0  # any verdict is re-measured after this (drivers, microcode change)
IDLE_PER_CORE = 0.5  # load average per core under which the machine counts as idle
PROBE_VERSION = 2


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
    """A cached verdict still to be trusted, or None to measure again: a failure (not a trap)
    older than ERROR_TTL_S; any verdict older than MAX_AGE_S; one timed under load and older
    than RECHECK_S once the machine is idle (a load-average read, no child). A marginal ratio
    timed on a free CPU is this CPU's own: it stays. Under torchrun the load never decides, so
    every rank reads the same verdict from the shared file."""
    if verdict is None:
        return None
    age = time.time() - verdict.created
    if not verdict.works and not verdict.trapped:
        return verdict if age < ERROR_TTL_S else None
    if age >= MAX_AGE_S:
        return None
    several_ranks = int(os.environ.get("WORLD_SIZE", "1") or 1) > 1
    if verdict.loaded and age >= RECHECK_S and not several_ranks:
        load = load_per_core()
        if load is not None and load < IDLE_PER_CORE:
            return None
    return verdict


def probe(
    cache_dir: str | Path | None = None, code: str = CHILD_CODE, refresh: bool = False
) -> Verdict:
    """The cached verdict for this machine, probing (once, under a lock) when there is none.
    An unwritable cache dir costs the cache, never the probe. FORCE_ENV overrides the real
    probe (not a probe of test code)."""
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
    return forced(verdict) if code == CHILD_CODE else verdict


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
