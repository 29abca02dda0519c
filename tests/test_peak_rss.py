"""Peak RSS figures are each process's own: the log's train/peak_rss_mb, and the benchmarks'
child runs, which Linux would otherwise charge with the size of the process that started them."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from stackwise.train.peak_memory import own_peak_rss_mb

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.append(str(BENCHMARKS))

import _common as bench  # noqa: E402

GROW = "x = bytearray({mb} * 2**20); x[::4096] = b'1' * len(x[::4096]); print('grown')"


def test_the_log_reads_the_high_water_mark_from_proc(tmp_path):
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmPeak:\t 900000 kB\nVmHWM:\t  51200 kB\nVmRSS:\t 40000 kB\n")
    assert own_peak_rss_mb(str(status)) == 50.0
    status.write_bytes(b"Name:\ttr\xe4in\xff\nVmHWM:\t  10240 kB\n")  # a process name of any bytes
    assert own_peak_rss_mb(str(status)) == 10.0


@pytest.mark.skipif(sys.platform != "linux", reason="ru_maxrss is in KB on Linux")
def test_without_proc_the_log_falls_back_to_getrusage(tmp_path):
    fallback = own_peak_rss_mb(str(tmp_path / "missing"))
    assert fallback == resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@pytest.mark.skipif(sys.platform != "linux", reason="/proc and wait4's accounting are Linux's")
def test_a_benchmark_child_reports_its_own_peak_not_its_parents():
    ballast = bytearray(300 * 2**20)  # this process grows by 300 MB before starting the child
    ballast[::4096] = b"1" * len(ballast[::4096])
    parent = own_peak_rss_mb()
    assert parent is not None and parent > 300
    out, _, _, peak = bench.run_child([sys.executable, "-S", "-c", GROW.format(mb=40)])
    assert out.strip() == "grown"
    assert 40 < peak < 100 < parent  # its own 40 MB and Python, not the 300 MB it came from
    del ballast


def test_a_failing_benchmark_child_raises_with_its_error():
    with pytest.raises(RuntimeError, match="boom"):
        bench.run_child([sys.executable, "-S", "-c", "raise SystemExit('boom')"])


# a child followed by _peak_parts (through the sitecustomize peak_memory.py gives it) grows by
# 64 MB of touched pages in one large block, waits until the follower has seen the new high (at
# most 20 s), and exits: the record written at exit must hold the block. The sitecustomize it
# shadows (one on the child's PYTHONPATH already) still runs
PARTS_CHILD = """
import sys, time
import _peak_parts
before = _peak_parts.breakdown()
x = bytearray(64 * 2**20); x[::4096] = b'1' * len(x[::4096])
deadline = time.monotonic() + 20
while _peak_parts.HIGHEST["parts"]["rss"] < before["rss"] + 60 and time.monotonic() < deadline:
    time.sleep(0.01)
import builtins
print(before["malloc in use"], getattr(builtins, "CHAINED", False))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="/proc/self/smaps is Linux's")
def test_the_peak_breakdown_finds_a_large_block_that_malloc_handed_out(tmp_path):
    import _peak_parts

    record, shadowed = tmp_path / "parts.json", tmp_path / "shadowed"
    shadowed.mkdir()
    (shadowed / "sitecustomize.py").write_text("import builtins\nbuiltins.CHAINED = True\n")
    env = {**os.environ, **_peak_parts.probe_env(tmp_path / "probe", record, str(shadowed))}
    child = [sys.executable, "-c", PARTS_CHILD]
    proc = subprocess.run(child, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    in_use_before, chained = proc.stdout.split()
    assert chained == "True"
    parts = json.loads(record.read_text())
    assert parts["error"] == "" and parts["samples"] >= 1, parts
    if parts["malloc in use"] is not None:  # glibc 2.33+
        assert parts["malloc in use"] - float(in_use_before) >= 60


@pytest.mark.skipif(sys.platform != "linux", reason="/proc/self/smaps is Linux's")
def test_the_peak_breakdown_agrees_with_the_kernels_totals():
    import _peak_parts

    status = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        status[key] = int(value.split()[0]) / 1024 if value.strip().endswith("kB") else None
    parts = _peak_parts.breakdown()
    assert parts["rss"] == pytest.approx(status["VmRSS"], abs=2)
    assert parts["files"] == pytest.approx(status["RssFile"] + status["RssShmem"], abs=2)


def test_without_the_variable_the_peak_breakdown_stays_off(monkeypatch):
    import threading

    import _peak_parts

    monkeypatch.delenv("PEAK_PARTS_FILE", raising=False)
    running = threading.active_count()
    _peak_parts.follow()
    assert threading.active_count() == running
