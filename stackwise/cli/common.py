"""What the subcommand modules share: finding a config (file or preset), loading it with its
overrides, and the summary lines that end a run."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from stackwise.errors import StackWiseError

PRESETS = Path(__file__).parents[1] / "presets"
DEFAULT_PRESET = "tiny-diffusion-progressive"
CONFIG_SUFFIXES = (".yaml", ".yml", ".json")


def resolve_config_path(name: str | None) -> Path:
    """A file path, or the name of a bundled preset (`tiny-clm`)."""
    if name is None:
        name = DEFAULT_PRESET
    path = Path(name)
    if path.is_file() and path.suffix.lower() in CONFIG_SUFFIXES:
        return path
    if path.is_file() or path.is_dir():
        kind = "a folder" if path.is_dir() else f"a '{path.suffix or 'suffix-less'}' file"
        raise StackWiseError(
            f"CONFIG '{name}' is {kind}, but a config is a YAML (.yaml, .yml) or JSON (.json) "
            "file or a preset name. Give the config file (data files go in data.files), or "
            "leave CONFIG out for the default preset."
        )
    preset = PRESETS / (name if name.endswith(".yaml") else f"{name}.yaml")
    if preset.is_file():
        return preset
    known = ", ".join(sorted(p.stem for p in PRESETS.glob("*.yaml")))
    raise StackWiseError(f"Config '{name}' is neither a file nor a preset. Presets: {known}.")


def split_args(args: list[str]) -> tuple[str | None, list[str]]:
    if args and "=" not in args[0]:
        return args[0], args[1:]
    return None, args


def load_args(args: list[str]) -> Any:
    from stackwise.config import load_config

    name, overrides = split_args(args)
    return load_config(resolve_config_path(name), overrides)


def run_summary(result: Any, seconds: float) -> str:
    """The last lines of a run: how long it took, where it ended, and what to run next."""
    from stackwise.strategies.report import final_eval_line
    from stackwise.units import format_flops

    final = result.progressive.final_eval if result.progressive is not None else None
    if final is None and result.state is not None and result.state.history:
        final = result.state.history[-1]
    minutes, secs = divmod(round(seconds), 60)
    out = shlex.quote(str(result.output_dir))
    lines = [f"--- done in {minutes}m {secs:02d}s ---"]
    if final:
        at = f" (step {final['step']})" if "step" in final else ""
        lines.append(f"final{at}: " + final_eval_line(final).split(": ", 1)[1])
    flops, tokens = result.compute()
    if flops:
        lines.append(f"compute: {format_flops(flops)} training FLOPs over {tokens:,} tokens")
    lines.append("next:")
    if result.config.data.mode == "instruction":
        lines += [
            f"  stackwise generate --checkpoint {out} --chat 'Hello!'",
        ]
        cfg = result.config
        if cfg.model.source == "hf" and cfg.lora.enabled and not cfg.memory_on:
            lines.append(
                f"  stackwise merge-lora {out} {shlex.quote(str(result.output_dir) + '-merged')}"
            )
    else:
        lines += [
            f"  stackwise generate --checkpoint {out} --prompt 'To be'",
            f"  stackwise eval --checkpoint {out}",
        ]
    lines.append(f"  stackwise report {out}")
    if result.config.logging.tensorboard:
        lines.append(f"  tensorboard --logdir {out}")
    return "\n".join(lines)


CONTROL = {c: f"\\x{c:02x}" for c in [*range(32), *range(127, 160)] if chr(c) not in "\n\t"}


def printable(text: str) -> str:
    """Generated text for a terminal: control characters (a byte-level model can emit ESC and
    friends, which would drive the terminal) shown as \\xNN escapes; newlines and tabs kept."""
    return text.translate(CONTROL)
