"""What the benchmarks share: forked runs, quiet run sections, the clm resets, the --quick flag,
thread pinning and the machine line that heads a table.

A repetition runs in a forked child of the (imports-only) parent, so every run starts from the
same clean process state (heap, allocator thresholds, caches), as a real training run would,
instead of inheriting the memory layout of the run before it.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, TypeVar

from _record import add_flag as add_record_flag

# set on import, before stackwise, transformers or datasets read them: the hubs are not reached
# (benchmarks build their data locally); child processes inherit them
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

T = TypeVar("T")


def _child(conn: Connection, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    try:
        conn.send((True, fn(*args)))
    except BaseException as err:  # report any failure to the parent, then exit
        conn.send((False, f"{type(err).__name__}: {err}"))
    finally:
        conn.close()


def in_fork(label: str, fn: Callable[..., T], *args: Any) -> T:
    """fn(*args) in a forked child; its result comes back pickled. Failures name `label`."""
    ctx = mp.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(send, fn, args))
    proc.start()
    send.close()
    try:
        ok, value = receive.recv()
    except EOFError:
        proc.join()
        raise RuntimeError(f"{label} died (exit code {proc.exitcode})") from None
    proc.join()
    if not ok:
        raise RuntimeError(f"{label} failed: {value}")
    return value


# settings only masked racks read, back at their defaults for a clm run of the default preset
CLM_RESETS = [
    "sample.steps=32",
    "sample.sampler=auto",
    "sample.remasking=low_confidence",
    "sample.block_length=0",
    "sample.no_repeat_words=false",
    "masking.schedule=linear",
]


def quiet_logging(**extra: Any) -> dict[str, Any]:
    """A config's logging section that prints and writes nothing (plus `extra`)."""
    return {
        "console": False,
        "jsonl": False,
        "tensorboard": False,
        "progress_bar": "never",
        **extra,
    }


def fresh_output(output_dir: str | Path) -> dict[str, Any]:
    """train.* keys that send a run to `output_dir`, replacing what an earlier rep left."""
    return {"output_dir": str(output_dir), "overwrite_output_dir": True}


def benchmark_parser(doc: str | None, quick: str = "a short smoke run") -> argparse.ArgumentParser:
    """A benchmark's command line: described by its docstring's first paragraph, with --quick
    and --record."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=quick)
    add_record_flag(parser)
    return parser


def quick_flag(doc: str | None) -> argparse.Namespace:
    """The command line of a benchmark that only takes --quick (and --record)."""
    return benchmark_parser(doc).parse_args()


def pin_threads() -> None:
    """One torch thread for compute and one for inter-op, and no tokenizer threads, so timings
    of runs side by side on a shared machine compare; library warnings would interleave with
    the table."""
    import torch

    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    warnings.filterwarnings("ignore")


def machine_line(precision: str = "fp32 (mixed_precision no)") -> str:
    """What a table was measured on: versions, cores, torch threads, precision, CPU kernels."""
    import torch

    threads = torch.get_num_threads()
    return (
        f"torch {torch.__version__}, python {platform.python_version()}, {os.cpu_count()} CPU "
        f"cores, {threads} torch thread{'s' if threads > 1 else ''}, {precision}, CPU "
        f"capability {torch.backends.cpu.get_cpu_capability()}"
    )


# Starts the command from a small Python of its own and writes the command's peak RSS (KB) to
# argv[1]. Linux counts the memory of the process that exec'd a child into the child's peak
# (ru_maxrss), so a child started straight from a benchmark that has grown large would report
# the benchmark's size; started from this launcher (~10 MB), it reports its own.
PEAK_LAUNCHER = """
import os, sys
pid = os.posix_spawnp(sys.argv[2], sys.argv[2:], os.environ)
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as f:
    f.write(str(usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status))
"""


def status_mb(key: str) -> float:
    """A size from /proc/self/status (Linux) in MB: VmRSS the resident set now, VmHWM its
    peak so far."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"{key} is not in /proc/self/status: this measurement needs Linux")


def run_child(cmd: list[str], env: dict[str, str] | None = None) -> tuple[str, str, float, float]:
    """(stdout, stderr, wall seconds, peak RSS in MB) of a child process, its peak its own
    (see PEAK_LAUNCHER; the wall time includes the launcher's start, some 20 ms). A failure
    raises with the end of its stderr."""
    with (
        tempfile.TemporaryFile("w+") as out,
        tempfile.TemporaryFile("w+") as err,
        tempfile.TemporaryDirectory() as tmp,
    ):
        peak_file = Path(tmp) / "peak"
        launch = [sys.executable, "-S", "-c", PEAK_LAUNCHER, str(peak_file), *cmd]
        start = time.perf_counter()
        code = subprocess.run(launch, stdout=out, stderr=err, text=True, env=env).returncode
        wall = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
        peak_kb = int(peak_file.read_text()) if peak_file.exists() else 0
    if code != 0:
        raise RuntimeError(f"{' '.join(cmd[:5])} failed:\n{stderr[-3000:]}")
    return stdout, stderr, wall, peak_kb / 1024
