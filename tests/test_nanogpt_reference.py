"""benchmarks/nanogpt_reference.py's measurement of nanoGPT's own train.py: its launcher reports
page faults per iteration, the figures come from the timed iterations only, and the `kept`
allocator setting reaches the child (a step that maps and unmaps a large buffer faults with
glibc's defaults, and reuses the heap with the thresholds fixed). A stand-in train.py prints
nanoGPT's iteration lines; no nanoGPT checkout is needed."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.append(str(BENCHMARKS))

import nanogpt_reference as ref  # noqa: E402
import throughput as tp  # noqa: E402

PLAN = tp.Plan(reps=1, warmup=2, steps=4)
SHAPE = tp.Shape("vocab 65", 65)

# iteration i takes (i + 1) * 10 ms; each writes a 16 MB bytes object and a bytearray copy of
# it (32 MB at once), then drops both
STAND_IN = textwrap.dedent(
    """
    import sys
    for i in range(int(sys.argv[sys.argv.index("--steps") + 1])):
        buffer = bytearray(b"x" * (16 << 20))
        del buffer
        print(f"iter {i}: loss 1.0000, time {(i + 1) * 10:.2f}ms, mfu -100.00%")
    """
)


@pytest.fixture
def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A nanoGPT folder whose train.py is the stand-in; it is told the step count."""
    folder = tmp_path / "nanogpt"
    folder.mkdir()
    (folder / "train.py").write_text(STAND_IN, encoding="utf-8")
    monkeypatch.setattr(
        ref, "nanogpt_args", lambda shape, plan, *a, **k: ["--steps", str(plan.total_steps)]
    )
    return folder


def test_figures_come_from_the_timed_iterations(stand_in: Path, tmp_path: Path) -> None:
    tokens_per_s, faults, peak = ref.run_nanogpt(stand_in, tmp_path, SHAPE, PLAN, "fp32", 1)
    timed_ms = sum((i + 1) * 10 for i in range(PLAN.warmup, PLAN.total_steps))  # 30+...+60
    assert tokens_per_s == pytest.approx(PLAN.steps * SHAPE.tokens_per_step / (timed_ms / 1000))
    assert faults > 0 and peak > 16


def test_fixed_thresholds_stop_the_faults_of_a_step(stand_in: Path, tmp_path: Path) -> None:
    """With glibc's defaults each iteration's 32 MB is handed back and faulted in again (about
    8,000 pages a step here); with the thresholds fixed it stays in the heap and is reused."""
    _, as_it_comes, _ = ref.run_nanogpt(stand_in, tmp_path, SHAPE, PLAN, "fp32", 1, "default")
    _, kept, _ = ref.run_nanogpt(stand_in, tmp_path, SHAPE, PLAN, "fp32", 1, "kept")
    assert as_it_comes > 3000 and kept < 300, (as_it_comes, kept)


def test_missing_iterations_are_refused() -> None:
    lines = "".join(f"iter {i}: loss 1.0, time 5.00ms, mfu 1%\n" for i in range(5))
    faults = "".join(f"faults {i} {100 * i}\n" for i in range(5))
    with pytest.raises(RuntimeError, match=r"expected 0\.\.5 in both"):
        ref.iteration_figures(lines, faults, PLAN, SHAPE.tokens_per_step)
    full = lines + "iter 5: loss 1.0, time 5.00ms, mfu 1%\n"
    tokens_per_s, per_step = ref.iteration_figures(
        full, faults + "faults 5 500\n", PLAN, SHAPE.tokens_per_step
    )
    assert per_step == 100 and tokens_per_s == pytest.approx(SHAPE.tokens_per_step / 0.005)


def test_inherited_malloc_settings_do_not_leak_into_default() -> None:
    env = {"PATH": "/bin", "MALLOC_ARENA_MAX": "1", "GLIBC_TUNABLES": "glibc.malloc.x=1"}
    assert ref.allocator_env(env, "default") == {"PATH": "/bin"}
    kept = ref.allocator_env(env, "kept")
    assert kept["MALLOC_MMAP_THRESHOLD_"] == str(32 * 2**20) and "MALLOC_ARENA_MAX" not in kept


def test_turns_rotate_from_rep_to_rep() -> None:
    sides = ["nanoGPT", "rebuilt", "ours"]
    assert [ref.rotated(sides, rep)[0] for rep in range(4)] == [*sides, "nanoGPT"]


def test_tables_share_their_setting_columns(capsys: pytest.CaptureFixture[str]) -> None:
    row = ref.Row("vocab 65", "fp32", 1, "kept", real=[100.0, 200.0], clone=[110.0, 200.0])
    row.real_faults, row.clone_faults, row.rss = [5.0, 7.0], [1.0, 3.0], [360.0, 362.0]
    row.ours, row.ours_faults = [90.0, 300.0], [2.0, 2.0]
    ref.print_table([row])
    out = capsys.readouterr().out.splitlines()
    first, second = out[2], out[6]  # the data line of each table
    assert first.split()[:5] == second.split()[:5] == ["vocab", "65", "fp32", "1", "kept"]
    assert first.split()[-2:] == ["1.050", "361"]  # rebuilt/nanoGPT per rep 1.1 and 1.0
    assert second.split()[-2:] == ["1.200", "0.90..1.50"]  # ours/nanoGPT per rep 0.9, 1.5
