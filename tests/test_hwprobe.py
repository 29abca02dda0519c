"""The bf16 probe: its fallback when bf16 matmuls trap (forced here with children that kill
themselves with SIGILL, so every machine checks it), its cache and lock, and what `auto` picks."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from stackwise import hwprobe
from stackwise.errors import StackWiseError
from stackwise.hwprobe import FORCE_ENV, ISA_ENV, Verdict, apply, probe
from stackwise.train import hardware

TIMINGS = 'print(\'{"fp32_ms": 2.0, "bf16_ms": 1.0, "native": true, "cpu_share": 1.0}\')'


def child(body: str, log: Path) -> str:
    """Child code that logs the cap it ran under, then runs `body`."""
    return textwrap.dedent(
        f"""
        import json, os, signal
        with open({str(log)!r}, "a") as f:
            f.write(os.environ.get({ISA_ENV!r}, "default") + "\\n")
        """
    ) + textwrap.dedent(body)


def runs(log: Path) -> list[str]:
    return log.read_text().split() if log.exists() else []


@pytest.fixture
def no_user_cap(monkeypatch):
    monkeypatch.delenv(ISA_ENV, raising=False)
    monkeypatch.delenv(FORCE_ENV, raising=False)  # these tests probe for real


def traps_by_default(log: Path) -> str:
    """Child code that dies of SIGILL unless oneDNN is capped at AVX512_CORE_BF16, as the
    default kernels of some AMX VMs do."""
    return child(
        f"""
        if os.environ.get({ISA_ENV!r}) != "AVX512_CORE_BF16":
            os.kill(os.getpid(), signal.SIGILL)
        {TIMINGS}
        """,
        log,
    )


def test_a_trapping_default_falls_back_to_the_bf16_cap_and_is_cached(tmp_path, no_user_cap):
    log = tmp_path / "runs.txt"
    code = traps_by_default(log)
    verdict = probe(tmp_path, code)
    assert runs(log) == ["default", "AVX512_CORE_BF16"]
    assert verdict.works and verdict.isa_cap == "AVX512_CORE_BF16"
    assert verdict.trapped == ["default: SIGILL"]
    assert verdict.speedup == 2.0 and verdict.bf16_fast and not verdict.cached
    env: dict[str, str] = {}
    assert apply(verdict, env) and env[ISA_ENV] == "AVX512_CORE_BF16"
    again = probe(tmp_path, code)  # warm: a file read, no child
    assert again.cached and again.isa_cap == "AVX512_CORE_BF16"
    assert runs(log) == ["default", "AVX512_CORE_BF16"]


def test_bf16_that_traps_under_every_cap_is_never_used(tmp_path, no_user_cap, monkeypatch):
    log = tmp_path / "runs.txt"
    verdict = probe(tmp_path, child("os.kill(os.getpid(), signal.SIGILL)", log))
    assert runs(log) == ["default", "AVX512_CORE_BF16", "AVX2"]
    assert not verdict.works and len(verdict.trapped) == 3
    monkeypatch.setattr(hwprobe, "_verdict", verdict)
    cpu = hardware.torch.device("cpu")
    assert hardware.resolve_precision("auto", cpu) == "no"
    with pytest.raises(StackWiseError, match="cannot run on this CPU"):
        hardware.resolve_precision("bf16", cpu)
    assert "fp32" in hardware.describe_precision("auto", cpu)


def test_a_cap_the_user_set_is_respected(tmp_path, monkeypatch):
    monkeypatch.setenv(ISA_ENV, "AVX2")
    log = tmp_path / "runs.txt"
    verdict = probe(tmp_path, child(TIMINGS, log))
    assert runs(log) == ["AVX2"] and verdict.user_cap and verdict.isa_cap == "AVX2"
    env = {ISA_ENV: "AVX2"}
    assert not apply(verdict, env) and env == {ISA_ENV: "AVX2"}
    # a trap under the user's own cap is reported, never overridden by a lower one
    trap_log = tmp_path / "trap.txt"
    monkeypatch.setenv(ISA_ENV, "AVX512_CORE_AMX")
    trapped = probe(tmp_path, child("os.kill(os.getpid(), signal.SIGILL)", trap_log))
    assert runs(trap_log) == ["AVX512_CORE_AMX"] and not trapped.works


def test_auto_picks_bf16_only_where_it_is_faster(monkeypatch):
    cpu = hardware.torch.device("cpu")
    slow = Verdict(works=True, fp32_ms=1.0, bf16_ms=10.0)  # emulated bf16, as on AVX2
    monkeypatch.setattr(hwprobe, "_verdict", slow)
    assert hardware.resolve_precision("auto", cpu) == "no"
    assert hardware.resolve_precision("bf16", cpu) == "bf16"  # asked for: allowed, just slow
    assert "0.10x the speed of fp32" in hardware.describe_precision("auto", cpu)
    monkeypatch.setattr(hwprobe, "_verdict", Verdict(works=True, fp32_ms=3.0, bf16_ms=1.0))
    assert hardware.resolve_precision("auto", cpu) == "bf16"
    assert hardware.describe_precision("auto", cpu).startswith("bf16 (auto: bf16 matmul 3.00x")


def test_a_corrupt_cache_is_probed_again(tmp_path, no_user_cap):
    log = tmp_path / "runs.txt"
    code = child(TIMINGS, log)
    probe(tmp_path, code)
    (cached,) = (tmp_path / "hwprobe").glob("*.json")
    cached.write_text("{not json")
    assert probe(tmp_path, code).works and runs(log) == ["default", "default"]


def test_concurrent_ranks_probe_once(tmp_path, no_user_cap):
    """Two processes start at once, as torchrun's ranks do: one probes, the other waits for
    its verdict instead of running a second child."""
    log = tmp_path / "runs.txt"
    code = child(f"import time; time.sleep(1.5)\n{TIMINGS}", log)
    script = (
        "import sys; from stackwise.hwprobe import probe; "
        f"v = probe({str(tmp_path)!r}, {code!r}); print(v.works, v.cached)"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = sorted(p.communicate(timeout=120)[0].split()[-1] for p in procs)
    assert runs(log) == ["default"]
    assert outs == ["False", "True"]  # one probed, the other read the cache


def test_the_real_probe_on_this_machine(tmp_path, no_user_cap):
    verdict = probe(tmp_path)
    assert verdict.works or verdict.trapped, verdict.error
    assert verdict.machine and verdict.probe_s > 0
    assert probe(tmp_path).cached
    print(verdict.summary(), os.cpu_count())


def test_stackwise_env_prints_what_a_bug_report_needs(capsys):
    import json

    import torch

    from stackwise.cli import main

    assert main(["env"]) == 0
    out = capsys.readouterr().out
    for needle in (
        f"torch:        {torch.__version__}",
        "transformers:",
        "peft:",
        "accelerate:",
        "bitsandbytes:",
        "datasets:",
        f"torch capability:       {torch.backends.cpu.get_cpu_capability()}",
        "bf16 probe:",
        "bitsandbytes CPU path:",
        "cuda:",
        f"torch intra-op:  {torch.get_num_threads()}",
        "mixed_precision auto:",
        "bf16 probe verdict:",
    ):
        assert needle in out, needle
    assert main(["env", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["precision"]["mixed_precision auto"].split()[0] in ("bf16", "fp32")
    assert info["versions"]["torch"] == torch.__version__


def test_the_probes_own_cap_is_never_taken_for_the_users(tmp_path, no_user_cap, monkeypatch):
    env: dict[str, str] = {}
    apply(Verdict(works=True, isa_cap="AVX512_CORE_BF16", trapped=["default: SIGILL"]), env)
    assert env[ISA_ENV] == "AVX512_CORE_BF16"
    assert hwprobe.user_isa_cap(env) is None  # children inherit both variables
    assert hwprobe.user_isa_cap({ISA_ENV: "AVX2"}) == "AVX2"
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    log = tmp_path / "runs.txt"
    verdict = probe(tmp_path, child(TIMINGS, log))
    assert not verdict.user_cap and runs(log) == ["default"]  # the default kernels are tried


def test_failures_are_cached_for_a_while_and_an_unwritable_cache_still_probes(
    tmp_path, no_user_cap, monkeypatch
):
    log = tmp_path / "runs.txt"
    failing = child("raise SystemExit(3)", log)
    first = probe(tmp_path, failing)
    assert not first.works and "exited 3" in (first.error or "")
    assert probe(tmp_path, failing).cached and runs(log) == ["default"]  # no child per import
    monkeypatch.setattr(hwprobe, "ERROR_TTL_S", 0.0)
    probe(tmp_path, failing)
    assert runs(log) == ["default", "default"]  # stale failure: probed again
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    ok_log = tmp_path / "ok.txt"
    assert probe(blocker, child(TIMINGS, ok_log)).works and runs(ok_log) == ["default"]


def timings_by_run(log: Path, rows: list[str]) -> str:
    """Child code whose n-th run prints rows[n] (the last row once they run out)."""
    return child(
        f"""
        rows = {rows!r}
        n = len(open({str(log)!r}).read().split())
        print(rows[min(n, len(rows)) - 1])
        """,
        log,
    )


def row(fp32: float, bf16: float, share: float, native: bool = True) -> str:
    import json

    return json.dumps({"fp32_ms": fp32, "bf16_ms": bf16, "native": native, "cpu_share": share})


def test_a_timing_taken_under_load_is_taken_again_and_the_best_times_kept(tmp_path, no_user_cap):
    """The AMX VM's story: a suite on both cores made bf16 look 0.86x; measured again once the
    probe's thread had the CPU, it is 3.4x. The verdict keeps each dtype's best time."""
    log = tmp_path / "runs.txt"
    code = timings_by_run(log, [row(3.5, 4.1, share=0.3), row(3.4, 1.0, share=0.99)])
    verdict = probe(tmp_path, code)
    assert runs(log) == ["default", "default"] and verdict.attempts == 2
    assert verdict.fp32_ms == 3.4 and verdict.bf16_ms == 1.0  # best of both runs each
    assert not verdict.loaded and verdict.bf16_fast


def test_a_marginal_ratio_is_measured_three_times_then_kept_as_this_cpus_own(tmp_path, no_user_cap):
    log = tmp_path / "runs.txt"
    verdict = probe(tmp_path, timings_by_run(log, [row(1.0, 1.0, share=1.0)]))
    assert len(runs(log)) == hwprobe.child.MAX_ATTEMPTS == verdict.attempts
    assert verdict.marginal and not verdict.bf16_fast  # 1.0x is not faster: fp32
    assert "this CPU's own ratio" in verdict.conditions()
    assert probe(tmp_path, timings_by_run(log, [row(1.0, 1.0, share=1.0)])).cached  # final


def test_a_loaded_or_marginal_cached_verdict_is_remeasured_once_the_machine_is_idle(
    tmp_path, no_user_cap, monkeypatch
):
    log = tmp_path / "runs.txt"
    code = timings_by_run(log, [row(3.0, 2.9, share=0.2)] * 3 + [row(3.0, 1.0, share=1.0)])
    first = probe(tmp_path, code)
    assert first.loaded and first.attempts == 3 and not first.bf16_fast
    assert "under load" in first.conditions()
    assert probe(tmp_path, code).cached  # within RECHECK_S: the cache is trusted
    monkeypatch.setattr(hwprobe, "RECHECK_S", 0.0)
    monkeypatch.setattr(hwprobe, "load_per_core", lambda: 2.0)  # still busy: not now
    assert probe(tmp_path, code).cached and len(runs(log)) == 3
    monkeypatch.setattr(hwprobe, "load_per_core", lambda: 0.1)  # idle: measure again
    again = probe(tmp_path, code)
    assert not again.cached and len(runs(log)) == 4 and again.bf16_fast


def test_every_verdict_expires_after_max_age(tmp_path, no_user_cap, monkeypatch):
    log = tmp_path / "runs.txt"
    code = child(TIMINGS, log)
    probe(tmp_path, code)
    assert probe(tmp_path, code).cached
    monkeypatch.setattr(hwprobe, "MAX_AGE_S", 0.0)
    assert not probe(tmp_path, code).cached and runs(log) == ["default", "default"]


def test_emulated_bf16_is_never_auto_even_when_it_times_fast(monkeypatch):
    """No oneDNN bf16 kernels: whatever one timing said, `auto` stays in fp32."""
    cpu = hardware.torch.device("cpu")
    monkeypatch.setattr(hwprobe, "_verdict", Verdict(True, fp32_ms=3.0, bf16_ms=1.0, native=False))
    assert hardware.resolve_precision("auto", cpu) == "no"
    assert "emulated" in hardware.describe_precision("auto", cpu)


BRANCHES = {  # forced verdict -> what auto trains in, and whether bf16 may be asked for
    "fast": ("bf16", True),
    "slow": ("no", True),
    "no-kernels": ("no", True),
    "trap": ("no", False),
}


@pytest.mark.parametrize("branch", list(BRANCHES))
def test_each_branch_of_auto_is_forced_on_every_machine(branch, monkeypatch):
    """bf16 only where it works, has kernels and is faster: each branch forced through the
    same variable CI and users can set, whatever this CPU's own verdict."""
    monkeypatch.setenv(FORCE_ENV, branch)
    monkeypatch.setattr(hwprobe, "_verdict", None)
    cpu = hardware.torch.device("cpu")
    auto, bf16_allowed = BRANCHES[branch]
    assert hardware.resolve_precision("auto", cpu) == auto
    assert f"{FORCE_ENV}={branch}" in hardware.describe_precision("auto", cpu) or branch == "trap"
    if bf16_allowed:
        assert hardware.resolve_precision("bf16", cpu) == "bf16"
    else:
        with pytest.raises(StackWiseError, match="cannot run on this CPU"):
            hardware.resolve_precision("bf16", cpu)
    if not hardware.torch.cuda.is_available():
        assert hardware.make_accelerator("auto").mixed_precision == auto


def test_an_unknown_forced_branch_is_refused_by_name(monkeypatch):
    monkeypatch.setenv(FORCE_ENV, "fastest")
    monkeypatch.setattr(hwprobe, "_verdict", None)
    with pytest.raises(StackWiseError, match=f"{FORCE_ENV}='fastest' is not one of fast"):
        hardware.resolve_precision("auto", hardware.torch.device("cpu"))


@pytest.mark.parametrize("branch", ["fast", "trap"])
def test_a_forced_branch_reaches_a_real_training_process(branch, tmp_path, corpus_file):
    """The variable is read by a fresh `stackwise train` process, as in CI: its header names
    the precision the branch gives."""
    env = {**os.environ, FORCE_ENV: branch, "STACKWISE_CACHE": str(tmp_path / "cache")}
    for inherited in (ISA_ENV, hwprobe.SET_BY_PROBE_ENV):  # the child probes for itself
        env.pop(inherited, None)
    cmd = [sys.executable, "-m", "stackwise", "train", "tiny-clm", "train.max_steps=2"]
    cmd += [f"data.files=[{corpus_file}]", "data.source=files", "data.tokenizer=char"]
    cmd += [f"train.output_dir={tmp_path / 'run'}", "train.eval_every=2", "sample.num_samples=0"]
    cmd += ["model.n_stacks=1", "model.d_model=32", "model.n_heads=2"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    expected = (
        "bf16 (auto: bf16 matmul 2.00x" if branch == "fast" else "fp32 (auto: bf16 matmuls fail"
    )
    assert expected in done.stdout + done.stderr


def test_forcing_a_branch_keeps_the_cap_a_crashing_cpu_needs(tmp_path, no_user_cap, monkeypatch):
    """Forced `fast` on a CPU whose default bf16 kernels trap: the speed is forced, the cap that
    keeps the process alive is not."""
    log = tmp_path / "runs.txt"
    code = traps_by_default(log)
    monkeypatch.setattr(hwprobe, "CHILD_CODE", code)
    monkeypatch.setenv(FORCE_ENV, "slow")
    verdict = probe(tmp_path, code)
    assert verdict.forced == "slow" and verdict.isa_cap == "AVX512_CORE_BF16"
    assert verdict.works and not verdict.bf16_fast and verdict.speedup == 0.8
    env: dict[str, str] = {}
    assert apply(verdict, env) and env[ISA_ENV] == "AVX512_CORE_BF16"


def test_no_load_average_is_no_crash(monkeypatch):
    from stackwise.hwprobe import verdict

    monkeypatch.delattr(verdict.os, "getloadavg")
    assert verdict.load_per_core() is None
