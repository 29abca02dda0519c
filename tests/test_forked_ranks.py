"""The suite's forked ranks (forked_ranks.py) report a failed launch: the failing rank's exit
code and its words, the other ranks stopped rather than left waiting, a timeout said."""

from __future__ import annotations

import multiprocessing
import signal
import time

from forked_ranks import run_forked, wait_for_ranks
from multiproc import clean_env


def test_a_failing_launch_returns_the_first_failure_and_what_it_said(tmp_path):
    missing = tmp_path / "missing.yaml"
    proc = run_forked(2, ["train", str(missing)], tmp_path, clean_env(), timeout=120)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert f"Config '{missing}' is neither a file nor a preset" in " ".join(proc.stderr.split())
    assert "Traceback" not in proc.stderr


def _exit_with(code: int) -> None:
    raise SystemExit(code)


def _hang() -> None:
    time.sleep(120)


def test_a_failed_rank_stops_the_others_and_its_code_is_the_launchs():
    fork = multiprocessing.get_context("fork")
    ranks = [fork.Process(target=_exit_with, args=(3,)), fork.Process(target=_hang)]
    for process in ranks:
        process.start()
    try:
        assert wait_for_ranks(ranks, timeout=60) == 3
        # stopped by the launcher's SIGTERM (a rank waited out would still be running here)
        assert ranks[1].exitcode == -signal.SIGTERM
    finally:
        for process in ranks:
            process.kill()
            process.join()


def test_a_launch_past_its_timeout_says_so():
    fork = multiprocessing.get_context("fork")
    ranks = [fork.Process(target=_hang) for _ in range(2)]
    for process in ranks:
        process.start()
    try:
        assert wait_for_ranks(ranks, timeout=0.5) is None
    finally:
        for process in ranks:
            process.kill()
            process.join()
