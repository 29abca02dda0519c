"""Peak RSS figures are each process's own: the log's train/peak_rss_mb, and the benchmarks'
child runs, which Linux would otherwise charge with the size of the process that started them."""

from __future__ import annotations

import resource
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
