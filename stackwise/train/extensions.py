"""Extensions: callbacks with their own state, checkpointed with the run.

Every hook receives a `RunInfo` (stackwise.train.state): a read-only view of the run, whose
`control` carries requests back (stop, save now). An extension's `state_dict()` must be
JSON-serialisable; it is stored in `trainer_state.json`, handed back to `load_state_dict` on
resume, and then `on_resume` runs. An extension that wants checkpoints kept names them in
`protected_checkpoints()`; rotation never deletes those. User code adds
its own with `@register_extension("name")` and turns it on with
`train.enabled_extensions: [name]`, or `[module:name]` from the command line, which imports the
module (and so registers the name) first.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from stackwise.errors import StackWiseError
from stackwise.registry import Registry
from stackwise.train.state import RunInfo

HOOKS = (
    "on_train_begin",
    "on_resume",
    "on_step_begin",
    "on_step_end",
    "on_log",
    "on_eval",
    "on_save",
    "on_stack_begin",
    "on_stack_end",
    "on_train_end",
)


class Extension:
    """Override the hooks you need; the defaults do nothing."""

    name = "extension"

    def on_train_begin(self, run: RunInfo) -> None: ...

    def on_resume(self, run: RunInfo) -> None:
        """After this extension's state came back from a checkpoint."""

    def on_step_begin(self, run: RunInfo) -> None: ...

    def on_step_end(self, run: RunInfo) -> None: ...

    def on_log(self, run: RunInfo, metrics: dict[str, Any]) -> None:
        """`metrics` are prefixed (train/loss, val/nelbo ...)."""

    def on_eval(self, run: RunInfo, metrics: dict[str, float]) -> None: ...

    def on_save(self, run: RunInfo, path: Any) -> None: ...

    def on_stack_begin(self, run: RunInfo, index: int) -> None:
        """Progressive runs: `run` is the stage's (`run.stack_index`, `run.model`);
        on_stack_end comes once the stage is saved and recorded."""

    def on_stack_end(self, run: RunInfo, index: int, record: Any) -> None: ...

    def on_train_end(self, run: RunInfo) -> None: ...

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def protected_checkpoints(self) -> set[str]:
        """Names of checkpoints (checkpoint-<step>) that rotation must keep."""
        return set()

    def report(self) -> dict[str, Any]:
        """Values worth logging at each save (the best metric, say); they go to the metrics
        (metrics.jsonl as report/<key>), not into the checkpoint's run state."""
        return {}


EXTENSIONS: Registry[Extension] = Registry(
    "extension",
    "register_extension",
    "From the command line, name it module:name (e.g. my_pkg.callbacks:grad_watch) so its "
    "module is imported first.",
)
REGISTRY = EXTENSIONS.entries


def register_extension(name: str) -> Callable[[type[Any]], type[Any]]:
    """Class decorator: makes `name` usable in `train.enabled_extensions`."""
    return EXTENSIONS.register(name)


# extensions the seeds name and none of them defines: what each would have been
UNDEFINED = {
    "quantum": "quantum-inspired layers or training, described by no seed",
    "multimodal": "inputs beside text (images, audio), with no model or data for them",
}


def build_extensions(names: list[str]) -> list[Extension]:
    """The extensions `names` lists; `module:name` imports the module first, so an extension
    registered in your own code works from the command line too."""
    for name in names:
        if name in UNDEFINED and name not in EXTENSIONS.entries:
            raise StackWiseError(
                f"train.enabled_extensions names '{name}', an extension the seeds mention but "
                f"never define ({UNDEFINED[name]}), so StackWise has none. Registered "
                f"extensions: {EXTENSIONS.known()} (memory adds routed memory layers to the "
                "model). To add your own, subclass stackwise.Extension (its hooks: "
                f"{', '.join(HOOKS)}), decorate it with @stackwise.register_extension('{name}') "
                "and list that name; or remove it from the list."
            )
    return [EXTENSIONS.create(_imported(n), "train.enabled_extensions") for n in names]


def _imported(entry: str) -> str:
    """The registered name of an enabled_extensions entry, importing `module` of
    `module:name` (the module registers `name` when imported)."""
    module, sep, name = entry.rpartition(":")
    if not sep:
        return entry
    if not module or not name:
        raise StackWiseError(
            f"train.enabled_extensions entry '{entry}' is malformed; write a registered name or "
            "module:name (e.g. my_pkg.callbacks:grad_watch)."
        )
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name is None or not (module == err.name or module.startswith(f"{err.name}.")):
            raise  # the module exists, and something it imports is missing: its own traceback
        raise StackWiseError(
            f"train.enabled_extensions entry '{entry}' names module '{module}', which cannot "
            f"be imported ({err}). Install it, or put its folder on PYTHONPATH (e.g. "
            "PYTHONPATH=. stackwise train ...)."
        ) from None
    if name not in EXTENSIONS.entries:
        raise StackWiseError(
            f"train.enabled_extensions entry '{entry}': module '{module}' was imported but "
            f"registers no extension '{name}'. Decorate its class with "
            f"@stackwise.register_extension('{name}'). Registered: {EXTENSIONS.known()}."
        )
    return name


class ExtensionManager:
    """The run's extensions, in call order: it calls their hooks with the run's RunInfo, gathers
    their states for a checkpoint and hands them back on resume, and names the checkpoints they
    protect from rotation. The Trainer talks to this, never to an extension by name."""

    def __init__(self, extensions: Sequence[Extension] = ()) -> None:
        self.extensions = list(extensions)
        self.info: RunInfo | None = None

    def __iter__(self) -> Iterator[Extension]:
        return iter(self.extensions)

    def bind(self, info: RunInfo) -> None:
        """The run the hooks will see (its RunInfo is made once the Trainer is assembled)."""
        self.info = info

    def call(self, hook: str, *args: Any) -> None:
        if hook not in HOOKS:
            raise ValueError(f"unknown hook {hook!r}; hooks are {', '.join(HOOKS)}")
        assert self.info is not None, "bind the run first"
        for ext in self.extensions:
            getattr(ext, hook)(self.info, *args)

    def state_dict(self) -> dict[str, dict[str, Any]]:
        return {e.name: e.state_dict() for e in self.extensions}

    def load_state_dict(self, states: dict[str, dict[str, Any]]) -> None:
        """Each extension's saved state back, then its on_resume."""
        assert self.info is not None, "bind the run first"
        for ext in self.extensions:
            if ext.name in states:
                ext.load_state_dict(states[ext.name])
                ext.on_resume(self.info)

    def protected_checkpoints(self) -> set[str]:
        return set().union(*(e.protected_checkpoints() for e in self.extensions))

    def reports(self) -> dict[str, Any]:
        """What the extensions report (the best metric, say): logged with the metrics."""
        out: dict[str, Any] = {}
        for ext in self.extensions:
            out.update(ext.report())
        return out
