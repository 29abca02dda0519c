"""Refusing the flags a subcommand does not know, with the nearest known flag of each, or the
key=value form when a config key was typed as a flag."""

from __future__ import annotations

import argparse
from typing import NoReturn


def _config_key_for(flag: str, command: str | None) -> tuple[str | None, bool]:
    """The config key a `--flag` names (`--max_steps` -> train.max_steps), for the commands
    that take config keys as key=value, and whether it is a whole section (`--model-size`
    is nearest to `model`, which takes no value)."""
    if command not in ("train", "lr-find"):
        return None, False
    from stackwise.config import Config
    from stackwise.config.keys import section_of
    from stackwise.config.loading import _nearest

    key = _nearest(flag.lstrip("-").replace("-", "_"), Config, top=True)
    field = Config.model_fields.get(key or "")
    return key, field is not None and section_of(field.annotation) is not None


def refuse_unknown(
    parser: argparse.ArgumentParser, command: str | None, extra: list[str]
) -> NoReturn:
    """Exit 2 with the command's own usage line, naming the nearest known flag of each unknown
    one (`--temprature` -> --temperature, `--num_samples` -> --num-samples)."""
    import difflib

    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    own = subs[0].choices.get(command, parser) if subs and command else parser
    known = [flag for action in own._actions for flag in action.option_strings]
    hints = []
    for i, arg in enumerate(extra):
        name = arg.split("=", 1)[0]
        near = difflib.get_close_matches(name.replace("_", "-"), known, n=1, cutoff=0.6)
        key, section = _config_key_for(name, command) if arg.startswith("--") else (None, False)
        if key and section:
            hints.append(
                f"{name}: config keys go as key=value here; `stackwise config show` "
                f"lists the {key}.* keys"
            )
        elif key:  # a config key typed as a flag (`--max_steps 5`)
            value = arg.split("=", 1)[1] if "=" in arg else None
            if value is None and i + 1 < len(extra) and not extra[i + 1].startswith("-"):
                value = extra[i + 1]
            keys = " or ".join(f"{k}={value or 'X'}" for k in key.split("' or '"))
            hints.append(f"{name}: config keys go as key=value here, e.g. {keys}")
        elif arg.startswith("-") and near:
            hints.append(f"{name}: did you mean {near[0]}?")
    own.error(f"unrecognized arguments: {' '.join(extra)}" + "".join(f"; {h}" for h in hints))
