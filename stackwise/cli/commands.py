"""The commands that use a trained run: `stackwise generate`, `eval`, `merge-lora` and
`export-hf` (with generate's help defaults read from the run). The parsers that lead here are in
parsers.py; train and lr-find are in train_commands.py, env and config in config_commands.py."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from stackwise.cli.common import printable
from stackwise.config.rules_cross import MASKED_SAMPLING, SAMPLER_OWN
from stackwise.errors import StackWiseError

# the generate flags that override one sample.* setting each (None: the run's own)
SAMPLE_OVERRIDES = (
    "max_new_tokens",
    "temperature",
    "top_k",
    "top_p",
    "steps",
    "sampler",
    "remasking",
    "block_length",
    "no_repeat_words",
    "confidence_threshold",
    "remask_budget",
)


def check_sampling(config: Any, overrides: dict[str, Any]) -> None:
    """The sampling flags given, checked against the run's config by every rule (a setting
    this rack would ignore, or a value out of range, is refused); `generate` takes them as
    checked."""
    from stackwise.config import derive

    changes = {f"sample.{k}": v for k, v in overrides.items() if v is not None}
    if changes:
        derive(config, changes, "the sampling settings")


def cmd_generate(ns: argparse.Namespace) -> int:
    from stackwise.cli.hf_commands import generate_chat, is_finetuned
    from stackwise.io.run_folder import run_paths

    overrides = {name: getattr(ns, name) for name in SAMPLE_OVERRIDES}
    if is_finetuned(ns.checkpoint):
        return generate_chat(ns, overrides)
    run_paths(ns.checkpoint)  # a wrong folder is refused before torch loads
    from stackwise.runs import config_of, load_trained

    plan, rack, tok = load_trained(ns.checkpoint)
    config = config_of(plan)  # the run's validated config: the flags are checked against it
    if ns.chat is not None:
        from stackwise.cli.hf_commands import rack_chat

        return rack_chat(ns, config, rack, tok, overrides)
    return print_samples(ns, plan, rack, tok, config, overrides)


def print_samples(
    ns: argparse.Namespace, plan: Any, rack: Any, tok: Any, config: Any, overrides: dict
) -> int:
    """`generate` on a rack run: its samples, one streamed as it is made, or several."""
    from stackwise.generate import generate

    stream = None
    if ns.num_samples == 1:  # one sample is shown as it is made

        def stream(piece: str) -> None:
            print(printable(piece), end="", flush=True)

    try:
        check_sampling(config, overrides)
        texts = generate(
            plan,
            rack,
            tok,
            prompt=ns.prompt,
            n=ns.num_samples,
            seed=ns.seed,
            stream=stream,
            **overrides,
        ).texts
    except StackWiseError as err:  # say it in the flags the user typed, not config keys
        message = str(err)
        for name in overrides:  # given or not: a hint may name a flag to add
            flag = "--" + name.replace("_", "-")
            # a preset's value is not the flag's case: the flag is simply left out
            preset = rf"([Rr])emove it, or set sample\.{name}=\S+ \(its default\) when "
            message = re.sub(preset + "overriding a preset", rf"\1emove {flag}", message)
            message = message.replace(f"sample.{name}", f"{flag} (sample.{name})")
        raise StackWiseError(message) from None
    if stream is not None:
        print()
        return 0
    for i, text in enumerate(texts):
        print(f"--- sample {i + 1} ---")
        print(printable(text))
    return 0


def cmd_merge_lora(ns: argparse.Namespace) -> int:
    """Merge every adapter of CHECKPOINT (an output dir of `stackwise train` or `finetune`)
    into its dequantized base and save full-precision safetensors to OUT, with the logit
    difference against the adapted model."""
    import warnings

    from stackwise.cli.hf_commands import is_finetuned, merge_finetuned
    from stackwise.quiet import quiet_deepspeed_without_gpu
    from stackwise.runs import merge_checkpoint

    if is_finetuned(ns.checkpoint):
        return merge_finetuned(ns)
    quiet_deepspeed_without_gpu()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = merge_checkpoint(ns.checkpoint, ns.out, requantize=ns.requantize)
    for w in caught:
        if "merged logits" in str(w.message):
            print(f"stackwise: warning: {w.message}", file=sys.stderr)
    kinds = ", ".join(sorted(set(report.storages)))
    print(
        f"Merged the adapters of {report.adapters} stack(s) (bases stored as {kinds}) into "
        f"{ns.out}{' (requantized)' if report.requantized else ''}.\n"
        f"Logits vs the adapted model: max |diff| {report.max_abs_error:.3g}, relative "
        f"{report.rel_error:.3g}."
    )
    return 0


def cmd_export_hf(ns: argparse.Namespace) -> int:
    """Write the rack of RUN (a run folder of `stackwise train`) to OUT as a Hugging Face Llama
    (Qwen2 with model.attention_bias) checkpoint with its tokenizer, loadable with
    AutoModelForCausalLM.from_pretrained(OUT).
    Quantized or LoRA racks are merged first (`stackwise merge-lora`); time-conditioned and
    depth-routed racks cannot be exported."""
    from stackwise.cli.hf_commands import is_finetuned
    from stackwise.runs import export_hf

    if is_finetuned(ns.run):
        raise StackWiseError(
            f"'{ns.run}' is a fine-tuned Hugging Face model: its folder already holds a PEFT "
            f"adapter in the Hugging Face format. `stackwise merge-lora {ns.run} OUT` writes "
            "base + adapter as one model (not for runs with memory layers, which no Hugging "
            "Face checkpoint holds: use the run folder itself)."
        )
    out = export_hf(ns.run, ns.out)
    config = json.loads((out / "config.json").read_text(encoding="utf-8"))
    note = config.get("stackwise_note")
    kind = {"qwen2": "Qwen2ForCausalLM"}.get(config.get("model_type"), "LlamaForCausalLM")
    print(f"wrote a {kind} checkpoint to {out}")
    if note:
        print(f"stackwise: note: the rack was {note}", file=sys.stderr)
    return 0


def cmd_eval(ns: argparse.Namespace) -> int:
    """Score the run in --checkpoint on its validation split with fixed noise (the numbers of
    two runs are comparable), sample from it, and write eval.json there."""

    from stackwise.cli.hf_commands import is_finetuned, trained_on_chat
    from stackwise.io.run_folder import run_paths

    if is_finetuned(ns.checkpoint) or trained_on_chat(ns.checkpoint):
        raise StackWiseError(
            f"'{ns.checkpoint}' was trained on instruction rows; `eval` scores racks on "
            "pretraining text. Its eval loss per target token is in history.json; to score "
            "other rows, fine-tune with data.eval_files and train.eval_every."
        )
    if ns.reference is not None and is_finetuned(ns.reference):
        raise StackWiseError(
            f"--reference '{ns.reference}' is a fine-tuned Hugging Face model, but a reference "
            "must be a StackWise rack run (trained with `stackwise train`, objective clm) that "
            "reads the samples with its own tokenizer; a fine-tune run cannot serve. Pass a "
            "causal rack run, or leave out --reference."
        )
    for name in ("t_points", "mc_num", "samples", "max_blocks"):
        if getattr(ns, name) < 1:
            raise StackWiseError(f"--{name.replace('_', '-')} must be at least 1.")
    run_paths(ns.checkpoint)  # a wrong folder is refused before torch loads
    if ns.reference is not None:
        try:
            run_paths(ns.reference)
        except StackWiseError as err:
            raise StackWiseError(f"--reference: {err}") from None
    from stackwise.evaluate import EvalSettings, render, run_eval

    settings = EvalSettings(ns.t_points, ns.mc_num, ns.samples, ns.max_blocks, ns.seed)
    names = ("sampler", "remasking", "steps", "confidence_threshold", "remask_budget")
    sampling = {name: getattr(ns, name) for name in names}
    report = run_eval(ns.checkpoint, settings, ns.reference, **sampling)
    out = Path(ns.checkpoint).expanduser() / "eval.json"
    out.write_text(json.dumps(report, indent=1))
    keep_sampler_row(out.parent, report)
    print(render(report))
    print(f"wrote {out}")
    return 0


def keep_sampler_row(folder: Path, report: dict[str, Any]) -> None:
    """eval_samplers.json: one row per sampler setting evaluated on this run (a later eval of
    the same setting replaces its row), the report's samplers table."""
    from stackwise.io.files import read_json, write_atomic

    path = folder / "eval_samplers.json"
    rows = (
        read_json(path, "Delete it; the next `stackwise eval` starts it again.")
        if path.is_file()
        else []
    )
    rows = [r for r in rows if r.get("sampling") != report["sampling"]]
    rows.append({"sampling": report["sampling"], "samples": report["samples"]})
    write_atomic(path, json.dumps(rows, indent=1))


def generate_help_defaults(argv: list[str]) -> dict[str, Any] | None:
    """For `generate --checkpoint DIR --help`: the sample settings DIR's config gives each flag
    (None when there is no such help request or the folder holds no readable config)."""
    if "generate" not in argv or not {"-h", "--help"} & set(argv):
        return None
    folder = None
    for i, arg in enumerate(argv):
        if arg == "--checkpoint" and i + 1 < len(argv):
            folder = argv[i + 1]
        elif arg.startswith("--checkpoint="):
            folder = arg.split("=", 1)[1]
    path = Path(folder).expanduser() / "config.yaml" if folder else None
    if path is None or not path.is_file():
        return None
    from stackwise.runs import read_config

    try:
        config = read_config(path.parent)
    except StackWiseError:
        return None
    shown: dict[str, Any] = config.sample.model_dump()
    what = "model" if config.model.source == "hf" else "rack"
    if config.objective.causal:
        for name in (*MASKED_SAMPLING, *SAMPLER_OWN):
            shown[name] = f"n/a: this {what} is causal"
    else:
        shown["sampler"] = config.sample.resolved_sampler(config.objective.name)
    if config.model.source == "hf":
        shown["prompt"] = "none: a fine-tuned model takes --chat QUESTION"
    return shown
