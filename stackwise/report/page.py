"""The report page: one HTML file with its CSS and figures inline, so it opens offline and can be
sent as one attachment. Every figure and table has a stable id (what the browser test checks)."""

from __future__ import annotations

import html
from collections.abc import Sequence

import yaml
from matplotlib.figure import Figure

from stackwise.report import plots
from stackwise.report.runs import Run
from stackwise.report.tables import (
    Table,
    config_differences,
    env_table,
    eval_table,
    final_metrics,
    flatten,
    samplers_table,
    stage_table,
)

CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1400px;color:#222;padding:0 1em}
h1{font-size:1.5em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:1.6em}
h3{font-size:1.05em;margin-top:1.2em}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0}
td,th{border:1px solid #ddd;padding:.2em .5em;text-align:right}
td:first-child,th:first-child{text-align:left}th{background:#f4f4f4}
figure{margin:.6em 0;overflow-x:auto}figure svg{max-width:100%;height:auto}
pre{background:#f7f7f7;padding:.6em;font-size:.8em;overflow-x:auto;white-space:pre-wrap}
.note{color:#666;font-size:.85em}
"""
ROUTING = ("router_entropy", "_load_cv", "memory_gate", "dropped_fraction")


def _e(text: object) -> str:
    return html.escape(str(text))


def table(element_id: str, content: Table) -> str:
    header, rows = content
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table id="{element_id}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def figure(element_id: str, title: str, fig: Figure, note: str = "") -> str:
    caption = f'<figcaption class="note">{_e(note)}</figcaption>' if note else ""
    svg = plots.to_svg(fig, element_id)
    return f'<h3>{_e(title)}</h3><figure id="{element_id}">{svg}{caption}</figure>'


def _has(runs: Sequence[Run], key: str) -> bool:
    return any(run.rows(key) for run in runs)


def _routing_keys(runs: Sequence[Run]) -> list[str]:
    keys = {k for run in runs for s in run.stages for r in s.rows for k in r}
    return sorted(k for k in keys if any(p in k for p in ROUTING) and "/layer" not in k)


# the step-axis figures: (element id, title, logged keys, y label, note); each is drawn when
# some run logged one of its keys
STEP_FIGURES = (
    ("plot-lr", "Learning rate", ("train/lr",), "LR", ""),
    ("plot-throughput", "Training throughput", ("train/tokens_per_s",), "tokens/s", ""),
    (
        "plot-memory",
        "Peak memory",
        ("train/peak_gpu_mb", "train/peak_rss_mb"),
        "MB",
        "peak GPU memory allocated by torch, or the process's peak RSS",
    ),
    (
        "plot-supervised",
        "Supervised tokens per step",
        ("train/supervised_tokens", "train/reply_tokens"),
        "tokens",
        "the target (reply) tokens the step's loss was taken over",
    ),
)


def loss_curves(runs: Sequence[Run]) -> list[str]:
    """Loss and validation bits per character against steps, tokens and FLOPs."""
    grown = any(r.progressive for r in runs)
    note = "against the run's step, the tokens it had seen and the FLOPs it had spent"
    note += "; dotted lines mark where a new stack began" if grown else ""
    loss = plots.loss_figure(runs, "val/loss", "train/loss", "loss (nats/token)")
    parts = [figure("plot-loss", "Loss (train solid, validation dashed)", loss, note)]
    if _has(runs, "val/bpc"):
        bpc = plots.loss_figure(runs, "val/bpc", None, "bits per character")
        parts.append(figure("plot-bpc", "Validation bits per character", bpc))
    return parts


def curves(runs: Sequence[Run]) -> list[str]:
    """Every figure the runs' logs can fill, in the order a reader asks for them."""
    parts = loss_curves(runs)
    for element, title, keys, ylabel, note in STEP_FIGURES:
        logged = [k for k in keys if _has(runs, k)]
        if logged:
            parts.append(figure(element, title, plots.metric_figure(runs, logged, ylabel), note))
    routing = _routing_keys(runs)
    if routing:
        svg = plots.metric_figure(runs, routing, "value")
        parts.append(figure("plot-routing", "Routing (experts / memory chapters)", svg))
    if any((r.eval or {}).get("likelihood", {}).get("by_noise") for r in runs):
        note = "each point is one t of the eval's grid; the right panel's terms add up to the NELBO"
        svg = plots.noise_figure(runs)
        parts.append(figure("plot-noise", "Eval by noise level (stackwise eval)", svg, note))
    return parts


def run_section(index: int, run: Run) -> str:
    """One run's facts: where it is, its stages, eval, samples, adapter, machine and config."""
    rid = f"run-{index}"
    stopped = "" if run.complete else " &middot; not finished (stopped, or still running)"
    out = [
        f'<h2 id="{rid}">{_e(run.name)}</h2>',
        f'<p class="note">{_e(run.path)} &middot; objective {_e(run.objective)}{stopped}</p>',
    ]
    if run.progressive:
        out += ["<h3>Stages</h3>", table(f"{rid}-stages", stage_table(run))]
    if run.eval:
        out += ["<h3>stackwise eval</h3>", table(f"{rid}-eval", eval_table(run))]
    if run.samplers:
        out += [
            "<h3>Samplers (one row per setting `stackwise eval` scored)</h3>",
            table(f"{rid}-samplers", samplers_table(run)),
        ]
    if run.samples:
        texts = "".join(f"<pre>{_e(t.strip())}</pre>" for t in run.samples)
        out += [f'<h3>Samples at the end of training</h3><div id="{rid}-samples">{texts}</div>']
    if run.adapter:
        out += [
            "<h3>Adapter</h3>",
            f'<pre id="{rid}-adapter">{_e(yaml.safe_dump(run.adapter, sort_keys=True))}</pre>',
        ]
    if run.env:
        out += ["<h3>Machine and versions</h3>", table(f"{rid}-env", env_table(run.env))]
    else:
        out.append(
            '<p class="note">Machine and versions: not recorded (a run from before '
            "StackWise wrote env.json, or with logging.jsonl off).</p>"
        )
    lines = "\n".join(f"{k}: {v!r}" for k, v in sorted(flatten(run.config).items()))
    out += [f'<p class="note">{_e(note)}</p>' for note in run.notes]
    if run.config_from != "config.yaml":
        out.append(
            f'<p class="note">Config read from {_e(run.config_from)}: the run has no '
            "final save yet.</p>"
        )
    out += [
        "<details><summary>Config (flattened: one key per line, for diffing)</summary>",
        f'<pre id="{rid}-config">{_e(lines)}</pre></details>',
    ]
    return "\n".join(out)


def render(runs: Sequence[Run]) -> str:
    names = ", ".join(r.name for r in runs)
    parts = [
        f"<h1>StackWise report: {_e(names)}</h1>",
        "<h2>Final metrics</h2>",
        table("table-final", final_metrics(runs)),
    ]
    if len(runs) > 1:
        parts += [
            "<h2>Config differences</h2>",
            table("table-config-diff", config_differences(runs)),
        ]
    parts += ["<h2>Curves</h2>", *curves(runs)]
    parts += [run_section(i, run) for i, run in enumerate(runs)]
    body = "\n".join(parts)
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>StackWise report: {_e(names)}</title><style>{CSS}</style></head>"
        f"<body>\n{body}\n</body></html>\n"
    )
