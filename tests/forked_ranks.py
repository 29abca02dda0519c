"""The suite's multi-process runs as ranks forked from one process that already imported torch.

A rank started by torchrun is a fresh interpreter: `import torch` and `torch._dynamo` (which
every torch optimizer imports) cost it about 7 CPU-seconds on the 2-core CI machine before it
trains for 2-4, and the agent costs 3 more. The FSDP, QLoRA-under-FSDP and DeepSpeed tests
launch about forty such runs, most of the suite's CPU time. Here a multiprocessing forkserver,
started once per pytest worker, imports those modules once; each rank is forked from it with
the environment torchrun gives a rank, runs `stackwise.cli.run` as the `stackwise` command
does, and ends through its exit path (os._exit after a flush for a rank of several, as under
torchrun). What a rank computes is what it computes under torchrun; tests whose subject is
the launch itself keep torchrun (test_distributed.py, the seeds' launcher commands, the
two-node rendezvous in test_fsdp.py).
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import wait
from pathlib import Path

# imported once by the forkserver; our own modules import in each rank as they do under
# torchrun (a module that read the environment at import would otherwise see the server's)
PRELOAD = ["torch", "torch._dynamo"]
GRACE_S = 15  # after one rank failed, the others have this long to stop on SIGTERM
_context: multiprocessing.context.ForkServerContext | None = None


def _forkserver() -> multiprocessing.context.ForkServerContext:
    global _context
    if _context is None:
        from stackwise.train.sampler import ipc_tempdir_that_fits

        ipc_tempdir_that_fits()  # the server listens on an AF_UNIX socket under it (.ci/run)
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
    return _context


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def rank_environment(rank: int, world: int, port: int) -> dict[str, str]:
    """The variables torchrun --standalone sets for a rank, less its agent's store."""
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "GROUP_RANK": "0",
        "ROLE_RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(world),
        "ROLE_WORLD_SIZE": str(world),
        "GROUP_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }


def _rank_main(args: list[str], cwd: str, env: dict[str, str], out: str, err: str) -> None:
    """In the forked child: the environment and working folder of the launch, stdout and
    stderr to files, then the `stackwise` command."""
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    sys.argv = ["stackwise", *args]
    from stackwise.cli import run

    try:
        run(args)
    except SystemExit:
        atexit._run_exitfuncs()  # an interpreter's exit runs them; multiprocessing's does not
        raise


def run_forked(
    world: int | None, args: list[str], cwd: Path, env: dict[str, str], timeout: float = 240
) -> subprocess.CompletedProcess:
    """`stackwise ARGS` as WORLD ranks (None: one plain process, no rank variables). The
    result reads as torchrun's: exit 0 when every rank exited 0 (else the first failure's
    code), the ranks' stdout and stderr joined in rank order. A rank that fails stops the
    others, as torchrun does; a launch past `timeout` is killed and raises TimeoutExpired."""
    context = _forkserver()
    port = _free_port()
    logs = Path(tempfile.mkdtemp(prefix="ranks-"))
    ranks = []
    for rank in range(world or 1):
        rank_env = {**env, **(rank_environment(rank, world, port) if world else {})}
        out, err = str(logs / f"{rank}.out"), str(logs / f"{rank}.err")
        process = context.Process(target=_rank_main, args=(args, str(cwd), rank_env, out, err))
        process.start()
        ranks.append(process)
    try:
        first_failure = _wait(ranks, timeout, args)
    finally:
        for process in ranks:
            if process.exitcode is None:
                process.kill()
                process.join()
    read = [(logs / f"{r}.out", logs / f"{r}.err") for r in range(len(ranks))]
    said = subprocess.CompletedProcess(
        args=["stackwise", *args],
        returncode=first_failure,
        stdout="".join(_text(out) for out, _ in read),
        stderr="".join(_text(err) for _, err in read),
    )
    shutil.rmtree(logs, ignore_errors=True)
    return said


def _text(path: Path) -> str:
    """What a rank wrote there; nothing if it failed before opening the file."""
    return path.read_text(errors="replace") if path.is_file() else ""


def _wait(ranks: list, timeout: float, args: list[str]) -> int:
    """Until every rank exited: the exit code of the first to fail (128 + N for signal N),
    0 when none did."""
    deadline = time.monotonic() + timeout
    running = {process.sentinel: process for process in ranks}
    failure = 0
    while running:
        left = deadline - time.monotonic()
        if left <= 0:
            if failure:  # past torchrun's grace period: run_forked kills the rest
                return failure
            raise subprocess.TimeoutExpired(["stackwise", *args], timeout)
        for sentinel in wait(list(running), timeout=left):
            process = running.pop(sentinel)
            process.join()
            code = process.exitcode
            if code != 0 and not failure:  # the others may be waiting for it in a collective
                failure = code if code > 0 else 128 - code
                deadline = min(deadline, time.monotonic() + GRACE_S)
                for other in running.values():
                    other.terminate()
    return failure
