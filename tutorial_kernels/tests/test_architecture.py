"""The package's shape: layers without cycles, no private names across modules, modules of one size.

Layers, bottom to top (README, "Layout"); a module imports only from its own layer or below:

    leaves        runtime, paths, reference, validation, inputs, tolerances, provenance, recorder, tiling
    perf          perf.*: remembered launches, autotuning choices, descriptor scratch
    chapters      ch01 … ch06 and ch05_hopper: kernels and their launchers (a chapter builds on earlier ones)
    uses          instruments.* (timelines, byte models, sweeps) and integrations.* (Hugging Face, GPT, prefill)
    bench         bench.*: the benchmark harness
    figures       figures.*: every figure the site and notebooks draw
    top           the package's __init__ (its public API) and testing (the test harness)
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent
LAYERS = ["leaves", "perf", "chapters", "uses", "bench", "figures", "top"]
LEAVES = {"runtime", "paths", "reference", "validation", "inputs", "tolerances", "provenance", "recorder", "tiling"}
MAX_LINES = 700  # a chapter module may be longer when its kernel is


def _modules() -> dict[str, Path]:
    """Dotted name (without the package prefix) → file, for every module of the package but its tests."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] == "tests" or rel.name == "conftest.py":
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def layer(module: str) -> str:
    top = module.split(".")[0]
    if module in ("", "testing"):
        return "top"
    if module in LEAVES:
        return "leaves"
    if top in ("perf", "bench", "figures"):
        return top
    if top in ("instruments", "integrations"):
        return "uses"
    if top.startswith("ch0"):
        return "chapters"
    raise AssertionError(f"tutorial_kernels.{module} belongs to no layer: add it to test_architecture.py")


def _resolve(name: str) -> str | None:
    """A dotted import target inside the package → the module it names (or None if outside)."""
    if name != "tutorial_kernels" and not name.startswith("tutorial_kernels."):
        return None
    return name.removeprefix("tutorial_kernels").removeprefix(".")


def imports(module: str) -> list[tuple[str, str | None, int]]:
    """(imported module, imported name or None, line) for every import of the package's own modules,
    at any depth of the file (imports inside functions count: they are cycles all the same)."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(target, None, node.lineno) for a in node.names if (target := _resolve(a.name)) is not None]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if (target := _resolve(node.module)) is None:
                continue
            for a in node.names:
                submodule = f"{target}.{a.name}".strip(".")
                if submodule in MODULES:  # `from tutorial_kernels import ch05_flash_v2`
                    found.append((submodule, None, node.lineno))
                else:
                    found.append((target, a.name, node.lineno))
    return found


def test_every_module_has_a_layer():
    for module in MODULES:
        layer(module)


@pytest.mark.parametrize("module", sorted(MODULES), ids=lambda m: m or "__init__")
def test_imports_go_down_the_layers_and_name_nothing_private(module):
    mine = LAYERS.index(layer(module))
    for target, name, line in imports(module):
        where = f"tutorial_kernels.{module or '__init__'}:{line}"
        assert LAYERS.index(layer(target)) <= mine, (
            f"{where} imports tutorial_kernels.{target} ({layer(target)}) from the lower layer {layer(module)}")
        if target.startswith("ch0") and module.startswith("ch0"):
            assert target[:4] <= module[:4], f"{where}: chapter {module} imports the later chapter {target}"
        owner = target.split(".")[0] if target else ""
        if name is not None and name.startswith("_") and not module.startswith(owner or "\0"):
            pytest.fail(f"{where} imports the private name {name} of tutorial_kernels.{target}")


def test_no_private_attribute_of_another_module_is_used():
    """`import tutorial_kernels.x as m` then `m._name`: a private name used from outside all the same."""
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        aliases = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and _resolve(node.module) is not None:
                for a in node.names:
                    if f"{_resolve(node.module)}.{a.name}".strip(".") in MODULES:
                        aliases[a.asname or a.name] = f"{_resolve(node.module)}.{a.name}".strip(".")
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if _resolve(a.name) is not None and a.asname:
                        aliases[a.asname] = _resolve(a.name)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                    and node.attr.startswith("_") and not node.attr.startswith("__")):
                pytest.fail(f"tutorial_kernels.{module}:{node.lineno} uses {node.value.id}.{node.attr}, a private "
                            f"name of tutorial_kernels.{aliases[node.value.id]}")


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A path a → … → a in `graph` (module → the modules it imports), or None when there is none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if state.get(target) is None and (cycle := visit(target)):
                return cycle
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)):
            return cycle
    return None


def test_no_import_cycle():
    # a submodule importing its own package counts: the package's __init__ imports its submodules
    graph = {module: {target for target, _, _ in imports(module) if target != module} for module in MODULES}
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " → ".join(f"tutorial_kernels.{m}".rstrip(".") for m in cycle)


def test_the_cycle_finder_finds_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


@pytest.mark.parametrize("module", sorted(MODULES), ids=lambda m: m or "__init__")
def test_modules_stay_small(module):
    lines = len(MODULES[module].read_text(encoding="utf-8").splitlines())
    if layer(module) == "chapters":
        return  # a chapter is as long as its kernel and its launcher
    assert lines <= MAX_LINES, f"tutorial_kernels.{module} has {lines} lines (> {MAX_LINES}): split it by concept"


def test_chapters_declare_their_public_api():
    for module, path in MODULES.items():
        if layer(module) == "chapters":
            assert "__all__" in path.read_text(encoding="utf-8"), f"tutorial_kernels.{module} defines no __all__"
