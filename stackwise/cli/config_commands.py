"""The commands about setup rather than runs: `stackwise env` (this machine) and
`stackwise config` (show, validate, list or copy configs and presets)."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from stackwise.cli.common import DEFAULT_PRESET, PRESETS, load_args
from stackwise.errors import StackWiseError


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
        print("the seeds' key names StackWise accepts, and the key each lands on:")
        for alias, meaning in alias_table():
            print(f"  {alias:<{width}}  ->  {meaning}")
        return 0
    if ns.as_seed is not None and ns.action != "show":
        raise StackWiseError("--as-seed goes with `stackwise config show [CONFIG]`.")
    config = load_args(ns.args)
    if ns.as_seed is not None:
        from stackwise.config.seed_export import seed_yaml

        print(seed_yaml(config, ns.as_seed), end="")
    elif ns.action == "show":
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
