"""Seed 004's command line as a config: `stackwise finetune` and `python -m
stackwise.fronts.model_trainer` take the same flags.

Every flag is a flat key of seed 004's layout (stackwise.config.seed_layouts.model_trainer, the
one table of those names), landing on the config key it names there. A --config file may use
the same flat names (JSON or YAML) or our nested sections; flags override the file, and dotted
key=value overrides come last. The result is an ordinary config, checked by every rule; where it
does not say otherwise it fine-tunes a Hugging Face model with LoRA on instruction rows, for one
epoch at lr 2e-4 (model_trainer.fine_tune_defaults).
"""

from __future__ import annotations

import difflib
import json
import re
from pathlib import Path
from typing import Any

from stackwise.config.seed_layouts.model_trainer import (
    FALSE,
    LAYOUT,
    PRECISION,
    TRUE,
    fine_tune_defaults,
)
from stackwise.errors import StackWiseError

PRECISION_FLAGS = PRECISION  # --bf16/--fp16 -> train.mixed_precision
# flag / flat config key -> our config key
FLAGS: dict[str, str] = {n: k.target for n, k in LAYOUT.keys.items() if n not in PRECISION}


def _takes_bool(target: str) -> bool:
    from stackwise.config import Config
    from stackwise.config.keys import section_of

    model: Any = Config
    annotation: Any = None
    for part in target.split("."):
        annotation = model.model_fields[part].annotation
        model = section_of(annotation)
    return annotation is bool


# flags that mean "true" when given without a value
SWITCHES = frozenset({n for n, target in FLAGS.items() if _takes_bool(target)} | set(PRECISION))


def _value(flag: str, raw: str) -> Any:
    """A flag's text: a switch reads booleans in any case (1/0, yes/no, ...); any other flag
    reads it as a key=value override of its config key would, so `--train_batch_size 0` is 0
    and `--run_name 1` is the name "1"."""
    low = raw.strip().lower()
    if flag in SWITCHES and low in TRUE | FALSE:
        return low in TRUE
    if flag not in FLAGS:
        return raw
    from stackwise.config.loading import parse_override

    return parse_override(f"{FLAGS[flag]}={raw}")[1]


def _suggest(flag: str) -> str:
    names = [*FLAGS, *PRECISION_FLAGS, "config"]
    close = difflib.get_close_matches(flag, names, n=1, cutoff=0.6)
    hint = f" Did you mean --{close[0]}?" if close else ""
    return f"Unknown flag --{flag}.{hint} `stackwise finetune --help` lists them all."


def parse_flags(argv: list[str]) -> tuple[dict[str, Any], str | None, list[str]]:
    """({flag: value}, the --config file, dotted overrides). A flag without a value is true."""
    flags: dict[str, Any] = {}
    config_file, overrides = None, []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--"):
            if "=" not in arg:
                raise StackWiseError(
                    f"'{arg}' is neither a --flag nor a key=value override. Put flag values "
                    "right after their flag, e.g. --learning_rate 2e-4."
                )
            overrides.append(arg)
            i += 1
            continue
        name, _, inline = arg[2:].partition("=")
        name = name.replace("-", "_")
        has_value = inline != "" or (i + 1 < len(argv) and not argv[i + 1].startswith("--"))
        if not has_value and name not in SWITCHES and name in FLAGS:
            raise StackWiseError(f"--{name} needs a value, e.g. --{name} VALUE.")
        raw = inline if inline else (argv[i + 1] if has_value else "true")
        i += 1 if inline or not has_value else 2
        if name == "config":
            config_file = raw
        elif name in FLAGS or name in PRECISION_FLAGS:
            flags[name] = _value(name, raw)
        else:
            raise StackWiseError(_suggest(name))
    return flags, config_file, overrides


def _put(data: dict[str, Any], key: str, value: Any, clash: str | None = None) -> None:
    """A value at its config key, through the config's one dotted-path setter."""
    from stackwise.config.paths import put

    put(data, key, value, clash=clash)


def _two_names(flat: dict[str, Any], origin: str) -> None:
    """Two flat names of one key (--run_name and --wandb_name): one would be dropped."""
    seen: dict[str, str] = {}
    for name in flat:
        target = FLAGS.get(name)
        if target in seen:
            raise StackWiseError(
                f"{origin} gives both {seen[target]} and {name}, two names of {target}; keep one."
            )
        if target is not None:
            seen[target] = name


def _apply_flat(
    data: dict[str, Any], flat: dict[str, Any], origin: str, strict: bool = False
) -> None:
    """Flat seed keys (from flags or a file) into `data`'s sections, each converted as seed
    004's table says (a file name becomes a list of one, deepspeed_config goes to
    parallel.deepspeed_config); fp16/bf16 pick the precision, and asking for both is refused."""
    for p in PRECISION_FLAGS:
        if p in flat and not isinstance(flat[p], bool):  # a file's "False" or 1: as on the CLI
            flat = {**flat, p: _value(p, str(flat[p]))}
        if p in flat and not isinstance(flat[p], bool):
            raise StackWiseError(
                f"{origin} gives {p} the value {flat[p]!r}; it takes true or false "
                f"(--{p} alone means true)."
            )
    want = {p for p in PRECISION_FLAGS if flat.get(p) is True}
    if len(want) > 1:
        raise StackWiseError(f"{origin} asks for both fp16 and bf16; keep one.")
    if want:
        _put(data, "train.mixed_precision", want.pop(), origin if strict else None)
    elif any(flat.get(p) is False for p in PRECISION_FLAGS) and all(
        flat.get(p) is not True for p in PRECISION_FLAGS
    ):
        _put(data, "train.mixed_precision", "no")
    _two_names(flat, origin)
    for name, value in flat.items():
        if name in FLAGS:
            convert = LAYOUT.keys[name].convert
            converted = convert(value) if convert is not None else value
            _put(data, FLAGS[name], converted, origin if strict else None)


def _read_file(path: str) -> dict[str, Any]:
    from stackwise.config.loading import read_file

    data = read_file(path, f"--config '{path}'")
    if not isinstance(data, dict):
        raise StackWiseError(f"--config '{path}' must hold a mapping of keys to values.")
    return data


def is_finetune_file(name: str) -> bool:
    """A JSON/YAML file written for `finetune --config`: it uses at least one flat seed key."""
    file = Path(name).expanduser()
    if not file.is_file() or file.suffix not in (".json", ".yaml", ".yml"):
        return False
    try:
        data = _read_file(name)
    except StackWiseError:
        return False  # the ordinary loader names what is wrong with it
    return any(k in FLAGS or k in PRECISION_FLAGS for k in data)


def _stray_keys(given: dict[str, Any], origin: str) -> None:
    """Keys of a finetune file that are neither flat seed names nor config sections: all named
    at once, each with the nearest valid name."""
    from stackwise.config import Config

    names = [*FLAGS, *PRECISION_FLAGS, *Config.model_fields]
    stray = [k for k in given if k not in names]
    if not stray:
        return
    parts = []
    for key in stray:
        close = difflib.get_close_matches(str(key), names, n=1, cutoff=0.6)
        parts.append(f"'{key}'" + (f" (did you mean '{close[0]}'?)" if close else ""))
    raise StackWiseError(
        f"{origin} has {len(stray)} unknown key(s): {', '.join(parts)}. Use the flat names of "
        "`stackwise finetune --help` or our sections (model, data, train, lora, ...)."
    )


# keys that exclude each other: one given on the command line replaces the file's other
ALTERNATIVES = (
    ("train.max_steps", "train.num_train_epochs"),
    ("train.warmup_steps", "train.warmup_ratio"),
    ("data.files", "data.dataset_dir", "data.dataset_name"),
    ("model.load_in_4bit", "model.load_in_8bit"),
)


def _drop_alternatives(data: dict[str, Any], key: str) -> None:
    """Remove from `data` (the file's settings) the keys that `key` replaces, so a flag or
    override wins over the --config file as a whole (`--max_steps 5` over `num_train_epochs`)."""
    for group in ALTERNATIVES:
        for other in group if key in group else ():
            section, leaf = other.split(".")
            if other != key and isinstance(data.get(section), dict):
                data[section].pop(leaf, None)


def _refuse_rivals(flag_keys: dict[str, str], override_keys: list[str]) -> None:
    """A flag and a key=value override that replace each other (`--max_steps 5` with
    `train.num_train_epochs=2`): neither may silently drop the other."""
    for group in ALTERNATIVES:
        flagged = [k for k in flag_keys if k in group]
        rival = [k for k in override_keys if k in group and k not in flagged]
        if flagged and rival:
            raise StackWiseError(
                f"The command line sets both --{flag_keys[flagged[0]]} and {rival[0]}=..., "
                "which replace each other, so one would be dropped: give only one of them."
            )


def finetune_config(argv: list[str]) -> Any:
    """The config of a `stackwise finetune` command line."""
    from stackwise.config import from_dict
    from stackwise.config.aliases import KEY_ALIASES, apply_aliases, seed_spellings
    from stackwise.config.loading import apply_overrides, respelled

    flags, config_file, overrides = parse_flags(argv)
    data: dict[str, Any] = {}
    spellings: dict[str, str] = {}
    if config_file:
        given = _read_file(config_file)
        _stray_keys(given, f"--config {config_file}")
        flat = {k: v for k, v in given.items() if k in FLAGS or k in PRECISION_FLAGS}
        nested = json.loads(json.dumps({k: v for k, v in given.items() if k not in flat}))
        spellings = {**seed_spellings(nested), **_spelled(flat)}
        _apply_flat(nested, flat, f"--config {config_file}", strict=True)  # both: refused
        for section, values in nested.items():
            if isinstance(values, dict) and isinstance(data.get(section), dict):
                data[section] = {**data[section], **values}
            else:
                data[section] = values
    data = apply_aliases(data)  # the file's legacy names at their keys, which flags replace
    flag_keys = {FLAGS[f]: f for f, v in flags.items() if f in FLAGS and v is not False}
    given = (item.split("=", 1)[0].strip() for item in overrides)
    override_keys = [KEY_ALIASES.get(key, key) for key in given]
    _refuse_rivals(flag_keys, override_keys)
    for key in [*flag_keys, *override_keys]:  # before the command line's own values go in
        _drop_alternatives(data, key)
    _apply_flat(data, flags, "The command line")
    data = apply_overrides(data, overrides)
    fine_tune_defaults(data)  # hf, instruction rows, LoRA, lr 2e-4, one epoch: where unsaid
    _lora_while_off(data.get("lora"))
    # the file's names of the keys the command line left alone (in_flags names its flags)
    flagged = {FLAGS[f] for f in flags if f in FLAGS}
    kept = {real: name for real, name in spellings.items() if real not in flagged}
    return from_dict(data, spellings=respelled(kept, overrides))


def _spelled(given: dict[str, Any]) -> dict[str, str]:
    """real key -> the seed-004 key it was given as, where the names differ, so that an
    invalid config names both (`train.lr` is `learning_rate`)."""
    return {
        FLAGS[name]: name
        for name in given
        if name in FLAGS and FLAGS[name].rsplit(".", 1)[-1] != name
    }


def _lora_while_off(lora: Any) -> None:
    """LoRA settings given while LoRA is off would do nothing, even at their default values
    (which the config rules cannot tell from unset): refused, every one named."""
    if not isinstance(lora, dict) or lora.get("enabled") is not False:
        return
    given = [f"lora.{k}" for k in lora if k != "enabled"]
    if given:
        one = len(given) == 1
        raise StackWiseError(
            f"{', '.join(given)} {'is' if one else 'are'} set, but lora.enabled is false (LoRA "
            f"is off, the whole model trains), so {'it' if one else 'they'} would do nothing. "
            f"Remove {'it' if one else 'them'}, or turn LoRA on."
        )


def in_flags(message: str, argv: list[str]) -> str:
    """An error in config keys, retold with the flags the user typed beside them
    (`--learning_rate (train.lr)`), for `stackwise finetune` and seed 004's module alike."""
    typed = {a[2:].split("=")[0].replace("-", "_") for a in argv if a.startswith("--")}
    for flag in sorted(typed & set(FLAGS), key=len, reverse=True):
        key = FLAGS[flag]
        message = re.sub(rf"(?<![\w.-]){re.escape(key)}(?![\w])", f"--{flag} ({key})", message)
    return message
