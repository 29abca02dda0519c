"""What each `stackwise` subcommand does; the parsers that lead here are in parsers.py."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from stackwise.cli.common import (
    DEFAULT_PRESET,
    PRESETS,
    load_args,
    printable,
    run_summary,
)
from stackwise.errors import StackWiseError


def cmd_train(ns: argparse.Namespace) -> int:
    """Train from CONFIG (a YAML/JSON file or a preset name; default DEFAULT_PRESET) with
    dotted overrides such as train.max_steps=100."""
    from stackwise.generate import sample_texts
    from stackwise.pipeline import train_from_config

    start = time.monotonic()
    config = load_args(ns.args)
    result = train_from_config(config)
    if not result.trainer.accelerator.is_main_process:  # under torchrun, rank 0 reports
        return 0
    n, hf = config.sample.num_samples, config.model.source == "hf"
    print(f"Saved the {'fine-tuned model' if hf else 'trained rack'} to {result.output_dir}")
    if config.data.mode == "instruction":
        from stackwise.cli.hf_commands import show_replies

        show_replies(result, n)
    elif n:
        for i, text in enumerate(
            sample_texts(result.config, result.rack.eval(), result.data.tokenizer, n=n)
        ):
            print(f"--- sample {i + 1} ---\n{printable(text.strip())}")
    print(run_summary(result, time.monotonic() - start))
    return 0


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
    from stackwise.generate import generate
    from stackwise.runs import config_of, load_trained

    overrides = {name: getattr(ns, name) for name in SAMPLE_OVERRIDES}
    if is_finetuned(ns.checkpoint):
        return generate_chat(ns, overrides)
    plan, rack, tok = load_trained(ns.checkpoint)
    config = config_of(plan)  # the run's validated config: the flags are checked against it
    if ns.chat is not None:
        from stackwise.cli.hf_commands import rack_chat

        return rack_chat(ns, config, rack, tok, overrides)
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
    from stackwise.runs import merge_checkpoint

    if is_finetuned(ns.checkpoint):
        return merge_finetuned(ns)
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


def cmd_lr_find(ns: argparse.Namespace) -> int:
    """Train briefly from CONFIG while the LR grows exponentially, print the LR where the loss
    falls fastest and save a plot. The model is restored afterwards; progressive configs are
    swept on the whole rack."""
    from datetime import datetime

    from stackwise.pipeline import trainer_of
    from stackwise.train.lr_find import lr_find

    if not (0 < ns.min_lr < ns.max_lr) or ns.steps < 2:
        raise StackWiseError(
            f"lr-find needs 0 < --min-lr < --max-lr and --steps >= 2 (got {ns.min_lr}, "
            f"{ns.max_lr}, {ns.steps})."
        )
    config = load_args(ns.args)
    if config.train.output_dir is None:
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        from stackwise.config import derive

        config = derive(config, {"train.output_dir": f"outputs/lr-find-{stamp}"}, "lr-find")
    plot_path = Path(ns.plot).expanduser() if ns.plot else None
    if plot_path is not None:  # before the sweep: a bad path must not waste it
        try:
            plot_path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise StackWiseError(
                f"Cannot create the folder of --plot '{plot_path}': {err.strerror or err}. "
                "Pick a writable path."
            ) from None
    trainer = trainer_of(config)
    result = lr_find(trainer, ns.min_lr, ns.max_lr, ns.steps)
    plot = result.plot(plot_path or trainer.output_dir / "lr_find.png")
    _drop_if_only_lock(trainer.output_dir)
    print(
        f"swept {len(result.lrs)} steps from {ns.min_lr:.1e} to {result.lrs[-1]:.1e}"
        + (" (stopped: the loss diverged)" if result.stopped_early else "")
    )
    print(f"plot: {plot}")
    print(f"suggested lr: {result.suggestion:.2e}")
    for warning in result.warnings():
        print(f"stackwise: warning: {warning}", file=sys.stderr)
    return 0


def _drop_if_only_lock(folder: Path) -> None:
    """lr-find claims an output folder like any run; one that got nothing else is removed."""
    from stackwise.io.lock import LOCK, release_run_folder

    release_run_folder(folder)
    if folder.is_dir() and [p.name for p in folder.iterdir()] == [LOCK]:
        (folder / LOCK).unlink()
        folder.rmdir()


def cmd_eval(ns: argparse.Namespace) -> int:
    """Score the run in --checkpoint on its validation split with fixed noise (the numbers of
    two runs are comparable), sample from it, and write eval.json there."""
    import json

    from stackwise.cli.hf_commands import is_finetuned, trained_on_chat
    from stackwise.evaluate import EvalSettings, render, run_eval

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
    settings = EvalSettings(ns.t_points, ns.mc_num, ns.samples, ns.max_blocks, ns.seed)
    sampling = {"sampler": ns.sampler, "remasking": ns.remasking, "steps": ns.steps}
    report = run_eval(ns.checkpoint, settings, ns.reference, **sampling)
    out = Path(ns.checkpoint).expanduser() / "eval.json"
    out.write_text(json.dumps(report, indent=1))
    print(render(report))
    print(f"wrote {out}")
    return 0


def cmd_env(ns: argparse.Namespace) -> int:
    import json

    from stackwise.envreport import collect, render

    info = collect(refresh_probe=ns.refresh_probe)
    print(json.dumps(info, indent=1) if ns.json else render(info))
    return 0


def cmd_config(ns: argparse.Namespace) -> int:
    if ns.action in ("list", "copy"):
        return _presets(ns.action, ns.args)
    if ns.aliases:
        from stackwise.config import alias_table

        if ns.action != "show" or ns.args:
            raise StackWiseError("--aliases goes with `stackwise config show` alone.")
        width = max(len(a) for a, _ in alias_table())
        print("the seeds' legacy names StackWise accepts, and what each means:")
        for alias, meaning in alias_table():
            print(f"  {alias:<{width}}  ->  {meaning}")
        return 0
    config = load_args(ns.args)
    if ns.action == "show":
        print(config.to_yaml(), end="")
    else:
        print("config is valid")
    return 0


def _presets(action: str, args: list[str]) -> int:
    """`config list`: the bundled presets; `config copy NAME FILE`: one of them, to edit."""
    names = sorted(p.stem for p in PRESETS.glob("*.yaml"))
    if action == "list":
        if args:
            raise StackWiseError("`stackwise config list` takes no arguments.")
        for name in names:
            print(f"{name:<36}{_first_sentence(PRESETS / f'{name}.yaml')}")
        print(f"(default: {DEFAULT_PRESET}; copy one with `stackwise config copy NAME FILE`)")
        return 0
    if len(args) != 2:
        raise StackWiseError("Use `stackwise config copy NAME FILE`, e.g. tiny-clm my.yaml.")
    name, target = args[0].removesuffix(".yaml"), Path(args[1]).expanduser()
    if target.is_dir():  # a folder: the preset keeps its file name there
        target = target / f"{name}.yaml"
    if name not in names:
        raise StackWiseError(f"No preset '{name}'. Presets: {', '.join(names)}.")
    if target.exists():
        raise StackWiseError(f"'{target}' exists already; nothing was written. Pick a new name.")
    try:
        target.write_text((PRESETS / f"{name}.yaml").read_text(encoding="utf-8"), "utf-8")
    except OSError as err:
        raise StackWiseError(f"Cannot write '{target}': {err.strerror or err}.") from None
    print(f"wrote {target}: edit it, then `stackwise train {shlex.quote(str(target))}`")
    return 0


def _first_sentence(path: Path) -> str:
    """The first sentence of a preset's leading comment."""
    lines = path.read_text(encoding="utf-8").splitlines()
    comment = " ".join(line.lstrip("# ").strip() for line in lines if line.startswith("#"))
    return comment.split(". ")[0].removesuffix(".")


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
        for name in ("steps", "sampler", "remasking", "block_length", "no_repeat_words"):
            shown[name] = f"n/a: this {what} is causal"
    else:
        shown["sampler"] = config.sample.resolved_sampler(config.objective.name)
    if config.model.source == "hf":
        shown["prompt"] = "none: a fine-tuned model takes --chat QUESTION"
    return shown
