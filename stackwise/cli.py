"""`stackwise train | generate | eval | merge-lora | lr-find | env | config`.

User mistakes (StackWiseError) print one paragraph and exit 2; there is no traceback for them.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

from stackwise.errors import StackWiseError

PRESETS = Path(__file__).parent / "presets"
DEFAULT_PRESET = "tiny-diffusion-progressive"


def resolve_config_path(name: str | None) -> Path:
    """A file path, or the name of a bundled preset (`tiny-clm`)."""
    if name is None:
        name = DEFAULT_PRESET
    path = Path(name)
    if path.is_file():
        return path
    preset = PRESETS / (name if name.endswith(".yaml") else f"{name}.yaml")
    if preset.is_file():
        return preset
    known = ", ".join(sorted(p.stem for p in PRESETS.glob("*.yaml")))
    raise StackWiseError(f"Config '{name}' is neither a file nor a preset. Presets: {known}.")


def _split(args: list[str]) -> tuple[str | None, list[str]]:
    if args and "=" not in args[0]:
        return args[0], args[1:]
    return None, args


def _load(args: list[str]):
    from stackwise.config import load_config

    name, overrides = _split(args)
    return load_config(resolve_config_path(name), overrides)


def cmd_train(ns: argparse.Namespace) -> int:
    from stackwise.generate import sample_texts
    from stackwise.pipeline import train_from_config

    config = _load(ns.args)
    result = train_from_config(config)
    if not result.trainer.accelerator.is_main_process:  # under torchrun, rank 0 reports
        return 0
    print(f"Saved the trained rack to {result.output_dir}")
    n = config.sample.num_samples
    if n:
        for i, text in enumerate(
            sample_texts(result.config, result.rack.eval(), result.data.tokenizer, n=n)
        ):
            print(f"--- sample {i + 1} ---\n{text.strip()}")
    return 0


def cmd_generate(ns: argparse.Namespace) -> int:
    from stackwise.generate import sample_texts
    from stackwise.io.trained import load_trained

    config, rack, tok = load_trained(ns.checkpoint)
    texts = sample_texts(
        config,
        rack,
        tok,
        prompt=ns.prompt,
        n=ns.num_samples,
        seed=ns.seed,
        max_new_tokens=ns.max_new_tokens,
        temperature=ns.temperature,
        top_k=ns.top_k,
        top_p=ns.top_p,
        steps=ns.steps,
        sampler=ns.sampler,
        remasking=ns.remasking,
        block_length=ns.block_length,
        no_repeat_words=ns.no_repeat_words,
    )
    for i, text in enumerate(texts):
        if len(texts) > 1:
            print(f"--- sample {i + 1} ---")
        print(text)
    return 0


def cmd_merge_lora(ns: argparse.Namespace) -> int:
    import warnings

    from stackwise.io.merge import merge_checkpoint

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


def cmd_lr_find(ns: argparse.Namespace) -> int:
    from datetime import datetime

    from stackwise.pipeline import build_trainer
    from stackwise.train.lr_find import lr_find

    if not (0 < ns.min_lr < ns.max_lr) or ns.steps < 2:
        raise StackWiseError(
            f"lr-find needs 0 < --min-lr < --max-lr and --steps >= 2 (got {ns.min_lr}, "
            f"{ns.max_lr}, {ns.steps})."
        )
    config = _load(ns.args)
    if config.train.output_dir is None:
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        from stackwise.config import derive

        config = derive(config, {"train.output_dir": f"outputs/lr-find-{stamp}"}, "lr-find")
    trainer = build_trainer(config)
    result = lr_find(trainer, ns.min_lr, ns.max_lr, ns.steps)
    plot = result.plot(Path(ns.plot) if ns.plot else trainer.output_dir / "lr_find.png")
    print(
        f"swept {len(result.lrs)} steps from {ns.min_lr:.1e} to {result.lrs[-1]:.1e}"
        + (" (stopped: the loss diverged)" if result.stopped_early else "")
    )
    print(f"plot: {plot}")
    print(f"suggested lr: {result.suggestion:.2e}")
    return 0


def cmd_eval(ns: argparse.Namespace) -> int:
    import json

    from stackwise.evaluate import EvalSettings, render, run_eval

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
    if ns.aliases:
        from stackwise.config import alias_table

        if ns.action != "show" or ns.args:
            raise StackWiseError("--aliases goes with `stackwise config show` alone.")
        width = max(len(a) for a, _ in alias_table())
        print("the seeds' legacy names StackWise accepts, and what each means:")
        for alias, meaning in alias_table():
            print(f"  {alias:<{width}}  ->  {meaning}")
        return 0
    config = _load(ns.args)
    if ns.action == "show":
        print(config.to_yaml(), end="")
    else:
        print("config is valid")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="stackwise", description="Train language models stack by stack."
    )
    from stackwise import __version__

    p.add_argument("--version", action="version", version=f"stackwise {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    _train_parser(sub)
    _generate_parser(sub)
    _merge_lora_parser(sub)
    _lr_find_parser(sub)
    _eval_parser(sub)
    _env_parser(sub)
    _config_parser(sub)
    return p


def _train_parser(sub: Any) -> None:
    t = sub.add_parser(
        "train",
        help="train a rack",
        description=(
            "Train from CONFIG (a YAML/JSON file or a preset name; default "
            f"'{DEFAULT_PRESET}') with dotted overrides such as train.max_steps=100."
        ),
    )
    t.add_argument("args", nargs="*", metavar="[CONFIG] [key=value ...]")
    t.set_defaults(func=cmd_train)


def _generate_parser(sub: Any) -> None:
    g = sub.add_parser("generate", help="sample text from a trained rack")
    g.add_argument("--checkpoint", required=True, help="output dir of `stackwise train`")
    g.add_argument("--prompt", default=None)
    g.add_argument("--num-samples", type=int, default=1)
    g.add_argument("--max-new-tokens", type=int, default=None)
    g.add_argument("--temperature", type=float, default=None)
    g.add_argument("--top-k", type=int, default=None)
    g.add_argument("--top-p", type=float, default=None)
    _masked_sampling_flags(g)
    g.add_argument(
        "--block-length", type=int, default=None, help="semi-autoregressive block size (0: off)"
    )
    g.add_argument(
        "--no-repeat-words",
        action="store_const",
        const=True,
        default=None,
        help="char/byte racks: redraw a word that repeats the word before it",
    )
    g.add_argument(
        "--allow-repeat-words",
        dest="no_repeat_words",
        action="store_const",
        const=False,
        help="turn off the config's sample.no_repeat_words",
    )
    g.add_argument("--seed", type=int, default=0)
    g.set_defaults(func=cmd_generate)


def _masked_sampling_flags(parser: argparse.ArgumentParser) -> None:
    """The sampler flags `generate` and `eval` share (sample.* of the run's config)."""
    parser.add_argument("--steps", type=int, default=None, help="denoising steps (mlm/diffusion)")
    parser.add_argument("--sampler", choices=["ancestral", "remask", "single_pass"], default=None)
    parser.add_argument(
        "--remasking",
        choices=["low_confidence", "random", "entropy", "margin"],
        default=None,
        help="remask: which positions are revealed first",
    )


def _merge_lora_parser(sub: Any) -> None:
    m = sub.add_parser(
        "merge-lora",
        help="fold LoRA adapters into their base and save a plain rack",
        description=(
            "Merge every adapter of CHECKPOINT (an output dir of `stackwise train`) into its "
            "dequantized base and save full-precision safetensors to OUT."
        ),
    )
    m.add_argument("checkpoint", metavar="CHECKPOINT")
    m.add_argument("out", metavar="OUT")
    m.add_argument(
        "--requantize",
        action="store_true",
        help="store stacks whose base was quantized in that format again (smaller, lossy)",
    )
    m.set_defaults(func=cmd_merge_lora)


def _lr_find_parser(sub: Any) -> None:
    f = sub.add_parser(
        "lr-find",
        help="LR range test: suggest a learning rate, plot loss against LR",
        description=(
            "Train briefly from CONFIG while the LR grows exponentially, print the LR where the "
            "loss falls fastest and save a plot. The model is restored afterwards; progressive "
            "configs are swept on the whole rack."
        ),
    )
    f.add_argument("args", nargs="*", metavar="[CONFIG] [key=value ...]")
    f.add_argument("--steps", type=int, default=100)
    f.add_argument("--min-lr", type=float, default=1e-6)
    f.add_argument("--max-lr", type=float, default=1.0)
    f.add_argument("--plot", default=None, help="PNG path (default OUTPUT_DIR/lr_find.png)")
    f.set_defaults(func=cmd_lr_find)


def _eval_parser(sub: Any) -> None:
    v = sub.add_parser(
        "eval",
        help="likelihood (bits/char), conditional likelihood and sample quality of a run",
        description=(
            "Score the run in --checkpoint on its validation split with fixed noise (the "
            "numbers of two runs are comparable), sample from it, and write eval.json there."
        ),
    )
    v.add_argument("--checkpoint", required=True, help="output dir of `stackwise train`")
    v.add_argument("--reference", default=None, help="a causal run to score samples (gen PPL)")
    v.add_argument("--samples", type=int, default=16)
    v.add_argument("--t-points", type=int, default=16, help="t grid size of the NELBO")
    v.add_argument("--mc-num", type=int, default=8, help="noise levels per conditional estimate")
    v.add_argument("--max-blocks", type=int, default=64, help="validation blocks scored")
    _masked_sampling_flags(v)
    v.add_argument("--seed", type=int, default=0)
    v.set_defaults(func=cmd_eval)


def _env_parser(sub: Any) -> None:
    e = sub.add_parser(
        "env",
        help="print versions, CPU/GPU, the bf16 probe and cache dirs (paste it into bug reports)",
    )
    e.add_argument("--json", action="store_true", help="machine-readable output")
    e.add_argument(
        "--refresh-probe", action="store_true", help="run the bf16 probe again, ignoring its cache"
    )
    e.set_defaults(func=cmd_env)


def _config_parser(sub: Any) -> None:
    c = sub.add_parser("config", help="show or validate a config")
    c.add_argument("action", choices=["show", "validate"])
    c.add_argument("args", nargs="*", metavar="[CONFIG] [key=value ...]")
    c.add_argument(
        "--aliases", action="store_true", help="show: list the accepted legacy (seed) key names"
    )
    c.set_defaults(func=cmd_config)


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    ns = build_parser().parse_args(argv)
    try:
        return ns.func(ns)
    except StackWiseError as err:
        if hasattr(err, "resume_command"):  # a stop signal: the work is saved, say how to go on
            print(
                f"stackwise: stopped by {err.signal_name} at step {err.step}; the checkpoint "
                f"{err.checkpoint} holds the work. To resume:\n  "
                f"{err.resume_command(ns.args)}",
                file=sys.stderr,
            )
            return 130
        # wrap between words only: a path or key in the message must stay copy-pasteable
        msg = textwrap.fill(
            " ".join(str(err).split()), width=100, break_long_words=False, break_on_hyphens=False
        )
        print(f"stackwise: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("stackwise: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`| head`): not an error of ours
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush stays quiet
        return 0


if __name__ == "__main__":
    sys.exit(main())
