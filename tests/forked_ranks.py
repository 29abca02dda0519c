"""The suite's multi-process runs as ranks forked from one process that already imported torch.

A rank started by torchrun is a fresh interpreter: `import torch` and `torch._dynamo` (which
every torch optimizer imports) cost it about 7 CPU-seconds on the 2-core CI machine before it
trains for 2-4, and the agent costs 3 more. The FSDP, QLoRA-under-FSDP and DeepSpeed tests
launch about forty such runs, most of the suite's CPU time. Here a multiprocessing forkserver,
started once per pytest worker, imports those modules once; each rank is forked from it with
the environment torchrun gives a rank (its rendezvous store held by the launching test, as
torchrun's agent holds it), runs `stackwise.cli.run` as the `stackwise` command does, and ends
through its exit path: os._exit after a flush for a rank of several, as under torchrun.

What a rank computes is what it computes under torchrun. What it cannot show is a fresh
interpreter's own start and end: warnings printed while torch imports, and the teardown of a
one-process run (multiprocessing ends every child with os._exit). Tests whose subject is the
launch keep torchrun (`torchrun=True` in multiproc.py: test_distributed.py, the seeds'
launcher commands, the two-node rendezvous, one one-process FSDP run in test_fsdp.py).
"""

from __future__ import annotations

import atexit
import io
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from pathlib import Path

# Imported once by the forkserver. Our own modules import in each rank, as under torchrun.
# torch reads OMP_NUM_THREADS as it imports, so a rank sets its thread count from the variable
# itself (_rank_main); other variables torch reads at import are the pytest worker's.
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


def rank_environment(rank: int, world: int, port: int) -> dict[str, str]:
    """The variables torchrun --standalone gives a rank (not its TORCHELASTIC_RUN_ID, error
    file or restart limit, which nothing here reads); the ranks meet at the launcher's store on
    `port`, as torchrun's meet at its agent's (TORCHELASTIC_USE_AGENT_STORE)."""
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
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCHELASTIC_RESTART_COUNT": "0",
    }


def _rank_main(args: list[str], cwd: str, env: dict[str, str], out: str, err: str) -> None:
    """In the forked child: the launch's environment and working folder, stdout and stderr
    unbuffered to files (torchrun runs its ranks with `python -u`; a rank killed at a timeout
    keeps what it printed), then the `stackwise` command, ending as an interpreter does."""
    import torch

    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    if "OMP_NUM_THREADS" in env:
        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    multiprocessing.set_start_method(None, force=True)  # the platform's default, as in a new one
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    sys.stdout, sys.stderr = (_unbuffered(fd) for fd in (1, 2))
    sys.argv = ["stackwise", *args]
    from stackwise.cli import run

    try:
        run(args)  # a rank of several leaves through os._exit in there, as under torchrun
    except SystemExit:
        atexit._run_exitfuncs()  # an interpreter's exit runs them; multiprocessing's does not
        raise
    except BaseException:
        sys.excepthook(*sys.exc_info())  # an interpreter's order: the hook, then atexit
        atexit._run_exitfuncs()
        raise SystemExit(1) from None


def _unbuffered(fd: int) -> io.TextIOWrapper:
    return io.TextIOWrapper(
        io.FileIO(fd, "w", closefd=False), encoding="utf-8", errors="backslashreplace",
        write_through=True,
    )  # fmt: skip


def run_forked(
    world: int | None, args: list[str], cwd: Path, env: dict[str, str], timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    """`stackwise ARGS` as WORLD ranks (None: one plain process, no rank variables): exit 0
    when every rank exited 0, else the code of the first rank to fail (torchrun would say 1),
    the ranks' stdout and stderr joined in rank order. A rank that fails stops the others, as
    torchrun does; a launch past `timeout` is killed and raises TimeoutExpired with what the
    ranks said."""
    from torch.distributed import TCPStore

    context = _forkserver()
    store_timeout = timedelta(seconds=timeout)
    store = TCPStore("127.0.0.1", 0, is_master=True, timeout=store_timeout) if world else None
    logs = Path(tempfile.mkdtemp(prefix="ranks-"))
    files = [(logs / f"{r}.out", logs / f"{r}.err") for r in range(world or 1)]
    ranks: list[BaseProcess] = []
    try:
        for rank, (out, err) in enumerate(files):
            rank_env = {**env, **(rank_environment(rank, world, store.port) if store else {})}
            ranks.append(
                context.Process(
                    target=_rank_main, args=(args, str(cwd), rank_env, str(out), str(err))
                )
            )
            ranks[-1].start()
        code = wait_for_ranks(ranks, timeout)
        if code is None:
            _stop(ranks)  # then read what they said
            raise subprocess.TimeoutExpired(
                ["stackwise", *args], timeout, output=_joined(files, 0), stderr=_joined(files, 1)
            )
        return subprocess.CompletedProcess(
            ["stackwise", *args], code, stdout=_joined(files, 0), stderr=_joined(files, 1)
        )
    finally:
        _stop(ranks)
        shutil.rmtree(logs, ignore_errors=True)
        del store  # a TimeoutExpired's traceback would keep its server listening


def _stop(ranks: list[BaseProcess]) -> None:
    for process in ranks:
        if process.exitcode is None:
            process.kill()
            process.join()


def _joined(files: list[tuple[Path, Path]], which: int) -> str:
    """What the ranks wrote to stdout (0) or stderr (1), in rank order; nothing for a rank
    that failed before opening its files."""
    paths = [pair[which] for pair in files]
    return "".join(path.read_text(errors="replace") for path in paths if path.is_file())


def wait_for_ranks(ranks: list[BaseProcess], timeout: float) -> int | None:
    """Until every rank exited: the exit code of the first to fail (128 + N for signal N), 0
    when none did, None past `timeout` with none failed."""
    deadline = time.monotonic() + timeout
    running = {process.sentinel: process for process in ranks}
    failure = 0
    while running:
        left = deadline - time.monotonic()
        if left <= 0:  # past the timeout, or past the grace after a failure
            return failure or None
        for sentinel in wait(list(running), timeout=left):
            process = running.pop(sentinel)
            process.join()
            code = process.exitcode or 0
            if code != 0 and not failure:  # the others may be waiting for it in a collective
                failure = code if code > 0 else 128 - code
                deadline = min(deadline, time.monotonic() + GRACE_S)
                for other in running.values():
                    other.terminate()
    return failure
