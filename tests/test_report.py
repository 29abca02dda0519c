"""`stackwise report`: the page of a tiny real run (grown stack by stack, diffusion, evaluated)
and of two runs compared, checked as data and, where Chromium is installed, in a real browser."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import make_corpus, tiny_dict

from stackwise.cli import main
from stackwise.report import load_run, write_report
from stackwise.report.runs import unique_names
from stackwise.report.tables import config_differences, final_metrics, flatten

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
PLOTS = ("plot-loss", "plot-bpc", "plot-lr", "plot-throughput", "plot-memory", "plot-noise")
TABLES = (
    "table-final",
    "run-0-stages",
    "run-0-eval",
    "run-0-samplers",
    "run-0-env",
    "run-0-samples",
)


@pytest.fixture(scope="module")
def grown(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-stack diffusion run trained and evaluated through the CLI, its report written."""
    root = tmp_path_factory.mktemp("report")
    corpus = root / "corpus.txt"
    corpus.write_text(make_corpus(400), encoding="utf-8")
    cfg = tiny_dict(
        corpus,
        root / "cache",
        root / "grown",
        model={"n_stacks": 2, "blocks_per_stack": 1},
        data={"tokenizer": "char"},
        objective={"name": "diffusion"},
        progressive={"strategy": "progressive"},
        train={"max_steps": 8, "eval_every": 2, "save_steps": 4},
        sample={"num_samples": 2, "max_new_tokens": 8},
    )
    path = root / "grown.yaml"
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    assert main(["train", str(path), "--report"]) == 0
    out = root / "grown"
    flags = ["--samples", "2", "--t-points", "4", "--mc-num", "2", "--max-blocks", "4"]
    assert main(["eval", "--checkpoint", str(out), *flags]) == 0
    assert main(["eval", "--checkpoint", str(out), *flags, "--sampler", "confidence"]) == 0
    assert main(["report", str(out)]) == 0  # again, now with eval.json
    return out


def test_the_report_command_reads_a_run_without_loading_torch(grown: Path, tmp_path: Path) -> None:
    """A report is the run's logs drawn: the `stackwise report` process loads neither torch nor
    transformers (seconds, and 302 against 87 MiB in benchmarks/RESULTS.md)."""
    import subprocess
    import sys

    page = tmp_path / "page.html"
    code = (
        "import atexit, sys; from stackwise.cli import run; "
        "atexit.register(lambda: print('loaded:', 'torch' in sys.modules, "
        "'transformers' in sys.modules)); "
        f"sys.argv = ['stackwise', 'report', {str(grown)!r}, '--out', {str(page)!r}]; run()"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "loaded: False False", out.stdout + out.stderr
    assert "plot-loss" in page.read_text(encoding="utf-8")


def test_run_is_read_back_stage_by_stage(grown: Path) -> None:
    run = load_run(grown)
    assert [s.name for s in run.stages] == ["stack 0", "stack 1"]
    assert run.stages[1].step_offset == run.stages[0].record["steps"] > 0
    assert all(any("train/loss" in r for r in s.rows) for s in run.stages)
    assert run.env is not None and run.env["versions"]["torch"]
    assert len(run.samples) == 2
    by_noise = run.eval["likelihood"]["by_noise"]
    assert len(by_noise) == 4  # one row per t point
    total = sum(p["nelbo_share"] for p in by_noise)
    assert total == pytest.approx(run.eval["likelihood"]["nelbo_per_token"], rel=1e-9)
    rates = [p["mask_rate"] for p in by_noise]
    assert rates == sorted(rates) and 0 < rates[0] < rates[-1] <= 1
    # two evals with two samplers: one row each; the last eval.json is the confidence one
    assert [r["sampling"]["sampler"] for r in run.samplers] == ["ancestral", "confidence"]
    assert run.eval["sampling"]["sampler"] == "confidence"


def test_train_writes_the_report_and_names_the_command(grown: Path) -> None:
    page = (grown / "report.html").read_text(encoding="utf-8")
    for element in (*PLOTS, *TABLES):
        assert f'id="{element}"' in page, element
    for fetched in ("src=", "<link", "<script", "@import"):  # nothing to fetch to view it
        assert fetched not in page, fetched
    assert re.findall(r"url\((?!#)", page) == []  # only the SVGs' own clip paths


def test_two_runs_overlay_and_diff(grown: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    shutil.copytree(grown, other)
    config = yaml.safe_load((other / "config.yaml").read_text())
    config["train"]["lr"] = 0.5
    (other / "config.yaml").write_text(yaml.safe_dump(config))
    page = write_report([grown, other], tmp_path / "both.html")
    text = page.read_text(encoding="utf-8")
    assert 'id="table-config-diff"' in text and "train.lr" in text
    runs = [load_run(grown), load_run(other)]
    unique_names(runs)
    diff = config_differences(runs)[1]
    assert [row[0] for row in diff] == ["train.lr"]  # the copy kept the output_dir it logged
    assert [row[0] for row in final_metrics(runs)[1]] == ["grown", "other"]


def test_same_folder_names_are_told_apart(grown: Path, tmp_path: Path) -> None:
    shutil.copytree(grown, tmp_path / "a" / "grown")
    runs = [load_run(grown), load_run(tmp_path / "a" / "grown")]
    unique_names(runs)
    assert runs[0].name != runs[1].name


def test_flatten_lines_up_nested_keys() -> None:
    assert flatten({"a": {"b": 1, "c": {"d": [2]}}, "e": {}}) == {"a.b": 1, "a.c.d": [2], "e": {}}


@pytest.mark.parametrize("case", ["no config", "no metrics", "not html"])
def test_bad_input_is_one_clear_error(grown: Path, tmp_path: Path, case: str, capsys) -> None:
    folder = tmp_path / "run"
    args = [str(folder)]
    if case == "no config":
        folder.mkdir()
    elif case == "no metrics":
        shutil.copytree(grown, folder)
        for rows in [*folder.rglob("metrics.jsonl"), folder / "progressive_history.json"]:
            rows.unlink()
    else:
        shutil.copytree(grown, folder)
        args += ["--out", str(tmp_path / "page.txt")]
    assert main(["report", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("stackwise: error:") and "Traceback" not in err
    assert {"no config": "config.yaml", "no metrics": "logging.jsonl", "not html": ".html"}[
        case
    ] in err
    assert not (tmp_path / "page.txt").exists()


def test_stage_folders_removed_leave_one_point_per_stack(grown: Path, tmp_path: Path) -> None:
    folder = tmp_path / "trimmed"
    shutil.copytree(grown, folder)
    for stage in ("stack_0", "stack_1"):
        shutil.rmtree(folder / stage)
    run = load_run(folder)
    assert [len(s.rows) for s in run.stages] == [1, 1]
    history = json.loads((grown / "progressive_history.json").read_text())
    assert run.stages[1].rows[0]["val/loss"] == history["stacks"][1]["eval"]["loss"]
    assert 'id="plot-loss"' in write_report([folder]).read_text()


def test_a_run_stopped_before_its_final_save_is_reported(grown: Path, tmp_path: Path) -> None:
    folder = tmp_path / "stopped"
    shutil.copytree(grown, folder)
    for name in ("config.yaml", "run_complete.json", "progressive_history.json"):
        (folder / name).unlink()
    run = load_run(folder)
    assert run.config_from.startswith("stack_1/checkpoint-") and not run.complete
    assert [s.name for s in run.stages] == ["stack 0", "stack 1"]
    assert run.stages[1].step_offset == run.stages[0].rows[-1]["step"]
    page = write_report([folder]).read_text(encoding="utf-8")
    assert "not finished" in page and "no (stopped or running)" in page


def test_a_stack_stopped_midway_is_drawn_and_its_last_eval_shown(grown: Path, tmp_path: Path):
    folder = tmp_path / "midway"
    shutil.copytree(grown, folder)
    history = json.loads((folder / "progressive_history.json").read_text())
    history["stacks"], history["final_eval"] = history["stacks"][:1], None
    (folder / "progressive_history.json").write_text(json.dumps(history))
    (folder / "run_complete.json").unlink()
    rows = (folder / "stack_1" / "metrics.jsonl").read_bytes()
    (folder / "stack_1" / "metrics.jsonl").write_bytes(rows + b"\xff\xfe not text\n")
    run = load_run(folder)
    assert [s.name for s in run.stages] == ["stack 0", "stack 1"]
    last = [r for r in run.stages[1].rows if "val/loss" in r][-1]
    assert run.final_eval()["loss"] == last["val/loss"]


def test_a_damaged_optional_file_leaves_its_section_out(grown: Path, tmp_path: Path, capsys):
    folder = tmp_path / "damaged"
    shutil.copytree(grown, folder)
    (folder / "eval.json").write_text("{not json")
    page = write_report([folder, folder / ".." / "damaged"]).read_text(encoding="utf-8")
    assert 'id="run-0-eval"' not in page and "eval.json left out" in page
    assert 'id="run-1-samples"' not in page  # the same folder twice is one run
    assert "eval.json left out" in capsys.readouterr().err


def test_text_from_the_run_is_escaped(grown: Path, tmp_path: Path) -> None:
    folder = tmp_path / "<b>run"
    shutil.copytree(grown, folder)
    (folder / "samples.json").write_text(json.dumps({"samples": ["</pre><script>x()</script>"]}))
    config = yaml.safe_load((folder / "config.yaml").read_text())
    config["logging"]["run_name"] = "<img src=x onerror=x()>"
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    page = write_report([folder, grown], tmp_path / "page.html").read_text(encoding="utf-8")
    assert "<script" not in page and "<img" not in page and "<b>" not in page
    assert "&lt;/pre&gt;&lt;script&gt;" in page and "&lt;b&gt;run" in page


def test_legend_names_are_shown_as_written() -> None:
    from stackwise.report.plots import legend_text

    assert legend_text("cost $5") == r"cost \$5"
    assert legend_text("_baseline").endswith("_baseline") and not legend_text("_b").startswith("_")


def test_report_flag_takes_no_file_and_leaves_config_alone(capsys) -> None:
    from stackwise.cli import _parse_command

    ns = _parse_command(["train", "--report", "tiny-clm", "train.max_steps=9"])
    assert ns.report is True and ns.args == ["tiny-clm", "train.max_steps=9"]


def test_a_run_written_over_keeps_nothing_of_the_old_one(grown: Path, tmp_path: Path) -> None:
    """overwrite_output_dir: the old run's eval, samples and report go; the new run (end to end
    over a progressive one) is reported as what it is."""
    folder = tmp_path / "over"
    shutil.copytree(grown, folder)
    root = grown.parent
    cfg = tiny_dict(
        root / "corpus.txt",
        root / "cache",
        folder,
        data={"tokenizer": "char"},
        sample={"num_samples": 0},
    )
    cfg["train"] |= {"overwrite_output_dir": True, "max_steps": 2}
    (tmp_path / "over.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["train", str(tmp_path / "over.yaml")]) == 0
    for stale in ("eval.json", "samples.json", "report.html"):
        assert not (folder / stale).exists(), stale
    run = load_run(folder)
    assert [s.name for s in run.stages] == ["run"] and run.eval is None and run.samples == []


def test_torn_metrics_line_is_skipped(grown: Path, tmp_path: Path) -> None:
    folder = tmp_path / "torn"
    shutil.copytree(grown, folder)
    rows = folder / "stack_0" / "metrics.jsonl"
    before = len(rows.read_text().splitlines())
    rows.write_text(rows.read_text() + '{"step": 9, "train/lo')
    assert len(load_run(folder).stages[0].rows) == before


FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def short_temp_dir() -> Path:
    """Chromium puts its singleton socket under TMPDIR, and an AF_UNIX path has ~107 bytes: under
    a long TMPDIR (the CI forces one) it cannot start. /tmp where there is one."""
    base = "/tmp" if os.path.isdir("/tmp") else tempfile.gettempdir()
    return Path(tempfile.mkdtemp(prefix="sw-chromium-", dir=base))


def launch(pw: Any, profile: Path) -> Any:
    """Chromium, headless, on a profile of its own; a browser that cannot start here skips
    the test with the reason, unless STACKWISE_REQUIRE_BROWSER is set (CI sets it)."""
    try:
        return pw.chromium.launch_persistent_context(
            str(profile / "profile"),
            executable_path=CHROMIUM,
            args=FLAGS,
            env={**os.environ, "TMPDIR": str(profile)},
            viewport={"width": 1400, "height": 900},
        )
    except Exception as err:  # playwright's launch errors share no narrower base class
        if os.environ.get("STACKWISE_REQUIRE_BROWSER"):
            raise
        pytest.skip(f"Chromium ({CHROMIUM}) did not start here: {str(err)[:300]}")


def browser_page(page_file: Path, shot: Path) -> dict:
    """Open the page in headless Chromium: console errors, and each element's size and drawing."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    profile = short_temp_dir()
    try:
        with sync_api.sync_playwright() as pw:
            browser = launch(pw, profile)
            page = browser.new_page()
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            fetched = errors.append  # a page that fetches anything is not self-contained
            page.on("request", lambda r: None if r.url.startswith("file:") else fetched(r.url))
            page.goto(page_file.as_uri())
            found = {element: drawn(page, element) for element in (*PLOTS, *TABLES)}
            page.screenshot(path=str(shot), full_page=True)
            browser.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    return {"errors": errors, "found": found}


def drawn(page: Any, element: str) -> tuple[float, int]:
    """(the element's area on the page, how many drawn marks or rows it holds)."""
    handle = page.query_selector(f"#{element}")
    if handle is None:
        return 0.0, 0
    box = handle.bounding_box()
    marks = handle.eval_on_selector_all("svg path, svg use, tr, pre", "e => e.length")
    return (box["width"] * box["height"] if box else 0.0), marks


@pytest.mark.skipif(
    CHROMIUM is None,
    reason="Chromium is not installed (Debian: apt-get install "
    "chromium); `make test` installs it where it runs as root",
)
def test_report_renders_in_headless_chromium(grown: Path, tmp_path: Path) -> None:
    shot = Path(os.environ.get("STACKWISE_REPORT_SHOT", tmp_path / "report.png"))
    seen = browser_page(grown / "report.html", shot)
    assert seen["errors"] == []
    for element, (area, marks) in seen["found"].items():
        assert area > 1000, f"{element} is missing or empty on the page"
        assert marks > (10 if element.startswith("plot") else 0), f"{element} draws nothing"
    assert shot.stat().st_size > 0
    assert json.loads((grown / "run_complete.json").read_text())
