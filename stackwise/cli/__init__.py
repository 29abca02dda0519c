"""`stackwise train | generate | eval | merge-lora | lr-find | env | config`.

User mistakes (StackWiseError) print one paragraph and exit 2; there is no traceback for them.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import sys
import textwrap
import threading
from collections.abc import Iterator
from typing import NoReturn

from stackwise.cli.commands import generate_help_defaults
from stackwise.cli.common import DEFAULT_PRESET, PRESETS, resolve_config_path
from stackwise.cli.hf_commands import cmd_finetune
from stackwise.cli.parsers import build_parser
from stackwise.cli.unknown_flags import refuse_unknown
from stackwise.errors import StackWiseError
from stackwise.launcher import without_launcher_rank
from stackwise.quiet import filter_library_noise

__all__ = [
    "DEFAULT_PRESET",
    "PRESETS",
    "build_parser",
    "main",
    "resolve_config_path",
    "run",
]


def run(argv: list[str] | None = None) -> NoReturn:
    """The `stackwise` command as a process: main(), then exit with its code (see leave)."""
    from stackwise.launcher import leave

    leave(main(argv))


def _release_processes() -> None:
    if "torch.distributed" in sys.modules:  # nothing to release in commands that never used it
        from stackwise.train.hardware import release_processes

        release_processes()


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While a command runs, SIGTERM raises KeyboardInterrupt as Ctrl-C does, so cleanups run
    (temporary files, the run lock) instead of the process dying mid-write. Training installs
    its own handlers, which save a checkpoint first (stackwise.train.interrupts)."""

    def _raise(signum: int, frame: object) -> None:
        raise KeyboardInterrupt("SIGTERM")

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        if previous is not None:  # None: installed outside Python, cannot be put back
            signal.signal(signal.SIGTERM, previous)


def paragraph(message: str) -> str:
    """An error message as one paragraph: wrapped between words (a path or key stays
    copy-pasteable) to the terminal, up to 100 columns; on one line when stderr is not a
    terminal, so logs and `grep` see whole sentences whatever the width or path lengths."""
    text = " ".join(message.split())
    if not sys.stderr.isatty():
        return text
    width = min(100, shutil.get_terminal_size((100, 24)).columns)
    return textwrap.fill(text, width=max(width, 40), break_long_words=False, break_on_hyphens=False)


def _parse_command(args: list[str]) -> argparse.Namespace:
    """The subcommand, its flags and its arguments (dotted overrides may follow the flags:
    `lr-find cfg --steps 50 train.lr=1`); exits 2 on a flag the subcommand does not know."""
    parser = build_parser(generate_help_defaults(args))
    if args[:1] == ["finetune"] and not {"-h", "--help"} & set(args):
        # its flags are config keys, parsed (with did-you-mean) by stackwise.cli.finetune
        return argparse.Namespace(command="finetune", args=args[1:], func=cmd_finetune)
    ns, extra = parser.parse_known_args(args)
    if extra:
        if not hasattr(ns, "args") or any(a.startswith("-") or "=" not in a for a in extra):
            refuse_unknown(parser, getattr(ns, "command", None), extra)
        ns.args = [*ns.args, *extra]
    return ns


def _report_stop(err: StackWiseError, ns: argparse.Namespace) -> int:
    """A stop signal during training: the work is saved; say where and how to go on."""
    _release_processes()  # every rank stopped at the same step
    code = 143 if err.signal_name == "SIGTERM" else 130  # 128 + the signal, as a shell
    if os.environ.get("RANK", "0") != "0":  # under torchrun, rank 0 says it once
        return code
    print(
        f"stackwise: stopped by {err.signal_name} {err.where}; {err.checkpoint} "
        f"holds the work. To resume:\n  "
        f"{err.resume_command(ns.args, ns.command)}",
        file=sys.stderr,
    )
    return code


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    filter_library_noise()
    args = sys.argv[1:] if argv is None else [str(a) for a in argv]
    ns = _parse_command(without_launcher_rank(args))
    try:
        with sigterm_as_interrupt():
            code = ns.func(ns)
        _release_processes()
        return code
    except StackWiseError as err:
        if hasattr(err, "resume_command"):
            return _report_stop(err, ns)
        print(f"stackwise: error: {paragraph(str(err))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:
        # outside a training step (preparing data, the final save, samples), or a second
        # Ctrl-C: what was saved before stays saved, nothing more is written
        why = str(err) or "SIGINT"
        said = why if why.startswith("second") else f"interrupted by {why}"
        if why == "SIGTERM" and int(os.environ.get("WORLD_SIZE", "1")) > 1:
            # torchrun stops every process once one of them failed: that one said why
            said += " (the launcher stops all processes when one fails: see its error above)"
        if os.environ.get("RANK", "0") == "0":
            print(f"stackwise: {said}; files saved before it are kept", file=sys.stderr)
        return 143 if why == "SIGTERM" else 130
    except BrokenPipeError:  # the reader went away (`| head`): not an error of ours
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush stays quiet
        return 0
