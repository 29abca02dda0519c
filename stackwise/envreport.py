"""`stackwise env`: the facts a bug report needs, gathered without running any training."""

from __future__ import annotations

import logging
import os
import platform
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from stackwise.hwprobe import (
    FORCE_ENV,
    ISA_ENV,
    Verdict,
    probe,
    verdict_path,
)
from stackwise.machine import PACKAGES, cpu_flags, cuda_devices, threads, version
from stackwise.paths import cache_root

ENV_VARS = (
    ISA_ENV,
    FORCE_ENV,
    "HF_HUB_OFFLINE",
    "HF_DATASETS_OFFLINE",
    "WANDB_MODE",
    "STACKWISE_CACHE",
)


def _source_requirements(installed: list[str], source: Path | None = None) -> tuple[list, list]:
    """(the requirements to check, a note). In a source checkout the pyproject.toml beside the
    package is the truth: an editable install keeps the metadata of its last `pip install`, so
    ranges changed since then would go unchecked. The note says to reinstall when they differ."""
    import tomllib

    from packaging.requirements import Requirement

    source = source or Path(__file__).resolve().parents[1] / "pyproject.toml"
    try:
        declared = tomllib.loads(source.read_text())["project"]["dependencies"]
    except (OSError, KeyError, TypeError, tomllib.TOMLDecodeError):
        return installed, []  # an installed wheel: its metadata is what was declared

    def core(reqs: list[str]) -> set[str]:
        return {str(Requirement(r)) for r in reqs if "extra ==" not in r}

    if core(declared) == core(installed):
        return declared, []
    return declared, [
        f"stackwise's installed metadata predates {source}: its ranges are checked from that "
        "file; reinstall (pip install -e .) to bring the metadata up to date"
    ]


def out_of_range(
    requires: list[str] | None = None, version: Callable[[str], str] = version
) -> list[str]:
    """A line per installed library outside the range stackwise declares (pyproject.toml, read
    back from the installed metadata): a version we never tested is the first suspect."""
    from packaging.requirements import InvalidRequirement, Requirement

    lines: list[str] = []
    if requires is None:
        try:
            requires = metadata.requires("stackwise") or []
        except metadata.PackageNotFoundError:
            return ["stackwise's metadata is missing: reinstall it (pip install -e .)"]
        requires, stale = _source_requirements(requires)
        lines += stale
    for text in requires:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue  # an optional extra
        found = version(req.name)
        if found == "not installed":
            lines.append(f"{req.name} is not installed (stackwise needs {req.name}{req.specifier})")
        elif req.specifier and not req.specifier.contains(found, prereleases=True):
            lines.append(
                f"{req.name} {found} is outside the range stackwise declares ({req.specifier}): "
                f"untested; install one inside it, e.g. pip install '{req.name}{req.specifier}'"
            )
    return lines


def _bnb_cpu_path() -> str:
    quiet = logging.getLogger("bitsandbytes")  # its optional `kernels` notice is noise here
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        from bitsandbytes.functional import has_avx512bf16
    except Exception as err:
        return f"bitsandbytes unavailable ({type(err).__name__}: {err})"
    finally:
        quiet.setLevel(level)
    if has_avx512bf16():
        return "AVX512-BF16 (its packed eval layout is kept off: StackWise pins NF4 layers)"
    return "plain (dequantize + matmul)"


def _caches() -> dict[str, str]:
    from huggingface_hub import constants

    hf_home = constants.HF_HOME
    datasets_cache = os.environ.get("HF_DATASETS_CACHE") or os.path.join(hf_home, "datasets")
    return {
        "stackwise": str(cache_root()),
        "bf16 probe verdict": str(verdict_path()),
        "hf hub": constants.HF_HUB_CACHE,
        "hf datasets": datasets_cache,
    }


def collect(refresh_probe: bool = False) -> dict[str, Any]:
    """Everything the report prints, as plain data (`stackwise env --json`)."""
    from stackwise.train.hardware import describe_precision

    verdict = probe(refresh=refresh_probe)
    return {
        "versions": {name: version(name) for name in PACKAGES},
        "declared ranges": out_of_range() or ["every dependency is inside its declared range"],
        "python": f"{sys.version.split()[0]} ({platform.platform()})",
        "cpu": _cpu(verdict),
        "cuda": cuda_devices(),
        "threads": threads(),
        "precision": {
            "mixed_precision auto": describe_precision("auto"),
        },
        "environment": _environment(verdict),
        "caches": _caches(),
    }


def _cpu(verdict: Verdict) -> dict[str, Any]:
    """The CPU, its flags of interest, and what the bf16 probe found and how long it took."""
    model, flags = cpu_flags()
    return {
        "model": model,
        "torch capability": torch.backends.cpu.get_cpu_capability(),
        "flags": flags,
        "bf16 kernels in oneDNN": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
        "bf16 probe": verdict.summary(),
        "probe timing": (
            f"fp32 {verdict.fp32_ms or 0:.3f} ms, bf16 {verdict.bf16_ms or 0:.3f} ms per "
            f"512x256x256 matmul; probe took {verdict.probe_s:.2f} s "
            f"({'cached, read in' if verdict.cached else 'run now,'} "
            f"{verdict.check_s * 1e3:.1f} ms)"
        ),
        "probe conditions": verdict.conditions(),
        "bitsandbytes CPU path": _bnb_cpu_path(),
    }


def _environment(verdict: Verdict) -> dict[str, str]:
    """The variables that steer a run, marking the ISA cap the probe set itself."""
    capped = bool(verdict.isa_cap and not verdict.user_cap)
    return {
        v: os.environ.get(v, "unset")
        + (" (set by the bf16 probe)" if v == ISA_ENV and capped else "")
        for v in ENV_VARS
    }


def render(info: dict[str, Any]) -> str:
    lines = []
    for section, body in info.items():
        if isinstance(body, dict):
            lines.append(f"{section}:")
            width = max(len(k) for k in body) + 1
            lines += [f"  {k + ':':<{width}} {v}" for k, v in body.items()]
        elif isinstance(body, list):
            lines.append(f"{section}:")
            lines += [f"  {item}" for item in body]
        else:
            lines.append(f"{section}: {body}")
    return "\n".join(lines)
