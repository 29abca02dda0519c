"""The suite's forked ranks (forked_ranks.py) report a failed launch as torchrun does: the
failing rank's exit code and its words, the other ranks stopped rather than left waiting."""

from __future__ import annotations

from forked_ranks import run_forked
from multiproc import clean_env


def test_a_failing_launch_returns_the_first_failure_and_what_it_said(tmp_path):
    missing = tmp_path / "missing.yaml"
    proc = run_forked(2, ["train", str(missing)], tmp_path, clean_env(), timeout=120)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert f"Config '{missing}' is neither a file nor a preset" in " ".join(proc.stderr.split())
    assert "Traceback" not in proc.stderr
