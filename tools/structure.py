"""Report how the package's structure stands against the architecture's limits.

    .venv/bin/python tools/structure.py      # exit 1 while any limit is broken

Checks: no import cycles between modules, no module importing from a layer above its own
(cli > pipeline/plan/runs/evaluate/fronts > strategies > progressive > train/generate > io > quant >
model/objectives/data > config/spec/errors), no module below the door (layer 8) importing the
config (they take specs: stackwise.spec), no class inheriting from the Trainer (it is built from
parts), no module over 300 lines, no function over 45 lines. Imports inside functions count
too: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "stackwise"
MAX_MODULE, MAX_FUNCTION = 300, 45
DOOR = 8  # the layer where the config is read and compiled into a Plan
TRAINERS = {"Trainer", "EnhancedTrainer"}
LAYERS = {  # first dotted parts -> layer, higher is further up
    "__main__": 9,
    "cli": 9,
    "pipeline": 8,
    "plan": 8,
    "plan_parallel": 8,
    "runs": 8,
    "evaluate": 8,
    "envreport": 8,
    "report": 8,
    "fronts": 8,
    "strategies": 7,
    "hf": 6,
    "progressive": 6,
    "train": 5,
    "parallel": 5,
    "generate": 5,
    "samplers": 5,
    "repeat_guard": 5,
    "io": 4,
    "chat": 3,
    "quant": 3,
    "growth": 3,
    "model": 2,
    "objectives": 2,
    "data": 2,
    "config": 1,
    "spec": 1,
    "errors": 1,
    "origin": 1,
    "compiling": 1,
    "launcher": 1,
    "paths": 1,
    "precision": 1,
    "registry": 1,
    "seeds": 1,
    "hwprobe": 1,
    "machine": 1,
    "quiet": 1,
    "units": 1,
    "lazy_exports": 1,
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.get(parts[1]) if len(parts) > 1 else None


def imports(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("stackwise")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = module.split(".")[: len(module.split(".")) - node.level + is_package]
                base = ".".join(pkg + ([base] if base else []))
            if base.startswith("stackwise"):
                # `from stackwise.pkg import module` depends on that module, not just on pkg
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    found.add(sub if is_module(sub) else base)
    return found


def is_module(name: str) -> bool:
    path = ROOT.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def is_config(module: str) -> bool:
    return module == "stackwise.config" or module.startswith("stackwise.config.")


def trainer_subclasses(tree: ast.AST, module: str) -> list[str]:
    """Classes that inherit from the Trainer: a new way to train is a strategy or a part."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            bases = {getattr(b, "id", None) or getattr(b, "attr", None) for b in node.bases}
            if bases & TRAINERS:
                found.append(f"{module}.{node.name} inherits from the Trainer")
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    out, state, stack = [], {}, []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                out.append([*stack[stack.index(nxt) :], nxt])
            elif nxt in graph and not state.get(nxt):
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if not state.get(node):
            visit(node)
    return out


def find_problems() -> list[str]:
    problems: list[str] = []
    graph: dict[str, set[str]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        module = module_name(path)
        text = path.read_text()
        tree = ast.parse(text)
        deps = imports(tree, module, path.name == "__init__.py")
        graph[module] = {d for d in deps if d != module and not module.startswith(d + ".")}
        lines = len(text.splitlines())
        if lines > MAX_MODULE:
            problems.append(f"{module}: {lines} lines (limit {MAX_MODULE})")
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION:
                    problems.append(f"{module}.{node.name}: {length} lines (limit {MAX_FUNCTION})")
        mine = layer(module)
        if mine is None and module != "stackwise":
            problems.append(f"{module}: no layer (add its first dotted part to LAYERS)")
        for dep in sorted(graph[module]):
            theirs = layer(dep)
            if mine is not None and theirs is not None and theirs > mine:
                problems.append(f"{module} imports {dep}, a layer above it")
            if is_config(dep) and not is_config(module) and mine is not None and mine < DOOR:
                problems.append(f"{module} imports {dep}: below the door, take a spec instead")
        problems += trainer_subclasses(tree, module)
    for cycle in cycles(graph):
        problems.append("import cycle: " + " -> ".join(cycle))
    return problems


def main() -> int:
    problems = find_problems()
    for p in problems:
        print(p)
    print(f"{len(problems)} structure problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
