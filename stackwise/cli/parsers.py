"""The `stackwise` command line: one parser per subcommand, with the help users read."""

from __future__ import annotations

import argparse
import inspect
from typing import Any

from stackwise import registry
from stackwise.cli.commands import cmd_eval, cmd_export_hf, cmd_generate, cmd_merge_lora
from stackwise.cli.common import DEFAULT_PRESET
from stackwise.cli.config_commands import cmd_config, cmd_env
from stackwise.cli.hf_commands import cmd_data, cmd_finetune
from stackwise.cli.report_command import report_flag, report_parser
from stackwise.cli.train_commands import cmd_lr_find, cmd_train

ARGS_HELP = "a YAML/JSON file or preset name first (optional), then dotted overrides"


def _about(command: Any) -> str:
    """A subcommand's --help text is its function's docstring: one text, kept beside the code."""
    text = inspect.getdoc(command) or ""  # python -OO drops docstrings: no description then
    return " ".join(text.split()).replace("DEFAULT_PRESET", DEFAULT_PRESET)


def build_parser(generate_defaults: dict[str, Any] | None = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="stackwise", description="Train language models stack by stack."
    )
    from stackwise import __version__

    p.add_argument("--version", action="version", version=f"stackwise {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    _train_parser(sub)
    _finetune_parser(sub)
    _generate_parser(sub, generate_defaults)
    _merge_lora_parser(sub)
    _export_hf_parser(sub)
    _lr_find_parser(sub)
    _eval_parser(sub)
    _env_parser(sub)
    _config_parser(sub)
    _data_parser(sub)
    report_parser(sub, _about)
    return p


def _train_parser(sub: Any) -> None:
    t = sub.add_parser("train", help="train a rack", description=_about(cmd_train))
    t.add_argument("args", nargs="*", metavar="CONFIG|key=value", help=ARGS_HELP)
    t.add_argument(
        "--config", dest="config_file", metavar="FILE", help="the config (instead of CONFIG)"
    )
    report_flag(t)
    t.set_defaults(func=cmd_train)


def _finetune_parser(sub: Any) -> None:
    from stackwise.cli.finetune import FLAGS, PRECISION_FLAGS

    names = ", ".join(f"--{n}" for n in [*FLAGS, *PRECISION_FLAGS, "config"])
    f = sub.add_parser(
        "finetune",
        help="fine-tune a Hugging Face causal LM with LoRA/QLoRA on chat data",
        description=_about(cmd_finetune) + f" Flags: {names}.",
    )
    f.add_argument("args", nargs="*", metavar="--flag value | key=value")
    f.set_defaults(func=cmd_finetune)


def _data_parser(sub: Any) -> None:
    d = sub.add_parser(
        "data",
        help="preview instruction data with its targets marked",
        description=_about(cmd_data),
    )
    d.add_argument("action", choices=["preview"])
    d.add_argument("args", nargs="*", metavar="CONFIG|key=value", help=ARGS_HELP)
    d.add_argument("--index", type=int, default=0, help="which training example (default: 0)")
    d.set_defaults(func=cmd_data)


SAMPLERS = """\
how each rack samples:
  clm          left to right, one token per forward pass, with a KV cache; --steps,
               --sampler, --remasking and --block-length do not apply and are refused.
  ancestral    (diffusion's default) MDLM's reverse process: at each of --steps steps
               every masked position is revealed with the probability the noise
               schedule gives for that step, so the text firms up everywhere at once.
  remask       (mlm's default) LLaDA-style: each step predicts every masked position
               and keeps the ones --remasking ranks first; the rest are masked again.
  confidence   each step reveals every masked position whose drawn token is at least
               --confidence-threshold likely (at least one per row): few steps where
               the rack is sure.
  remdm        ancestral, and tokens revealed earlier in the block may be masked
               again (ReMDM, chance capped by --remask-budget) and redrawn.
  single_pass  one forward pass per stack through a rack grown as a denoising chain
               (progressive.depth_order: high_to_low), from the noisiest stack down.
  block        (block_diffusion's default and only way) the rack's own blocks left to
               right, ancestral steps inside each, scoring one block per step against a
               KV cache of the finished ones; block_remask ranks the block's reveals
               by --remasking instead. --block-length does not apply.
--block-length N fills N-token blocks left to right (semi-autoregressive), each with
its share of the steps; long generations are printed block by block (clm: token by
token) when one sample is asked for.
"""

# the settings one sampler reads, as flags (sample.<name>)
OWN_SAMPLER_FLAGS = {
    "confidence_threshold": "confidence: reveal every position at least this likely",
    "remask_budget": "remdm: the most a revealed token's chance to be masked again",
}

# flag -> what it sets, beside the default the checkpoint's config gives it
SAMPLE_FLAGS = {
    "max_new_tokens": (int, "tokens to generate"),
    "temperature": (float, "softmax temperature; 0 is greedy"),
    "top_k": (int, "keep the k likeliest tokens; 0 keeps all"),
    "top_p": (float, "nucleus sampling: keep the smallest set with this much mass"),
}


def _generate_parser(sub: Any, defaults: dict[str, Any] | None) -> None:
    """`defaults`: the sample section of the checkpoint named before --help, if any."""
    where = "this checkpoint's" if defaults else "the checkpoint's config, sample."
    g = sub.add_parser(
        "generate",
        help="sample text from a trained rack",
        description="Sample from a trained run (one sample unless --num-samples says more). "
        "Unset sampling flags take the run's sample.* settings"
        + (" shown below." if defaults else "; name --checkpoint before --help to see them."),
        epilog=SAMPLERS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g.add_argument(
        "--checkpoint", required=True, help="a run folder of `stackwise train`, or a checkpoint-N"
    )
    g.add_argument("--prompt", default=None, help=_shown(defaults, "prompt", where))
    g.add_argument(
        "--chat",
        default=None,
        help="fine-tuned chat models: a question, rendered with the template",
    )
    g.add_argument("--num-samples", type=int, default=1, help="samples to draw (default: 1)")
    for name, (kind, text) in SAMPLE_FLAGS.items():
        flag = "--" + name.replace("_", "-")
        g.add_argument(flag, type=kind, default=None, help=f"{text}{_shown(defaults, name, where)}")
    _masked_sampling_flags(g, defaults)
    block = _shown(defaults, "block_length", where)
    g.add_argument("--block-length", type=int, default=None, help=f"block size; 0: one{block}")
    _repeat_words_flags(g, _shown(defaults, "no_repeat_words", where))
    g.add_argument("--seed", type=int, default=0, help="sampling seed (default: 0)")
    _remote_code_flag(g)
    g.set_defaults(func=cmd_generate)


def _repeat_words_flags(parser: argparse.ArgumentParser, shown: str) -> None:
    """The pair that sets sample.no_repeat_words either way (unset: the run's own)."""
    parser.add_argument(
        "--no-repeat-words",
        action="store_const",
        const=True,
        default=None,
        help="char/byte racks: redraw a word that repeats the word before it" + shown,
    )
    parser.add_argument(
        "--allow-repeat-words",
        dest="no_repeat_words",
        action="store_const",
        const=False,
        help="turn off the config's sample.no_repeat_words",
    )


def _shown(defaults: dict[str, Any] | None, name: str, where: str) -> str:
    if defaults is None:
        return f" (default: {where}{name})" if where.endswith(".") else ""
    return f" (default: {defaults[name]!r})"


def _masked_sampling_flags(
    parser: argparse.ArgumentParser, defaults: dict[str, Any] | None = None
) -> None:
    """The sampler flags `generate` and `eval` share (sample.* of the run's config)."""
    where = "the checkpoint's config, sample."
    steps = _shown(defaults, "steps", where)
    parser.add_argument("--steps", type=int, default=None, help=f"denoising steps{steps}")
    parser.add_argument(
        "--sampler",
        choices=registry.SAMPLERS.names(),
        default=None,
        help="mlm/diffusion: see below" + _shown(defaults, "sampler", where),
    )
    parser.add_argument(
        "--remasking",
        choices=["low_confidence", "random", "entropy", "margin"],
        default=None,
        help="remask: which positions are revealed first" + _shown(defaults, "remasking", where),
    )
    for name, what in OWN_SAMPLER_FLAGS.items():
        flag = "--" + name.replace("_", "-")
        parser.add_argument(
            flag, type=float, default=None, help=what + _shown(defaults, name, where)
        )


def _merge_lora_parser(sub: Any) -> None:
    summary = "fold LoRA adapters into their base and save a plain rack"
    m = sub.add_parser("merge-lora", help=summary, description=_about(cmd_merge_lora))
    m.add_argument("checkpoint", metavar="CHECKPOINT")
    m.add_argument("out", metavar="OUT")
    m.add_argument(
        "--requantize",
        action="store_true",
        help="store stacks whose base was quantized in that format again (smaller, lossy)",
    )
    _remote_code_flag(m)
    m.set_defaults(func=cmd_merge_lora)


def _remote_code_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="fine-tuned runs whose model needs its own Python code: allow running it",
    )


LR_FIND_FLAGS = {
    "--steps": (int, 100, "optimizer steps of the sweep"),
    "--min-lr": (float, 1e-6, "the LR of the first step"),
    "--max-lr": (float, 1.0, "the LR of the last step"),
}


def _export_hf_parser(sub: Any) -> None:
    summary = "write a trained rack as a Hugging Face Llama checkpoint"
    x = sub.add_parser("export-hf", help=summary, description=_about(cmd_export_hf))
    x.add_argument("run", metavar="RUN")
    x.add_argument("out", metavar="OUT")
    x.set_defaults(func=cmd_export_hf)


def _lr_find_parser(sub: Any) -> None:
    summary = "LR range test: suggest a learning rate, plot loss against LR"
    f = sub.add_parser("lr-find", help=summary, description=_about(cmd_lr_find))
    f.add_argument("args", nargs="*", metavar="CONFIG|key=value", help=ARGS_HELP)
    for flag, (kind, default, text) in LR_FIND_FLAGS.items():
        f.add_argument(flag, type=kind, default=default, help=f"{text} (default: {default})")
    f.add_argument("--plot", default=None, help="PNG path (default: OUTPUT_DIR/lr_find.png)")
    f.set_defaults(func=cmd_lr_find)


def _eval_parser(sub: Any) -> None:
    summary = "likelihood (bits/char), conditional likelihood and sample quality of a run"
    v = sub.add_parser("eval", help=summary, description=_about(cmd_eval))
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
    c = sub.add_parser(
        "config",
        help="show or validate a config; list or copy the presets",
        description="show/validate [CONFIG] [key=value ...]; list; copy NAME FILE.",
    )
    c.add_argument("action", choices=["show", "validate", "list", "copy"])
    c.add_argument("args", nargs="*", metavar="CONFIG|key=value", help=ARGS_HELP)
    c.add_argument(
        "--aliases", action="store_true", help="show: list every seed key and where it lands"
    )
    c.add_argument(
        "--as-seed",
        metavar="N",
        help="show: write the config in seed N's layout (000, 001, 002, 003 or 004)",
    )
    c.set_defaults(func=cmd_config)
